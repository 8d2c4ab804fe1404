# A small character-level GPT on the bundled Shakespeare corpus, sized for a laptop CPU.
#   python data/shakespeare_char/prepare.py      # once, ~1 s
#   python train.py config/shakespeare_char.py   # then: python sample.py --out_dir=out-shakespeare-char
#   python train.py config/shakespeare_char.py --ffn=polynorm --out_dir=out-sc-polynorm   # compare an FFN
# Tokens: 2000 iterations x 12 x 64 = 1.5M tokens (~0.34 epoch of the 4.5M training characters).
# Time: estimated from FLOPs, 6 * N * tokens with N ~ 0.8M parameters, is ~7e12 FLOPs: a few minutes on a
# laptop CPU. Measured with OMP_NUM_THREADS=1 on idle 2-core machines (BENCHMARKS.md, "When compiling pays on a
# CPU"): an AMD EPYC took 409 s eager, 404 s compiled on an empty compile cache (22 s of it compiling), and with
# --ffn=moa 691 s eager, 463 s compiled; an Intel Xeon 141 s and 130 s, 325 s and 166 s. 2000 steps is over the
# 800 from which train.py compiles a CPU run by default (--compile=False runs eager); the losses agree to 4 decimals.
# Best validation loss measured: 1.790 with gelu, 1.728 with moa (seed 1337; nanoGPT reports ~1.88 for this recipe).

out_dir = 'out-shakespeare-char'
dataset = 'shakespeare_char'
device = 'cpu'  # small models run well on a CPU; pass --device=auto to use a GPU
dtype = 'float32'

eval_interval = 250
eval_iters = 20
log_interval = 10
always_save_checkpoint = False  # keep the best checkpoint: this small model overfits late

n_layer = 4
n_head = 4
n_embd = 128
block_size = 64
dropout = 0.0
ffn = 'gelu'

batch_size = 12
gradient_accumulation_steps = 1
max_iters = 2000
lr_decay_iters = 2000  # usually max_iters
learning_rate = 1e-3  # a small model tolerates a higher rate
min_lr = 1e-4  # learning_rate / 10, per Chinchilla
warmup_iters = 100
beta2 = 0.99  # a little larger, as the number of tokens per iteration is small
weight_decay = 1e-1
