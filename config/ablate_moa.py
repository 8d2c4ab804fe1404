# The MoA paper's ablations ("More Expressive Feedforward Layers: Part I", arXiv 2605.26647) put through nanoFFN: the
# sigmoid gate against softmax and tanh gates (each in nanoFFN's form, c_k(x) = α_k·s_k(x), so only s differs) and
# against the paper's own plain σ(u_k·x) gate, over the paper's 7-entry dictionary, and how large a peak rate MoA takes
# against GELU. The default comparison's model, data and budget (config/compare_shakespeare_char.py), each variant at
# its own best rate, the verdict on fresh seeds.
# BENCHMARKS.md's "The papers' claims, put through nanoFFN" holds the answers; python compare.py config/ablate_moa.py
import os

exec(open(os.path.join(os.path.dirname(__file__), 'sweep_shakespeare_char.py')).read())

out_dir = 'out-ablate-moa'
variants = 'gelu,moa,moa:moa_gate=softmax,moa:moa_gate=tanh,moa:moa_gate=plain_sigmoid'
baseline = 'gelu'
act_dict = 'identity,relu,relu2,gelu,silu,leaky_relu,tanh'  # the paper's dictionary (K = 7)
lrs = '4e-3,8e-3,1.6e-2'  # around the default comparison's best rates; a best at an edge tries beyond
learning_rate = 4e-3
min_lr = 4e-4
