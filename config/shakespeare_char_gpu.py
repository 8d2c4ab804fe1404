# nanoGPT's "baby GPT" on the bundled Shakespeare characters, one GPU (it overfits: dropout, best checkpoint only).
#   python train.py config/shakespeare_char_gpu.py   # the corpus is prepared on first use
# Tokens: 5000 x 64 x 256 = 82M (~18 epochs). Time: an ESTIMATE, never measured: a few minutes on one H100/H200.

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
