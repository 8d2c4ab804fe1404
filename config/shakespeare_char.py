# A small character-level GPT on the bundled Shakespeare corpus, sized for a laptop CPU (~0.8M parameters).
#   python train.py config/shakespeare_char.py   # --ffn=... to compare; the corpus is prepared on first use
#   python sample.py --out_dir=out-shakespeare-char
# Tokens: 2000 x 12 x 64 = 1.5M (~0.34 epoch). Run time: BENCHMARKS.md, "The first ten minutes".

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
