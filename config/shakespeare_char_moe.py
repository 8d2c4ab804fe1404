# A toy Mixture-of-Experts version of config/shakespeare_char.py, for a laptop CPU. Its dense match is
# config/shakespeare_char.py itself: each expert is half as wide (expert_hidden defaults to the dense width / top_k),
# so a token's 2 experts hold the same FFN weights as the dense FFN: same active parameters, 4x the total.
#   python train.py config/shakespeare_char.py     --out_dir=out-sc-dense
#   python train.py config/shakespeare_char_moe.py --out_dir=out-sc-moe
# MoE against dense step time (bench.py --n_expert=8): BENCHMARKS.md.

exec(open('config/shakespeare_char.py').read())

out_dir = 'out-shakespeare-char-moe'
n_expert = 8
top_k = 2
moe_every = 1
aux_loss_weight = 0.01
z_loss_weight = 0.001
