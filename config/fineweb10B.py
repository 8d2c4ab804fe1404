# GPT-2 small (12 layers, 12 heads, d=768, ~124M parameters) on FineWeb 10B in GPT-2 tokens, one GPU.
#   python data/fineweb10B/prepare.py --shards=103   # ready-tokenised shards, no tokenising: 10.3B train tokens
#   python train.py config/fineweb10B.py             # --ffn=swiglu / polynorm / moa ... to compare FFNs
# Token budget: 16 x 1024 x 32 accumulation steps = 524,288 tokens per iteration; 19,073 iterations = 10.0B tokens,
#   the budget of llm.c's GPT-2 (124M) run, whose final validation loss (3.28) is modded-nanogpt's 124M reference
#   target on this data. The model here differs (RoPE, RMSNorm, no biases, nanoGPT's AdamW settings), so 3.28 is a
#   reference point, not a promise. A shorter run: --max_iters=5000 --lr_decay_iters=5000 (2.6B tokens, --shards=27).
#   Fewer shards than the budget needs are not an error: windows are drawn at random, so tokens then repeat.
# Time (an ESTIMATE from FLOPs, never measured here): 6 * 124e6 * 10e9 = 7.4e18 FLOPs, plus ~15% for attention,
#   / (0.4 * 989e12 FLOP/s) ~ 21,700 s: about 6 hours on one H100/H200 in bf16 with compile.

exec(open('config/owt.py').read())  # GPT-2 small and its AdamW recipe (run from the repo root, as every config)

out_dir = 'out-fineweb10B'
dataset = 'fineweb10B'
eval_iters = 200  # 200 x 16 x 1024 = 3.3M validation tokens of fineweb_val_000000.bin, the same for every run
max_iters = 19073  # 19,073 x 524,288 tokens per iteration = 10.0B tokens
lr_decay_iters = 19073
warmup_iters = 700
