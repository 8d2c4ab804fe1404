# Toy Mixture-of-Experts FFN variants side by side on OpenWebText, one GPU: config/compare_owt_dense.py with 8
# experts, top-2, in every block (config/owt_moe.py's settings). Expert width = dense width / top_k, so a token's
# active FFN weights equal the dense model's; MoA gates are computed once per token and shared by the experts, and
# PolyCom coefficients are shared by the experts of a layer. summary.md also lists the expert load per layer.
#   python data/openwebtext/prepare.py
#   python compare.py config/compare_owt_moe.py                  # -> out-compare-owt-moe/loss.png, summary.md
# Tokens: as the dense comparison, 3000 x 65,536 = 197M tokens per run (1.2B for the 6 runs).
# Time: an ESTIMATE, not a measurement. The same active FLOPs as the dense model, but the router, the sort and the
#   grouped matmuls run well below the dense MFU: budget ~2x the dense per-run time, ~8-10 minutes per run, about an
#   hour for these 6 variants. Add variants (--variants=...) at ~9 minutes each.

exec(open('config/compare_owt_dense.py').read())

out_dir = 'out-compare-owt-moe'
variants = 'gelu,swiglu,polynorm,la,moa,moa_glu'
n_expert = 8
top_k = 2
moe_every = 1
aux_loss_weight = 0.01
z_loss_weight = 0.001
