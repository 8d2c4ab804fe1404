#!/usr/bin/env bash
# The GPU check, on a machine with a CUDA GPU (about 9 minutes: each timed part is cut to what is left), written into
# one report:
#   1. the GPU tests (python -m pytest -m cuda): every variant compiled in bf16 against eager fp32, the MoE's grouped
#      matmul, fused AdamW, a float16 run with the loss scaler, a resume on CUDA, sample.py on CUDA, a compiled bf16
#      comparison of a dense and an MoE variant sharing the GPU;
#   2. train.py's own logged MFU at config/owt.py's shape (124M; batch, accumulation and AdamW as configured) and at
#      config/owt_quick.py's (~30M), on random GPT-2 tokens, median over the log lines after the first two;
#   3. FlashAttention-2 against cuDNN attention first, bench.py at GPT-2 small's shape (median step, MFU; bf16, or
#      float32 on a GPU without native bf16);
#   4. the aggregate tokens/s of the default comparison's model (config/compare_shakespeare_char.py's shape, dtype
#      auto, compiled) at 1, 2, 4 and 8 processes on this one GPU, each with its share of the CPU cores.
# Each part's timeout is cut to what is left of the 9 minutes, so a slow part shortens the later ones.
#   bash tests/gpu_check.sh [REPORT]        # REPORT: gpu_check.md by default
set -uo pipefail  # not -e: every part runs and reports, whatever an earlier one did
cd "$(dirname "$0")/.."
report=$(realpath -m "${1:-gpu_check.md}")
work=$(mktemp -d)
start=$SECONDS
cores=$(nproc)
# pytest-xdist, where installed, compiles the tests' models in parallel
parallel=$(python -c "import xdist" 2>/dev/null && echo "-n 6")
section() { printf '\n## %s\n\n' "$1" >> "$report"; }
within() { local left=$((540 - (SECONDS - start))); echo $(( $1 < left ? $1 : (left > 5 ? left : 5) )); }  # 9 min
ended() { echo "exit status $1 after $((SECONDS - start)) s" >> "$report"; }
{
  echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  python -c "import torch, platform; print(f'{torch.cuda.get_device_name()} (capability' \
    f' {torch.cuda.get_device_capability()}), torch {torch.__version__} ({torch.version.git_version[:12]}), CUDA' \
    f' {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, Python {platform.python_version()}, $cores cores')"
} > "$report"

section "python -m pytest -q -m cuda $parallel"
echo '```' >> "$report"
timeout "$(within 200)" python -m pytest -q -m cuda $parallel -rfEs -p no:cacheprovider >> "$report" 2>&1
ended $?
echo '```' >> "$report"

# random GPT-2 tokens: MFU depends on the shapes, not on what the tokens say
python - "$work/data/random" <<'EOF'
import json, os, sys
import numpy as np
from data.write import write_shard
os.makedirs(sys.argv[1])
tokens = np.random.default_rng(0).integers(0, 50257, 40_000_000)
write_shard(os.path.join(sys.argv[1], 'train_000.bin'), tokens)
write_shard(os.path.join(sys.argv[1], 'val_000.bin'), tokens[:2_000_000])
json.dump({'tokenizer': 'gpt2', 'vocab_size': 50257}, open(os.path.join(sys.argv[1], 'meta.json'), 'w'))
EOF
mfu() {  # the median MFU (where the GPU's peak is known) and ms per iteration of a log's lines after the first two
  python -c "import json, statistics as s, sys; r = [x for x in map(json.loads, open(sys.argv[1])) if 'ms' in x][2:]
m = [x['mfu'] for x in r if x.get('mfu') is not None]
print(f'{len(r)} log lines: median MFU ' + (f'{s.median(m):.1%}' if m else 'none (no peak FLOP/s for this GPU)') +
      f', {s.median(x[\"ms\"] for x in r):,.0f} ms per iteration, {s.median(x[\"tok_s\"] for x in r):,.0f} tok/s')" \
    "$1" 2>&1
}
for run in "config/owt.py 50 124M" "config/owt_quick.py 120 30M"; do
  set -- $run
  section "train.py $1 (~$3), $2 iterations on random tokens: its logged MFU"
  timeout "$(within 150)" python train.py "$1" --data_dir="$work/data" --dataset=random --out_dir="$work/$3" --max_iters="$2" \
    --warmup_iters=10 --eval_interval=100000 --eval_iters=1 --log_interval=5 > "$work/$3.out" 2>&1
  status=$?
  mfu "$work/$3/log.jsonl" >> "$report"; echo >> "$report"; grep '^device' "$work/$3.out" >> "$report"; echo >> "$report"
  ended $status
