# FFN variants side by side on OpenWebText, one GPU: config/owt_quick.py's ~30M dense model, compiled, bf16.
#   python data/openwebtext/prepare.py && python compare.py config/compare_owt_dense.py   # --seeds=2: seed noise too
# Tokens: 197M per run, as owt_quick. Time: an ESTIMATE, never measured: ~4-5 minutes per run, ~40 in all.

import os

exec(open(os.path.join(os.path.dirname(__file__), 'owt_quick.py')).read())  # the dense recipe

out_dir = 'out-compare-owt-dense'
variants = 'gelu,relu2,swiglu,polyrelu,polynorm,la,moa,moa_glu'
baseline = 'gelu'
seeds = 1
jobs = 0  # runs placed by their size: a model this large fills a GPU, so one run per GPU at a time
device = 'cuda'
compile = True
dtype = 'bfloat16'
