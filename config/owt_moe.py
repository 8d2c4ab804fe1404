# A toy MoE on OpenWebText for one GPU: config/owt_quick.py with 8 experts, top-2, in every block. Its dense match is
# config/owt_quick.py: expert_hidden defaults to the dense width / top_k, so the active FFN weights per token equal
# the dense model's (MFU counts active parameters).
#   python train.py config/owt_quick.py --out_dir=out-owt-dense
#   python train.py config/owt_moe.py   --out_dir=out-owt-moe
# Tokens: as owt_quick, 197M. Time (an ESTIMATE): the same active FLOPs as owt_quick (~90 s of math at 40% MFU on an
# H100/H200); the router, sort and grouped matmuls run well below that, so budget ~2x owt_quick's wall time.

exec(open('config/owt_quick.py').read())

out_dir = 'out-owt-moe'
n_expert = 8
top_k = 2
moe_every = 1
aux_loss_weight = 0.01
z_loss_weight = 0.001
