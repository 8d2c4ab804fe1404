"""
A run directory's owner: its .lock names the process that owns it, one run per directory.
"""
import fcntl
import os
import socket
import sys
from contextlib import suppress

from machinery.cli import UserError

LOCK = '.lock'  # holds the owner's PID and host
LOCK_FD_ENV = 'NANOFFN_LOCK_FD'  # compare.py hands the lock it took for a run to the train.py it starts
HELD = 'held:'  # ... or, to torchrun's workers (it passes no descriptor on), the lock file torchrun holds for them


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
