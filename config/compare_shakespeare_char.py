# The default comparison: 8 FFN variants x 3 seeds on the bundled Shakespeare characters, on a 2-core CPU.
#   python data/shakespeare_char/prepare.py            # once, ~1 s
#   python compare.py config/compare_shakespeare_char.py
#   -> out-compare-shakespeare-char/loss.png, summary.md, summary.json (and the table on stdout)
# Every variant trains on the same batches per seed (the loader's seeded order), is scored on the same 256 validation
# windows (16 batches of 16 windows of 64 characters: 16k characters), with the same 300 x 16 x 64 = 307k training
# tokens (~7% of an epoch) and schedule.
#
# Why this size. The budget is 10 minutes for 24 runs on 2 cores, fp32, and every run pays a fixed few seconds
# (Python, importing torch, 7 evaluations, checkpoints). So:
#   - jobs=2, threads=1: two runs side by side, one core each. A tiny model gains nothing from a second thread and
#     threads fighting for cores are disastrous (measured on this machine while busy: 4 layers, d=128, 310 ms/iter
#     with one thread, 3 s with two). The table's tok/s and times are measured with 2 runs sharing the machine
#     (pass --jobs=1 --threads=0 when speed is what you compare).
#   - 2 layers, d=64, 4 heads, block 64, batch 16: ~107k parameters, 65.5k of them FFN (61%). An iteration costs
#     36-53 ms compiled (gelu 40, swiglu 39, moa_glu 53) and 49-131 ms eager (gelu 52, polynorm 80, la 97, moa 97,
#     moa_glu 131: the eager recomputing backwards of the learned activations), two runs at a time on a 2-core AMD
#     EPYC (pair 7 in BENCHMARKS.md, "When compiling pays on a CPU").
#   - 3 seeds: the fewest that estimate seed noise. Seeds share their batches across variants, so summary.md reports
#     the paired per-seed differences to gelu with their std and a paired t-test ("resolved?").
#   - 300 iterations at lr 2e-3 (a tiny model tolerates it; unnormalised polyrelu is the variant that may blow up,
#     and a stop is reported in the summary, not hidden).
# Calibration, measured when the size was chosen (eager, on a shared 2-core machine while other jobs were running, so
# upper bounds):
#   - 8 variants x 1 seed x 50 iterations, jobs=2, load average ~1 from others: 48 s in all; 2.0-6.3 s of optimizer
#     steps per run (68 ms per iteration on average over the 8 variants, two runs at a time), ~7 s per run of start-up,
#     evaluation and checkpoints. Extrapolated to 3 seeds x 300 iterations with 7 evaluations per run:
#     3 x (8 x 300 x 68 ms + 8 x 9 s) / 2 jobs = ~6 minutes. The same calibration with the load average at 3 took 97 s
#     (twice as long): with half the machine taken by others the full run takes ~12-14 minutes.
#   - gelu, polynorm, moa x 3 seeds x 300 iterations (these settings; load average 2.5): 306 s, 311 CPU-seconds.
#     These 3 variants cost the 8 variants' average per iteration, so 24 runs are ~830 CPU-seconds.
#   - Seed noise, in the shipped results (results/compare_shakespeare_char/summary.md): std over seeds of the final
#     val loss 0.013, std of the paired differences 0.013 (both pooled over variants); polynorm - gelu = -0.090 ±
#     0.003 (resolved, t=-59), moa - gelu = -0.010 ± 0.010 (not resolved, t=-1.9). So at this budget 3 seeds tell
#     differences of ~0.02 and more from noise, not smaller ones.

out_dir = 'out-compare-shakespeare-char'
variants = 'gelu,relu2,swiglu,polyrelu,polynorm,la,moa,moa_glu'
baseline = 'gelu'
seeds = 3
jobs = 2
threads = 1

dataset = 'shakespeare_char'
device = 'cpu'
# compile: not set, so train.py's rule decides for all runs alike: each variant trains 3 seeds x 300 = 900 steps,
# at least the 800 from which train.py compiles on a CPU (it explains why), so the runs compile (each variant's first
# seed compiles, the other seeds load its graphs from the on-disk cache; evaluation runs eager, see train.py).
# Measured back to back on two 2-core machines, the 24 runs took 0.96-1.03x the eager time compiled on a fresh machine
# on an AMD EPYC, 0.98x pooled over seven pairs (0.90-1.03x in three earlier pairs, which also compiled evaluation;
# 0.96-0.99x in two pairs on an Intel Xeon: break-even within the noise of one pair) and 0.71-0.84x with the graphs
# already cached (a machine compiles them once; the Xeon's speed drifted by a third between runs, so only back-to-back
# runs compare).
# Compiled, the learned activations' tok/s are 0.72-1.13x gelu's instead of 0.31-0.79x: the time panel shows what a
# step costs, not what eager PyTorch makes of it. Final losses agree with eager within 6e-4. --compile=False runs
# eager.
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
