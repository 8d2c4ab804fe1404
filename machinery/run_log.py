"""
A run's log, log.jsonl: one JSON record per logged iteration, as train.py writes it (its fields: log_record,
add_evaluation, and write_log's env on each try's first line), appended a line at a time, so that every finished line is
readable while the run goes on. Its one reader, read_log_lines, trusts what train.py wrote: a line that is not a record
(torn by a kill, damaged by hand or by a disk) is set aside, never a reason to drop the others, and a report reads a
missing field as missing. Beside it, diverged.txt: why a run diverged: its outcome at its settings. open_for_try makes a
run's directory ready for a new try.
"""
import json
import math
import os
import platform
import sys
from contextlib import suppress

import torch

from machinery.cli import RunStopped
from machinery.checkpoint import CKPT, DIVERGED, LOG
from machinery.files import append_lines, remove_dead_temps, write_file, write_text

DIVERGED_HINT = 'lower learning_rate'  # a divergence's advice begins so (compare.py leaves it out of its line)
PICTURES = ('acts.png', 'acts.json')  # a run's pictures (inspect_run.py's, a comparison's of its first seed)


def environment(hw):
    """What a run ran on, for its log: torch's version (its build after '+') and commit, the CUDA and cuDNN versions
    where there are any, the device's name, and torch's CPU threads."""
    cuda, cpu = hw.device_type == 'cuda', platform.processor() or platform.machine()
    return {'torch': torch.__version__, 'torch_commit': torch.version.git_version[:12], 'cuda': torch.version.cuda,
            'cudnn': torch.backends.cudnn.version() if cuda else None, 'threads': torch.get_num_threads(),
            'device': torch.cuda.get_device_name(hw.device) if cuda else f"{hw.device_type} {cpu}"}


def parse_record(line):
    """A log line's record if it is one as train.py writes it: a JSON object whose 'iter' is an int (the iterations
    done, >= 0) and whose numbers are finite; else None. Its other fields are trusted, and any may be missing."""
    try:
        r = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: brackets nested deeper than the parser goes
        return None
    if not (type(r) is dict and type(r.get('iter')) is int and 0 <= r['iter'] < 2**63):
        return None
    return r if all(math.isfinite(v) for v in r.values() if type(v) is float) else None


def read_log_lines(path):
    """(records, damaged): the records of a log.jsonl in the order of their iterations (the last record is the last
    iteration), and the text of every line that is not one, set aside as the module's docstring says."""
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
    return sorted(records, key=lambda r: r['iter']), damaged


def append_log(path, record):
    append_lines(path, [json.dumps(record) + '\n'])


def clear_diverged(out_dir):
    """A new try of a run: the note that an earlier one diverged goes, so that afterwards it says how this one did."""
    with suppress(FileNotFoundError):
        os.remove(os.path.join(out_dir, DIVERGED))


def open_for_try(out_dir, saved_iter, saved_lines=0):
    """out_dir made ready for a new try of its run (by the process that locked it, once everything the run needs has
    been checked): the note of an earlier divergence and any half-written file go; a resumed run (saved_iter, its
    checkpoint's iteration) keeps the log lines up to its checkpoint (saved_lines of them when it was written), a new
    one starts an empty log and its old checkpoint goes now, so that a resume can never join it to the new log, with
    the pictures drawn of it (PICTURES). Returns the log's lines."""
    clear_diverged(out_dir)
    remove_dead_temps(out_dir)  # a save killed mid-write
    path = os.path.join(out_dir, LOG)
    records, damaged = read_log_lines(path)
    if damaged:  # never dropped silently
        append_lines(path + '.damaged', damaged)
        print(f"warning: {len(damaged)} damaged line(s) of {path} moved to {path}.damaged.", file=sys.stderr)
    # a resumed run writes the lines past its checkpoint again
    records = [r for r in records if saved_iter is not None and r['iter'] <= saved_iter]
    if len(records) + len(damaged) < saved_lines:  # lost since: deleted, cut by hand
        print(f"warning: {path} holds {len(records)} of the {saved_lines} lines up to its checkpoint; the run goes on, "
              f"its log without the lost ones.", file=sys.stderr)

    def write(f):
        f.write(''.join(json.dumps(r) + '\n' for r in records))
        # a new run's old checkpoint goes once its log is written, before that log takes the old one's place: a kill
        # in between leaves the old log without a checkpoint (train again), never the old checkpoint beside an empty
        # log (a resume would continue the old run without its lines); a failed write leaves both
        for name in (CKPT, *PICTURES) * (saved_iter is None):
            with suppress(OSError):  # none there; or a folder of that name, which is the user's, left as it is
                os.remove(os.path.join(out_dir, name))
    write_file(path, write)
    return len(records)


# ----------------------------------------------------------------------------------------------------------------------
# a run that diverged: its outcome at its settings, said in its directory


class Diverged(RunStopped):
    """A loss, the gradient norm or the weights became non-finite: the run's outcome at these settings, kept in
    out_dir/diverged.txt."""


def check_finite_steps(values, iter_num, names, kept):
    """Diverged naming the first of a log window's steps (rows of values, the last completing iter_num) with a value
    that was not finite, and that value (names: each column's, in words); kept: what became of the checkpoint and what
    to do."""
    if len(bad := (~torch.isfinite(values)).nonzero()):
        row, col = bad[0].tolist()  # row by row: the earliest step, then its first bad column
        k = iter_num - len(values) + row + 1  # the iteration that step completed, as in the log
        raise Diverged(f"{names[col]} became non-finite ({values[row, col].item()}) at iteration {k}, so the run "
                       f"stopped and {kept}.")


def check_finite_weights(model, val_loss, iter_num, kept):
    """Stop before a checkpoint could hold a diverged model. A step's training loss is computed before its update,
    so it cannot see the update that broke the weights: the weights and the validation loss can."""
    if not (math.isfinite(val_loss) and all(bool(p.isfinite().all()) for p in model.parameters())):
        if iter_num == 0:  # before any step: the model's own arithmetic, not its training
            raise Diverged(f"the untrained model's validation loss is {val_loss}, before any step, so the run stopped; "
                           f"its forward computes a non-finite value at its init: check the code it runs "
                           f"(activations.py, model.py), or use another dtype.")
        raise Diverged(f"the weights became non-finite at iteration {iter_num} (validation loss {val_loss}), so the run "
                       f"stopped and {kept}.")


def note_diverged(out_dir, e):
    """Why a run diverged, kept in its directory: compare.py counts it as the run's result, never to train again. Any
    other stop (a failed write) is not noted, so the same command again continues the run."""
    with suppress(RunStopped):  # a disk too full for the note: the run stops all the same
        write_text(os.path.join(out_dir, DIVERGED), f"{e}\n")
