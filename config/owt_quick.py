# A quick OpenWebText run for comparing FFNs: 6 layers, 6 heads, d=384 (~30M parameters, 19M of them the
# embedding), block 512, on one GPU.
#   python data/openwebtext/prepare.py                   # the default 2 subsets (~0.9B tokens) are plenty
#   python train.py config/owt_quick.py --ffn=polynorm --out_dir=out-owt-quick-polynorm
# Tokens: 32 x 512 x 4 accumulation steps = 65,536 tokens per iteration; 3000 iterations = 197M tokens.
# Time (an ESTIMATE from FLOPs, not a measurement): 6 * 30e6 * 1.97e8 = 3.5e16 FLOPs, / (0.4 * 989e12 FLOP/s)
#   ~ 90 s on one H100/H200; a model this small runs well below 40% MFU, so expect ~5 minutes with compilation
#   and evaluation.

out_dir = 'out-owt-quick'
dataset = 'openwebtext'

eval_interval = 250
eval_iters = 50
log_interval = 10
always_save_checkpoint = True

n_layer = 6
n_head = 6
n_embd = 384
block_size = 512
dropout = 0.0
ffn = 'gelu'

batch_size = 32
gradient_accumulation_steps = 4
max_iters = 3000
lr_decay_iters = 3000
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 100
weight_decay = 1e-1
beta2 = 0.95
grad_clip = 1.0
