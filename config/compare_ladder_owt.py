# A scaling ladder on OpenWebText, one GPU: gelu, swiglu, polynorm and moa at 4 sizes (16M-124M parameters).
#   python data/openwebtext/prepare.py --subsets=0-2 && python compare.py config/compare_ladder_owt.py
# Tokens: 20 per non-embedding parameter (63M to 1.70B). Time: an ESTIMATE, never measured: ~6 hours for 1 seed.

import os

exec(open(os.path.join(os.path.dirname(__file__), 'owt.py')).read())  # GPT-2 small's recipe

out_dir = 'out-ladder-owt'
variants = 'gelu,swiglu,polynorm,moa'
baseline = 'gelu'
seeds = 1
sizes = '4x256x4,6x384x6,8x512x8,12x768x12'  # --sizes=4x256x4,6x384x6,8x512x8 runs the smaller ones first
tokens_per_param = 20.0
lr_rule = 'width'
jobs = 1  # one GPU: one run at a time
device = 'cuda'
compile = True
dtype = 'bfloat16'

batch_size = 16
block_size = 1024
gradient_accumulation_steps = 8
max_iters = 1000  # the reference schedule that tokens_per_param rescales per size
lr_decay_iters = 1000
warmup_iters = 50
eval_interval = 100
eval_iters = 50  # 50 x 16 x 1024 = 819k fixed validation tokens
learning_rate = 1.8e-3  # at the first (narrowest) size
min_lr = 1.8e-4
