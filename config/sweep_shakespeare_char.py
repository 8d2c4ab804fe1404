# The sweep that tunes the default comparison's learning rates: its 8 variants x 5 rates x 3 seeds (1337-1339), each
# variant's rate chosen by the one-standard-error rule on half of the validation windows, then trained there on 3
# fresh seeds (1340-1342) and reported on the other half: 144 runs. Its summary prints the two lines (tuned_lrs,
# tuned_at) that config/compare_shakespeare_char.py holds; run it again after changing the model, the budget, the
# batch, the dataset or eval_iters, and copy them there.
#   python compare.py config/sweep_shakespeare_char.py
import os

exec(open(os.path.join(os.path.dirname(__file__), 'compare_shakespeare_char.py')).read())

out_dir = 'out-sweep-shakespeare-char'
seed = 1337
lrs = '1e-3,2e-3,4e-3,8e-3,1.6e-2'  # factors of 2 around the shared rate 2e-3 (its answer is shown too)
lr_extend = True  # a best rate at an edge tries the next one beyond it
