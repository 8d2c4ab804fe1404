# FFN variants side by side on OpenWebText, one GPU: config/owt_quick.py's dense model (6 layers, 6 heads, d=384,
# block 512, ~30M parameters of which 19M embedding; GPT-2-small's recipe at a quarter of its width and half its
# depth), compiled, bf16, once per variant.
#   python data/openwebtext/prepare.py                           # the default 2 subsets (~0.9B tokens) are plenty
#   python compare.py config/compare_owt_dense.py                # -> out-compare-owt-dense/loss.png, summary.md
#   python compare.py config/compare_owt_dense.py --seeds=2      # measures the seed noise too (twice the time)
# Tokens: as owt_quick, 32 x 512 x 4 accumulation steps = 65,536 per iteration; 3000 iterations = 197M tokens per run
#   (1.6B for the 8 runs), validation on 50 x 32 x 512 = 819k fixed tokens. The gelu run is exactly
#   `python train.py config/owt_quick.py` (same seed, same batches).
# Time: an ESTIMATE, not a measurement (no GPU run of this config yet). 6 * 30e6 * 197e6 = 3.5e16 FLOPs per run is
#   ~90 s at 40% MFU on an H100/H200 bf16; a model this small runs nearer 15-25% MFU, plus ~1 minute of compilation
#   and the evaluations: ~4-5 minutes per run, ~35-45 minutes for the 8 variants. The learned activations (polynorm,
#   la, moa, moa_glu) should cost little more than gelu once compiled (the paper reports MoA at 1.03x / 1.13x).
#   One seed: differences below ~0.01 in validation loss should not be read as real without --seeds=2 or 3.

exec(open('config/owt_quick.py').read())  # the dense recipe (run from the repo root, as every config)

out_dir = 'out-compare-owt-dense'
variants = 'gelu,relu2,swiglu,polyrelu,polynorm,la,moa,moa_glu'
baseline = 'gelu'
seeds = 1
jobs = 0  # one run per visible GPU at a time (on one GPU: one after another)

device = 'cuda'
compile = True
dtype = 'bfloat16'
