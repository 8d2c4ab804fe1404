# The default comparison (`python compare.py` runs this file): 8 FFN variants on the bundled Shakespeare characters,
# each at its own learning rate, tuned by config/sweep_shakespeare_char.py, on 3 seeds its choice never saw: 24 runs.
# Every run trains on the same batches per seed and is scored on the same validation windows (the 8 of 16 batches a
# sweep never chooses on). The model and its budget: README.md; run time and seed noise: BENCHMARKS.md.

out_dir = 'out-compare-shakespeare-char'
variants = 'gelu,relu2,swiglu,polyrelu,polynorm,la,moa,moa_glu'
baseline = 'gelu'
seeds = 3
seed = 1340  # the seeds after the sweep's own (1337-1339), which chose the rates
# each variant's rate, as the sweep's summary prints it, and the settings it was tuned at: after a change of the
# model, the budget, the batch, the dataset or eval_iters, a variant runs at learning_rate, untuned, until the sweep
# runs again
tuned_lrs = 'gelu@8e-3,relu2@4e-3,swiglu@2e-3,polyrelu@8e-3,polynorm@8e-3,la@8e-3,moa@8e-3,moa_glu@4e-3'
tuned_at = '11f787adb856'
tuned_by = 'config/sweep_shakespeare_char.py'
jobs = 0  # one run per core: cores / threads
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
