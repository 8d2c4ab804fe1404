# GPT-2 small (~124M parameters) on FineWeb 10B, one GPU; llm.c's 3.28 validation loss is a reference, not a promise.
#   python data/fineweb10B/prepare.py --shards=103 && python train.py config/fineweb10B.py   # --ffn=... to compare
# Tokens: 10.0B, llm.c's GPT-2 (124M) budget. Time: about 6.5 hours on one H200, an ESTIMATE from bench.py's 429k
# tokens/s at this shape (BENCHMARKS.md, GPU), evaluation left out.

import os

exec(open(os.path.join(os.path.dirname(__file__), 'owt.py')).read())  # GPT-2 small and its AdamW recipe
out_dir = 'out-fineweb10B'
dataset = 'fineweb10B'
eval_iters = 200  # 200 x 16 x 1024 = 3.3M validation tokens of fineweb_val_000000.bin, the same for every run
max_iters = 19073  # x 524,288 tokens per iteration = 10.0B; --max_iters=5000 --lr_decay_iters=5000 for 2.6B
lr_decay_iters = 19073
warmup_iters = 700
