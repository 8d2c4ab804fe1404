# A scaling ladder on OpenWebText, one GPU: gelu, swiglu, polynorm and moa at 4 sizes from ~16M to ~124M parameters
# (3.1M to 85M non-embedding), each trained on 20 tokens per non-embedding parameter (Chinchilla-style).
#   python data/openwebtext/prepare.py --subsets=0-2             # ~1.3B tokens: no run repeats data except the last
#   python compare.py config/compare_ladder_owt.py               # -> out-ladder-owt/ladder.png, summary.md, summary.json
#   python compare.py config/compare_ladder_owt.py --sizes=4x256x4,6x384x6,8x512x8   # the three smaller sizes first
# Extending: add a size at the end of --sizes (the first stays the learning-rate reference); the sizes already
# trained are reused, and a cut-off run resumes.
#
# Sizes (n_layer x n_embd x n_head, head size 64 as GPT-2): 4x256x4, 6x384x6, 8x512x8, 12x768x12 (GPT-2 small).
#   N non-embedding (gelu): 3.1M, 10.6M, 25.2M, 85.0M; with the 50,304 x d tied embedding 16M, 30M, 51M, 124M.
#   4 sizes: the power law L(N) = E + A·N^(−α) is identifiable (3 parameters, 4 sizes).
# Tokens: 20 x N, at 16 x 1024 x 8 = 131,072 tokens per iteration: ~480, ~1,620, ~3,850 and ~12,970 iterations
#   (63M, 212M, 504M, 1.70B tokens); warmup (5%), decay and evaluations (10 per run) scale with the iterations.
# Learning rate: 1/width (lr_rule=width) from 1.8e-3 at d=256, so 6e-4 at d=768, GPT-2 small's rate.
# Time: an ESTIMATE from FLOPs, not a measurement (no GPU run of this config yet). Per run 6·N'·tokens plus ~15% for
#   attention (N' includes the embedding, which is the output head's matmul): 12x768 is 1.5e18 FLOPs, ~70 minutes at
#   35% MFU of an H100/H200 in bf16; 8x512 ~10 minutes, 6x384 ~4, 4x256 ~2 (small models run at lower MFU, and each
#   run pays ~1 minute of compilation). For 4 variants x 1 seed: ~6 hours, ~4.7 of them the 12x768 size (run the
#   three smaller sizes first, ~1 hour, with the --sizes above). --seeds=2 doubles it and adds a t interval per size;
#   with 1 seed the gap's trend still has a CI (from the spread of the 4 sizes' gaps around the fitted line).

exec(open('config/owt.py').read())  # GPT-2 small's recipe (run from the repo root, as every config)

out_dir = 'out-ladder-owt'
variants = 'gelu,swiglu,polynorm,moa'
baseline = 'gelu'
seeds = 1
sizes = '4x256x4,6x384x6,8x512x8,12x768x12'
tokens_per_param = 20.0
lr_rule = 'width'
jobs = 1  # one GPU: one run at a time

device = 'cuda'
compile = True
dtype = 'bfloat16'

batch_size = 16
block_size = 1024
gradient_accumulation_steps = 8
max_iters = 1000  # the reference schedule that tokens_per_param rescales per size
lr_decay_iters = 1000
warmup_iters = 50
eval_interval = 100
eval_iters = 50  # 50 x 16 x 1024 = 819k fixed validation tokens
learning_rate = 1.8e-3  # at the first (narrowest) size
min_lr = 1.8e-4
