# The default comparison (`python compare.py` runs this file): 8 FFN variants x 5 learning rates x 3 seeds on the
# bundled Shakespeare characters, each variant at its own best rate. Every run trains on the same batches per seed and
# is scored on the same validation windows (8 of the 16 batches choose the rate, the other 8 report). The model and its
# budget: README.md; run time and seed noise: BENCHMARKS.md.

out_dir = 'out-compare-shakespeare-char'
variants = 'gelu,relu2,swiglu,polyrelu,polynorm,la,moa,moa_glu'
baseline = 'gelu'
seeds = 3
lrs = '1e-3,2e-3,4e-3,8e-3,1.6e-2'  # factors of 2 around the shared rate 2e-3 (its answer is shown too)
lr_extend = True  # a best rate at an edge tries the next one beyond it
jobs = 0  # one run per core: threads / cores
threads = 1

dataset = 'shakespeare_char'
device = 'cpu'
dtype = 'float32'

n_layer = 2
n_head = 4
n_embd = 64
block_size = 64
dropout = 0.0
ffn = 'gelu'  # replaced per run by each of the variants

batch_size = 16
gradient_accumulation_steps = 1
max_iters = 300
lr_decay_iters = 300
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 20
beta2 = 0.99
weight_decay = 0.1
grad_clip = 1.0

eval_interval = 50  # 6 points per curve after the untrained one
eval_iters = 16
log_interval = 10
always_save_checkpoint = True  # a cut-off comparison resumes from its last evaluation
