"""
A run's checkpoint, ckpt.pt: everything an exact continuation needs (weights, optimizer, every process's RNG and data
stream), written by train.py at an evaluation (save_checkpoint) and read back by a resume, sample.py, inspect_run.py
and a comparison, each through load_checkpoint.

A checkpoint holds tensors and plain Python values only, so torch.load(weights_only=True) reads it without running code.
What train.py wrote is trusted, but caught: its contents are used only inside `loading`, where each state's owner checks
it as it loads (load_state_dict(strict=True), the RNG setters, the data loader's load_state_dict) and any failure
becomes one sentence naming the file. Nothing on disk changes before a resume has loaded everything (run_log.py's
open_for_try).
"""
import glob
import os

import torch

from machinery.cli import UserError, reading
from machinery.fingerprint import OTHER_CODE, code_hash

CKPT = 'ckpt.pt'
LOG = 'log.jsonl'  # beside it, the run's log (run_log.py)
DIVERGED = 'diverged.txt'  # why the run diverged (train.py), its outcome at these settings; a new try removes it
HINT = 'train the run again, or point --out_dir at the right run directory'
# where a missing checkpoint may be
RUN_DIRS = "a comparison's runs are its OUT/[SIZE/]VARIANT/[lrRATE/]seedN, SIZE a ladder's"


def a_run_below(out_dir):
    """A run directory (one holding ckpt.pt, else one started: its log.jsonl) in the folders below out_dir, as a
    comparison keeps its runs, or None."""
    for name in (CKPT, LOG):
        for depth in range(1, 5):  # OUT/[SIZE/]VARIANT/[lrRATE/]seedN
            if found := sorted(glob.glob(os.path.join(glob.escape(out_dir), *['*'] * depth, name))):
                return os.path.dirname(found[0])
    return None


def loading(path, hint=HINT):
    """The block that uses a checkpoint's contents: any failure there is one sentence naming path (cli.reading)."""
    return reading(path, hint)


def load_checkpoint(out_dir, missing_hint, mmap=False, hint=HINT):
    """The one reader of out_dir/ckpt.pt: the dict train.py saved, or a UserError where it cannot be read (hint: what
    to do then) or, with a missing_hint saying what to do, where there is none (None without one), unless the folder
    says why: a run that diverged before its first, has yet to write it, or a comparison's runs below. mmap: its tensors
    stay on disk until used (a comparison reads many checkpoints for their plain fields)."""
    path = os.path.join(out_dir, CKPT)
    if missing_hint is not None and os.path.isfile(out_dir):  # a user's --out_dir naming its checkpoint, say
        raise UserError(f"--out_dir={out_dir} is a file; give the run's directory, e.g. "
                        f"{os.path.dirname(out_dir) or '.'}.")
    if not os.path.exists(path):
        if missing_hint is None:
            return None
        if os.path.exists(os.path.join(out_dir, DIVERGED)):
            missing_hint = f"the run diverged before its first ({DIVERGED} says why and what to change)."
        elif os.path.exists(os.path.join(out_dir, LOG)):  # a run started there: it writes one at an evaluation
            missing_hint = ("the run writes it at its first evaluation after a step: wait for that, or train it "
                            "again if it was stopped before.")
        elif run := a_run_below(out_dir):  # a comparison's folder, say: its runs are below it
            missing_hint = f"{out_dir} holds runs in the folders below it: give one of them, e.g. --out_dir={run}."
        raise UserError(f"there is no checkpoint at {path}; {missing_hint}")
    with loading(path, hint):
        ckpt = torch.load(path, map_location='cpu', weights_only=True, mmap=mmap)
        return {**ckpt}  # a dict, or a failure here


def checkpoint_model(ckpt, path, build):
    """The model a checkpoint holds: build(model_args) makes it (the caller's GPT), then load_state_dict(strict=True)
    checks that the weights fit. It is built on the meta device first, taking no memory, so that model_args describing
    a model larger than its weights are refused before that memory is taken. A checkpoint only ever holds finite
    weights. Where it was trained with other code than the GPT's now (an edited activation), a failure says so."""
    if ckpt.get('code') in (None, code_hash()):
        guard = loading(path)
    else:  # the likely cause of a failure
        guard = reading(path, 'restore the code it was trained with, or train the run again',
                        f"it was trained with {OTHER_CODE}")
    with guard:
        weights = ckpt['model']
        with torch.device('meta'):
            size = sum(p.numel() for p in build(ckpt['model_args']).parameters())
        if size > sum(v.numel() for v in weights.values()):
            raise ValueError(f"its model_args describe a model of {size:,} parameters, more than its weights hold")
        model = build(ckpt['model_args'])
        model.load_state_dict(weights)
    if not all(bool(p.isfinite().all()) for p in model.parameters()):
        raise UserError(f"the checkpoint {path} (iteration {ckpt['iter_num']}) holds non-finite weights, so it cannot "
                        f"be used; train the run again with a lower learning_rate.")
    return model
