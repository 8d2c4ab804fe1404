"""
The files nanoFFN writes and reads back, and the rule they all follow: a write lands whole or not at all.

Every file is written into a temporary file beside its place, synced and renamed over it, so a kill, a full disk or a
read-only folder leaves what was there before intact and no temporary file behind; a failure to write stops the
command with one sentence (RunStopped, exit status 3). log.jsonl is the one file appended to: a line that is not a
record as train.py writes it is set aside when read. A run directory holds ckpt.pt, log.jsonl, .lock (its owner) and
stopped.txt (why it diverged; the next try removes it).
"""
import fcntl
import json
import math
import os
import signal
import socket
import sys
import tempfile
from contextlib import contextmanager, suppress

import torch

from cli import RunStopped, UserError

# a run directory's files, named here only
CKPT = 'ckpt.pt'  # the model, optimizer and settings at the last evaluation (train.py)
LOG = 'log.jsonl'  # one record per logged iteration (train.py; FIELDS below)
STOPPED = 'stopped.txt'  # why the run diverged (train.py; the next try removes it)
RECORD = 'compare.json'  # compare.py's record of a run it started or planned: its settings, before any checkpoint
TRAIN_OUT = 'train.out'  # the output of every try compare.py started, each after its `$ command` line
LOCK = '.lock'  # a run directory's owner
LOCK_FD_ENV = 'NANOFFN_LOCK_FD'  # compare.py hands the lock it took for a run to the train.py it starts
HELD = 'held:'  # ... or, to torchrun's workers (it passes no descriptor on), the lock file torchrun holds for them

# ----------------------------------------------------------------------------------------------------------------------
# writing


def write_failed(path, e):
    """The one-sentence stop of a write that failed."""
    reason = getattr(e, 'strerror', None) or (str(e).splitlines() or [type(e).__name__])[0]
    return RunStopped(f"could not write {path} ({reason}); what was there before is unchanged: free some space or "
                      f"make the folder writable, then try again.")


def write_file(path, write, binary=False):
    """Write path atomically: write(f) into a temporary file in path's folder, flushed and synced, then renamed over
    path. On any failure the temporary file is removed and path is untouched; a failure to write raises RunStopped."""
    tmp = os.path.join(os.path.dirname(path) or '.', f'.{os.path.basename(path)}.tmp{os.getpid()}')
    try:
        with open(tmp, 'wb' if binary else 'w', encoding=None if binary else 'utf-8') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise write_failed(path, e) from None
    finally:
        with suppress(OSError):
            os.remove(tmp)


def check_writable(folder, create=False):
    """A UserError unless files can be created in folder (created first with create=True): checked before a command
    does its work, so that it never fails after it has replaced something."""
    if create:
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot create the folder {folder} ({e.strerror or e}); choose one you can write to.") from None
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        reason = 'no such folder' if isinstance(e, FileNotFoundError) else e.strerror or str(e)
        raise UserError(f"cannot write in {folder} ({reason}); choose a folder you can write to.") from None


def write_text(path, text):
    write_file(path, lambda f: f.write(text))


def write_json(path, obj):
    write_file(path, lambda f: f.write(json.dumps(obj, indent=1) + '\n'))


def save_figure(fig, path):
    """A matplotlib figure as a PNG, atomically (a full disk must not truncate the previous picture)."""
    write_file(path, lambda f: fig.savefig(f, format='png', dpi=fig.dpi), binary=True)


def _torch_save(obj, f):
    try:
        torch.save(obj, f)
    except RuntimeError as e:  # torch.save's writer reports a failed write (a full disk) as a RuntimeError
        raise OSError(getattr(e.__context__, 'errno', None), getattr(e.__context__, 'strerror', None) or
                      'the write failed, e.g. the disk is full') from None


@contextmanager
def ctrl_c_held():
    """Within it, a Ctrl-C (SIGINT) waits: raised as KeyboardInterrupt once the block is done."""
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            raise KeyboardInterrupt


def save_checkpoint(ckpt, out_dir):
    with ctrl_c_held():
        write_file(os.path.join(out_dir, CKPT), lambda f: _torch_save(ckpt, f), binary=True)


# ----------------------------------------------------------------------------------------------------------------------
# reading


def model_state(state_dict):
    """A checkpoint's weights as a plain GPT's state dict: a compiled model's keys carry '_orig_mod.' and a DDP one's
    'module.', at the start or (regional compilation) inside."""
    out = {}
    for k, v in state_dict.items():
        for prefix in ('_orig_mod.', 'module.'):
            while k.startswith(prefix):
                k = k[len(prefix):]
            k = k.replace('.' + prefix, '.')
        out[k] = v
    return out


def read_json(path):
    """A JSON object from a file, or None if it is missing, not JSON or not an object."""
    try:
        with open(path, encoding='utf-8') as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


# ----------------------------------------------------------------------------------------------------------------------
# log.jsonl: one JSON object per logged iteration (see train.py). FIELDS: what each field train.py writes must be to be
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


def append_lines(path, lines):
    try:
        with open(path, 'a', encoding='utf-8') as f:
            f.writelines(lines)
    except OSError as e:
        raise write_failed(path, e) from None


# ----------------------------------------------------------------------------------------------------------------------
# the run directory's owner


def try_lock_run_dir(out_dir):
    """(lock file, None) if this process now owns out_dir, or (None, 'PID n on host h') naming the process that does.
    An exclusive fcntl.flock on out_dir/.lock (which holds the owner's PID and host), released by the kernel when its
    process ends, however it ends: a dead run's lock is simply taken over. Closing the file releases it; a child started
    with its descriptor in LOCK_FD_ENV shares it (with HELD + its path there, its parent holds it for it). On
    network filesystems it may exclude only processes of one machine."""
    path = os.path.join(out_dir, LOCK)
    try:
        os.makedirs(out_dir, exist_ok=True)
        # unbuffered: a write that fails (a full disk) fails at once, never again when the lock is closed
        f = open(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), 'r+b', buffering=0)  # never truncated before it is ours
    except OSError as e:
        raise UserError(f"cannot write in {out_dir} ({e.strerror or e}); choose a directory you can write to.") from None
    inherited = os.environ.get(LOCK_FD_ENV, '')
    with suppress(OSError):  # the lock compare.py took for this run and handed on: the same open file, so shared
        if inherited.isdigit() and os.path.samestat(os.fstat(int(inherited)), os.fstat(f.fileno())):
            f.close()
            f = open(int(inherited), 'r+b', buffering=0)
        elif inherited.startswith(HELD) and os.path.samestat(os.stat(inherited[len(HELD):]), os.fstat(f.fileno())):
            return f, None  # torchrun, started by compare.py, holds this lock for its workers
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = f.read().decode(errors='replace').strip() or 'unknown'
        f.close()
        pid, _, host = owner.partition(' ')
        return None, f"PID {pid}" + (f" on {host}" if host else '')
    except OSError as e:  # a filesystem without locks: train anyway, but say that the folder is not guarded
        print(f"warning: cannot lock {path} ({e.strerror or e}); make sure no other run uses {out_dir}.", file=sys.stderr)
    with suppress(OSError):  # a full disk: the lock holds all the same, only its note of the owner is missing
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()} {socket.gethostname()}\n".encode())
    return f, None


def lock_run_dir(out_dir):
    """The lock file of out_dir (see try_lock_run_dir), or a UserError naming the process that owns the directory."""
    f, owner = try_lock_run_dir(out_dir)
    if f is None:
        raise UserError(f"{out_dir} is in use by another run ({owner}); wait for it to finish or stop it, or choose "
                        f"another --out_dir.")
    return f
