# A toy Mixture-of-Experts version of config/shakespeare_char.py, for a laptop CPU. Its dense match is
# config/shakespeare_char.py itself: each expert is half as wide (expert_hidden defaults to the dense width / top_k),
# so a token's 2 experts hold the same FFN weights as the dense FFN — same active parameters, 4x the total.
#   python data/shakespeare_char/prepare.py
#   python train.py config/shakespeare_char.py     --out_dir=out-sc-dense
#   python train.py config/shakespeare_char_moe.py --out_dir=out-sc-moe
# Tokens: as the dense config, 2000 x 12 x 64 = 1.5M. Time: the dispatch adds overhead on a CPU (see README,
# "MoE step time"); expect roughly 1.5-2x the dense run's minutes.

exec(open('config/shakespeare_char.py').read())

out_dir = 'out-shakespeare-char-moe'
n_expert = 8
top_k = 2
moe_every = 1
aux_loss_weight = 0.01
z_loss_weight = 0.001
