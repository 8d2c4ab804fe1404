# A scaling ladder on a 2-core CPU: gelu, swiglu, polynorm and moa x 2 seeds at 4 sizes of the bundled Shakespeare
# characters, each trained on 10 tokens per non-embedding parameter, every variant at its own best learning rate per
# size; 4 sizes fit the power law and the effective compute multiplier. Sizes, run time and results: BENCHMARKS.md.
#   python compare.py config/compare_ladder_shakespeare_char.py
# Standalone on purpose (no exec of compare_shakespeare_char.py): a run is identified by its settings, so an edit to
# the default comparison must not change, and so retrain, every run of this ladder.

out_dir = 'out-ladder-shakespeare-char'
variants = 'gelu,swiglu,polynorm,moa'
baseline = 'gelu'
seeds = 2
sizes = '1x16,1x32,2x32,2x64'  # n_layer x n_embd; n_head for a head size nearest 32 (1, 1, 1, 2 heads)
tokens_per_param = 10.0  # iterations = 10 x N / 1,024 tokens per iteration: 31, 121, 242 and 964
lr_rule = 'fixed'
lr_grid = 1  # the rates learning_rate x 1/2, 1, 2 at every size
lr_extend = True  # a best rate at an edge tries the next one beyond it
jobs = 0  # one run per core: cores / threads
threads = 1

dataset = 'shakespeare_char'
device = 'cpu'
compile = False
dtype = 'float32'

block_size = 64
dropout = 0.0
ffn = 'gelu'  # replaced per run by each of the variants

batch_size = 16
gradient_accumulation_steps = 1
max_iters = 250  # the reference schedule that tokens_per_param rescales per size
lr_decay_iters = 250
learning_rate = 8e-3
min_lr = 8e-4
warmup_iters = 20
beta2 = 0.99
weight_decay = 0.1
grad_clip = 1.0

eval_interval = 50  # 5 points per curve after the untrained one at 250 iterations; each size, rescaled, 5 or 6
eval_iters = 16
log_interval = 10
always_save_checkpoint = True  # a cut-off ladder resumes from its last evaluation
