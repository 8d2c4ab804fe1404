"""train.py with a NaN loss at one iteration, as a run that diverges there: how the tests make a run diverge, from
outside train.py. As a command it is train.py whose iteration $NAN_AT has a NaN loss (`NAN_AT=3 python
tests/nan_train.py --key=value ...`, or runs.TRAIN_PY pointed here for compare.py); a test in its own process patches
train.step with nan_step."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train  # noqa: E402
from machinery.cli import run_cli  # noqa: E402


def nan_step(step, k, scale=float('nan')):
    """train.step whose step completing iteration k has its loss times scale, before backward (so its gradients are
    too): NaN, or a factor whose gradients overflow float32 while the loss does not."""
    def nan_at_k(r, lr):
        if r.iter_num + 1 != k:
            return step(r, lr)
        hook = r.model.register_forward_hook(lambda module, args, out: (out[0], out[1] * scale, out[2]))
        try:
            return step(r, lr)
        finally:
            hook.remove()
    return nan_at_k


if __name__ == '__main__':
    train.step = nan_step(train.step, int(os.environ['NAN_AT']))
    run_cli(train.main)
