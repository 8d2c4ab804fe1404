# A toy MoE version of config/shakespeare_char.py (its dense match), for a laptop CPU: the same active parameters, 3x
# the total (4x the FFN weights).
#   python train.py config/shakespeare_char_moe.py --out_dir=out-sc-moe
# Tokens: as config/shakespeare_char.py. MoE against dense step time (bench.py --n_expert=8): BENCHMARKS.md.

import os

exec(open(os.path.join(os.path.dirname(__file__), 'shakespeare_char.py')).read())
out_dir = 'out-shakespeare-char-moe'
n_expert = 8
top_k = 2
moe_every = 1
aux_loss_weight = 0.01
z_loss_weight = 0.001
