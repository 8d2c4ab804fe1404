# A quick OpenWebText run for comparing FFNs, one GPU: 6 layers, 6 heads, d=384, block 512 (~30M parameters).
#   python data/openwebtext/prepare.py && python train.py config/owt_quick.py --ffn=polynorm --out_dir=out-owt-polynorm
# Tokens: 3000 x 65,536 = 197M. Time: an ESTIMATE, never measured: ~5 minutes on one H100/H200.

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