done

# bench measures what dtype=auto gives the GPU, but float32 where that is float16 (below compute capability 8.0)
dtype=$(python -c "from machinery.device import use; d = use('cuda', 'auto')[1]
print('float32' if d == 'float16' else d)")
shape="--device=cuda --dtype=$dtype --n_layer=12 --n_head=12 --n_embd=768 --block_size=1024 --vocab_size=50257
       --batch_size=16 --compile=True --warmup=2 --repeats=10 --json= --variants=gelu"
for order in "FLASH_ATTENTION CUDNN_ATTENTION" "CUDNN_ATTENTION FLASH_ATTENTION"; do
  set -- $order
  section "bench.py at GPT-2 small's shape, attention by $1 first (sdpa_kernel, set_priority=True)"
  timeout "$(within 70)" python -c "import sys, bench
from torch.nn.attention import sdpa_kernel, SDPBackend
from machinery.cli import run_cli
with sdpa_kernel([SDPBackend.$1, SDPBackend.$2, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH], set_priority=True):
    run_cli(bench.main, sys.argv[1:])" $shape 2>&1 | grep -v ' ready in ' >> "$report"
  ended "${PIPESTATUS[0]}"
done

section "N processes of the default comparison's model on this one GPU: aggregate tokens/s"
echo "| processes | CPU threads each | tok/s each (median) | aggregate tok/s | × one process |" >> "$report"
echo "|---:|---:|---|---:|---:|" >> "$report"
one=
for n in 1 2 4 8; do
  threads=$(( cores / n > 0 ? cores / n : 1 ))
  for i in $(seq 1 "$n"); do
    OMP_NUM_THREADS=$threads TORCHINDUCTOR_COMPILE_THREADS=$threads timeout "$(within 60)" python train.py \
      --dataset=shakespeare_char --n_layer=2 --n_head=4 --n_embd=64 --block_size=64 --batch_size=16 \
      --learning_rate=2e-3 --device=cuda --dtype=auto --compile=True --data_dir="$work/data" \
      --out_dir="$work/share$n-$i" --seed=$((1337 + i)) --max_iters=1500 --eval_interval=1500 --eval_iters=2 \
      --log_interval=100 > "$work/share$n-$i.out" 2>&1 &
    [ "$n" = 1 ] && wait  # the first run prepares shakespeare_char and fills the compile cache
  done
  wait
  python -c "import json, statistics as s, sys
each = [s.median(r['tok_s'] for r in map(json.loads, open(f'$work/share$n-{i}/log.jsonl')) if 'tok_s' in r)
        for i in range(1, $n + 1)]
total, one = sum(each), float(sys.argv[1] or sum(each))
print(f'| $n | $threads | {\", \".join(f\"{t:,.0f}\" for t in each)} | {total:,.0f} | {total / one:.2f} |')" "$one" \
    >> "$report" 2>&1
  [ "$n" = 1 ] && one=$(python -c "import json, statistics as s
print(s.median(r['tok_s'] for r in map(json.loads, open('$work/share1-1/log.jsonl')) if 'tok_s' in r))" 2>/dev/null)
done
ended 0
rm -rf "$work"
echo "wrote $report ($((SECONDS - start)) s)" >&2
