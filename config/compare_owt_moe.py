# Toy MoE FFN variants on OpenWebText, one GPU: config/compare_owt_dense.py with 8 experts, top-2, in every block.
#   python data/openwebtext/prepare.py && python compare.py config/compare_owt_moe.py
# Tokens: 197M per run, as dense. Time: an ESTIMATE, never measured: ~2x the dense per-run time, ~1 hour in all.

import os

exec(open(os.path.join(os.path.dirname(__file__), 'compare_owt_dense.py')).read())
out_dir = 'out-compare-owt-moe'
variants = 'gelu,swiglu,polynorm,la,moa,moa_glu'
n_expert = 8
top_k = 2
moe_every = 1
aux_loss_weight = 0.01
z_loss_weight = 0.001
