# nanoGPT's "baby GPT" on the bundled Shakespeare characters, for one GPU.
#   python data/shakespeare_char/prepare.py && python train.py config/shakespeare_char_gpu.py
# Tokens: 5000 iterations x 64 x 256 = 82M tokens (~18 epochs of the 4.5M training characters: it overfits, hence
# dropout 0.2 and saving only the best checkpoint).
# Time (an estimate from FLOPs, not a measurement): N ~ 10.7M parameters, 6 * N * tokens + attention ~ 6e15 FLOPs,
# / (0.4 * 989e12 FLOP/s) ~ 15 s of compute on an H100/H200; small models reach far below 40% MFU, so expect a few
# minutes including compilation and evaluation.

out_dir = 'out-shakespeare-char-gpu'
dataset = 'shakespeare_char'
eval_interval = 250
eval_iters = 200
log_interval = 10
always_save_checkpoint = False

n_layer = 6
n_head = 6
n_embd = 384
block_size = 256
dropout = 0.2

batch_size = 64
gradient_accumulation_steps = 1
max_iters = 5000
lr_decay_iters = 5000
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 100
beta2 = 0.99
