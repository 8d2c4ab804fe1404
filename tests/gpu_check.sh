#!/usr/bin/env bash
# The GPU check, on a machine with a CUDA GPU (3-4 minutes on one H200, 8 at most): the GPU tests (python -m pytest -m
# cuda: every variant compiled in bf16 against eager fp32, the MoE's grouped matmul, fused AdamW, a compiled bf16
# comparison of a dense and an MoE variant sharing the GPU), then bench.py at GPT-2 small's shape (124M parameters),
# compiled regionally and whole: step time, peak memory, MFU. Everything goes into one report.
#   bash tests/gpu_check.sh [REPORT]        # REPORT: gpu_check.md by default
set -uo pipefail  # not -e: every part runs and reports, whatever an earlier one did
cd "$(dirname "$0")/.."
report=$(realpath -m "${1:-gpu_check.md}")
start=$SECONDS
# pytest-xdist, where installed, compiles the tests' models in parallel
parallel=$(python -c "import xdist" 2>/dev/null && echo "-n 6")
{
  echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  python -c "import torch, platform; print(f'{torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA' \
                                        f' {torch.version.cuda}), Python {platform.python_version()}')"
  echo
  echo "## python -m pytest -q -m cuda $parallel"
  echo '```'
} > "$report"
timeout 300 python -m pytest -q -m cuda $parallel -rfEs -p no:cacheprovider >> "$report" 2>&1
echo "exit status $? after $((SECONDS - start)) s" >> "$report"
echo '```' >> "$report"
shape="--device=cuda --dtype=bfloat16 --n_layer=12 --n_head=12 --n_embd=768 --block_size=1024 --vocab_size=50257
       --batch_size=16 --compile=True --warmup=2 --repeats=10 --json="
for run in "regional gelu,polynorm" "whole gelu"; do
  set -- $run
  {
    echo
    echo "## python bench.py --compile_mode=$1 --variants=$2 (GPT-2 small's shape)"
    echo
    timeout 150 python bench.py $shape --compile_mode="$1" --variants="$2" 2>&1 | grep -v ' ready in '
    echo
    echo "exit status ${PIPESTATUS[0]} after $((SECONDS - start)) s"
  } >> "$report"
done
echo "wrote $report ($((SECONDS - start)) s)" >&2
