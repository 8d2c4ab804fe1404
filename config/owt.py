# A GPT-2-small-sized dense model (12 layers, 12 heads, d=768, ~124M parameters) on OpenWebText, one GPU.
#   python data/openwebtext/prepare.py --subsets=0-6 && python train.py config/owt.py   # --ffn=... to compare
#   torchrun --standalone --nproc_per_node=8 train.py config/owt.py --gradient_accumulation_steps=4  # same tokens/iter
# Tokens: 2.6B (~21 per parameter). Time: about 1.7 hours on one H200, an ESTIMATE from bench.py's 429k tokens/s at this
# shape (BENCHMARKS.md, GPU), evaluation left out.

out_dir = 'out-owt'
dataset = 'openwebtext'

eval_interval = 250
eval_iters = 100  # 100 x 16 x 1024 = 1.6M validation tokens, the same for every run
log_interval = 10
always_save_checkpoint = True

n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
dropout = 0.0
ffn = 'gelu'

batch_size = 16  # per micro-step
gradient_accumulation_steps = 32
max_iters = 5000
lr_decay_iters = 5000
learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 200
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
