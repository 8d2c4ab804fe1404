"""
A run's log, log.jsonl: one JSON record per logged iteration, as train.py writes it (its docstring says which fields),
appended a line at a time, so that every finished line is readable while the run goes on. It is read back against its
schema (FIELDS): a line that is not such a record (torn by a kill, damaged by hand or by a disk) is set aside, never a
reason to drop the others or an exception in a report. Beside it, stopped.txt: why a run stopped for good.
"""
import json
import math
import os
import sys
from contextlib import suppress

import torch

from machinery.cli import RunStopped
from machinery.files import append_lines, write_text

LOG = 'log.jsonl'
STOPPED = 'stopped.txt'  # why the run diverged (train.py), its outcome at these settings; a new try removes it
DIVERGED_HINT = 'lower learning_rate, set grad_clip, or use another dtype'


# FIELDS: what each field train.py writes must be to be
# read back (any may be absent but 'iter'), so that a record of another shape is set aside as a damaged line is, never
# an exception in a report. Bounds: a loss is a cross-entropy in nats, |x| <= 1e6 (e^-1e6 is no probability a
# float holds); ints are int64s; every other number a float32's (what train.py logs comes from float32 tensors).
F32_MAX = 3.4028234663852886e38


def _in(lo, hi, kinds=(int, float)):
    return lambda v: type(v) in kinds and lo <= v <= hi  # type, not isinstance: a bool is no number; NaN is in no range


def _dict_of(test):
    return lambda v: type(v) is dict and all(test(x) for x in v.values())


_COUNT, _LOSS, _NUMBER = _in(0, 2**63 - 1, (int,)), _in(-1e6, 1e6), _in(-F32_MAX, F32_MAX)
# act (GPT.learned): {'layers': [{part (act, act_up, moe): {quantity: number, or {name: number}}}, one per layer]}
_LAYER = _dict_of(_dict_of(lambda q: _NUMBER(q) or _dict_of(_NUMBER)(q)))
_TEXT, _NUMBER_OR_NULL = (lambda v: type(v) is str), (lambda v: v is None or _NUMBER(v))
FIELDS = {'iter': _COUNT, 'tokens': _COUNT, 'lr': _NUMBER, 'loss': _LOSS, 'val_loss': _LOSS, 'ms': _NUMBER,
          'tok_s': _NUMBER, 'mfu': _NUMBER_OR_NULL, 'grad_norm': _NUMBER_OR_NULL, 'batch_hash': _TEXT,
          'val_hash': _TEXT, 'loss_total': _NUMBER, 'aux': _NUMBER, 'z': _NUMBER,  # the last three an MoE's
          'val_halves': lambda v: type(v) is list and len(v) == 2 and all(map(_LOSS, v)),
          'act': lambda v: type(v) is dict and v.keys() == {'layers'} and type(v['layers']) is list
          and all(map(_LAYER, v['layers']))}


def parse_record(line):
    """A log line's record if it is one as train.py writes it (FIELDS; any other float finite), else None."""
    try:
        r = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: brackets nested deeper than the parser goes
        return None
    valid = (type(r) is dict and 'iter' in r and all(FIELDS[k](v) for k, v in r.items() if k in FIELDS)
             and all(math.isfinite(v) for v in r.values() if type(v) is float))
    return r if valid else None


def read_log_lines(path):
    """(records, damaged): the records of a log.jsonl and the text of every line that is not one (a torn last line
    after a kill mid-write, a line damaged by hand or by a disk), set aside, never a reason to drop the others."""
    records, damaged = [], []
    try:
        with open(path, encoding='utf-8', errors='replace') as f:
            lines = f.readlines()
    except FileNotFoundError:
        return [], []
    except OSError as e:  # e.g. a directory where the file should be
        return [], [f'(unreadable: {e.strerror})\n']
    for line in lines:
        if (record := parse_record(line)) is not None:
            records.append(record)
        elif line.strip():
            damaged.append(line if line.endswith('\n') else line + '\n')
    return records, damaged


def truncate_log(path, iter_num):
    """Keep every intact line up to the checkpoint's iteration (a resumed run writes the later ones again; -1: none,
    a new run). Damaged lines go to log.jsonl.damaged, with a warning, never dropped silently. Returns the number of
    lines kept."""
    records, damaged = read_log_lines(path)
    records = [r for r in records if r['iter'] <= iter_num]
    if damaged:
        append_lines(path + '.damaged', damaged)
        print(f"warning: {len(damaged)} damaged line(s) of {path} moved to {path}.damaged.", file=sys.stderr)
    write_text(path, ''.join(json.dumps(r) + '\n' for r in records))
    return len(records)


def append_log(path, record):
    """One record as one line of log.jsonl, appended and closed at once (a reader sees every finished line)."""
    append_lines(path, [json.dumps(record) + '\n'])


def clear_stopped(out_dir):
    """A new try of a run: the note of how an earlier one stopped goes, so that afterwards it says how this one did."""
    with suppress(FileNotFoundError):
        os.remove(os.path.join(out_dir, STOPPED))


# ----------------------------------------------------------------------------------------------------------------------
# a run that diverged: its outcome at its settings, said in its directory


class Diverged(RunStopped):
    """A loss or the weights became non-finite: the run's outcome at these settings, kept in out_dir/stopped.txt."""


def check_finite_losses(losses, iter_num, kept):
    """Diverged naming the first of a log window's steps (rows of losses, the last completing iter_num) whose loss
    was not finite; kept: what became of the checkpoint, in words."""
    if len(bad := (~torch.isfinite(losses)).any(1).nonzero()):
        k = iter_num - len(losses) + int(bad[0]) + 1  # the iteration that step completed, as in the log
        raise Diverged(f"the training loss became non-finite ({losses[int(bad[0]), 0].item()}) at iteration {k}, so "
                       f"the run stopped and {kept}; {DIVERGED_HINT}, then resume or start again.")


def check_finite_weights(model, val_loss, iter_num, kept):
    """Stop before a checkpoint could hold a diverged model. A step's training loss is computed before its update,
    so it cannot see the update that broke the weights: the weights and the validation loss can."""
    if not (math.isfinite(val_loss) and all(bool(p.isfinite().all()) for p in model.parameters())):
        raise Diverged(f"the weights became non-finite at iteration {iter_num} (validation loss {val_loss}), so the run "
                       f"stopped and {kept}; {DIVERGED_HINT}, then resume or start again.")


def note_diverged(out_dir, e):
    """Why a run diverged, kept in its directory: compare.py counts it as the run's result, never to train again. Any
    other stop (a failed write) is not noted, so the same command again continues the run."""
    with suppress(RunStopped):  # a disk too full for the note: the run stops all the same
        write_text(os.path.join(out_dir, STOPPED), f"{e}\n")
