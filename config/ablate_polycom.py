# PolyCom's ablations (Zhuo et al., ICLR 2025, arXiv 2411.03884) put through nanoFFN: PolyNorm against PolyReLU and
# PolyReLUNorm, PolyReLU against ReLU and ReLU², and PolyReLU's order (2, 3, 4). The default comparison's model, data
# and budget (config/compare_shakespeare_char.py), each variant at its own best rate, the verdict on fresh seeds.
# BENCHMARKS.md's "The papers' claims, put through nanoFFN" holds the answers; python compare.py config/ablate_polycom.py
import os

exec(open(os.path.join(os.path.dirname(__file__), 'sweep_shakespeare_char.py')).read())

out_dir = 'out-ablate-polycom'
variants = 'relu,relu2,polyrelu,polyrelu:poly_order=2,polyrelu:poly_order=4,polynorm,polyrelunorm'
baseline = 'relu'
lrs = '4e-3,8e-3,1.6e-2'  # around the default comparison's best rates; a best at an edge tries beyond
learning_rate = 4e-3
min_lr = 4e-4
