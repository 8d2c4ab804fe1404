# A scaling ladder on a 2-core CPU: gelu, swiglu, polynorm and moa x 2 seeds x 3 sizes on the bundled Shakespeare
# characters (12k, 98k and 332k non-embedding parameters), 7 minutes on an idle 2-core AMD EPYC (6 min 58 s
# measured, README; 3 min 58 s on an Intel Xeon), 16 under a load of 8-15.
#   python compare.py config/compare_ladder_shakespeare_char.py
#   -> out-ladder-shakespeare-char/ladder.png, summary.md, summary.json (the ladder), and per size
#      out-ladder-shakespeare-char/<n_layer>x<n_embd>/ the ordinary comparison (its table, loss.png, matched verdicts)
# Every size trains on the same batches per seed for every variant, with the same 250 x 16 x 64 = 256k characters
# (fixed iterations: the token budget does not grow with the model, so the larger sizes are further from converged;
# pass --tokens_per_param=K to scale it) and the same learning rate (--lr_rule=width scales it as 1/width).
#
# Why this size. 24 runs, two at a time with one thread each (see config/compare_shakespeare_char.py for why).
# Measured per iteration with one thread on this shared machine while its load average was ~8 (upper bounds):
#   1x32: gelu 23 ms, moa 33 ms;  2x64: gelu 55 ms, moa 100 ms;  3x96 (3 heads of 32): gelu 100 ms, moa 190 ms.
# With swiglu ~ gelu and polynorm between gelu and moa, that is ~0.23 CPU-s per iteration for the 4 variants of all 3
# sizes: 2 seeds x 250 iterations x 0.23 s / 2 jobs = ~2 minutes of steps, plus ~10 s per run of start-up, 6
# evaluations and checkpoints (24 x 10 s / 2 = 2 minutes): ~4-5 minutes when idle, ~7-9 with others on the cores.
# Measured: `time python compare.py config/compare_ladder_shakespeare_char.py` took 6 min 58 s wall (11 min 36 s user
#   + 47 s system CPU) on an idle 2-core AMD EPYC VM (results/ladder_shakespeare_char/); on an Intel Xeon VM 3 min 58 s
#   when idle, 16 min 6 s while other jobs kept the load average at 8-15.
# 2 seeds are the fewest that give a paired t interval and a seed-level CI on the trend; 3 sizes give a trend but
# not a power-law fit (3 parameters need at least 4 sizes: the summary says "not identifiable").

# Standalone on purpose (no exec of compare_shakespeare_char.py): a run is identified by its settings, so an edit to
# the default comparison must not change, and so retrain, every run of this ladder.

out_dir = 'out-ladder-shakespeare-char'
variants = 'gelu,swiglu,polynorm,moa'
baseline = 'gelu'
seeds = 2
sizes = '1x32,2x64,3x96'  # n_layer x n_embd; n_head chosen for a head size of 32 (1, 2, 3 heads)
tokens_per_param = 0.0  # fixed iterations at every size
lr_rule = 'fixed'
jobs = 2
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
max_iters = 250
lr_decay_iters = 250
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 20
beta2 = 0.99
weight_decay = 0.1
grad_clip = 1.0

eval_interval = 50  # 5 points per curve after the untrained one
eval_iters = 16
log_interval = 10
always_save_checkpoint = True  # a cut-off ladder resumes from its last evaluation
