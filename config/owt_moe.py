# A toy MoE on OpenWebText, one GPU: config/owt_quick.py, its dense match, with 8 experts, top-2, in every block.
#   python train.py config/owt_moe.py   # against: python train.py config/owt_quick.py --out_dir=out-owt-dense
# Tokens: 197M, as owt_quick. Time: an ESTIMATE, never measured: budget ~2x owt_quick's wall time.

import os

exec(open(os.path.join(os.path.dirname(__file__), 'owt_quick.py')).read())
out_dir = 'out-owt-moe'
n_expert = 8
top_k = 2
moe_every = 1
aux_loss_weight = 0.01
z_loss_weight = 0.001
