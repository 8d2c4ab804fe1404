# A toy Mixture-of-Experts version of config/shakespeare_char.py, for a laptop CPU. Its dense match is
# config/shakespeare_char.py itself: each expert is half as wide (expert_hidden defaults to the dense width / top_k),
# so a token's 2 experts hold the same FFN weights as the dense FFN — same active parameters, 4x the total.
#   python data/shakespeare_char/prepare.py
#   python train.py config/shakespeare_char.py     --out_dir=out-sc-dense
#   python train.py config/shakespeare_char_moe.py --out_dir=out-sc-moe
# Tokens: as the dense config, 2000 x 12 x 64 = 1.5M. Time: the routing, sort, gather and scatter add ~20% to a
# step at this size (MoE / dense step time 1.24 eager, 1.22 compiled, one thread on a 2-core AMD EPYC:
#   python bench.py --variants=gelu --n_expert=8 --top_k=2 --compile=both --threads=1 --n_layer=4 --n_head=4
#       --n_embd=128 --block_size=64 --batch_size=12 --repeats=10 --warmup=3
# BENCHMARKS.md, "MoE against its dense twin", has the same at a larger size).

exec(open('config/shakespeare_char.py').read())

out_dir = 'out-shakespeare-char-moe'
n_expert = 8
top_k = 2
moe_every = 1
aux_loss_weight = 0.01
z_loss_weight = 0.001
