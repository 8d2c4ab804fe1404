"""
Writing files so that a failure loses nothing, reading a JSON object back (read_json), and clearing what a killed
write left.

Every file is written into a temporary file beside its place, synced and renamed over it, so a kill, a full disk or a
read-only folder leaves what was there before intact; a failed write removes its temporary file, and one that a killed
process left is removed later (remove_dead_temps). A failure to write stops the command with one sentence
(RunStopped, exit status 3). Appending (log.jsonl, run_log.py) is the one exception.
"""
import json
import os
import signal
import tempfile
from contextlib import contextmanager, suppress

from machinery.cli import RunStopped, UserError

def write_failed(path, e):
    """The one-sentence stop of a write that failed."""
    reason = getattr(e, 'strerror', None) or (str(e).splitlines() or [type(e).__name__])[0]
    return RunStopped(f"could not write {path} ({reason}); what was there before is unchanged: free some space or "
                      f"make the folder writable, then try again.")


def write_file(path, write, binary=False):
    """Write path atomically, as the module's docstring says: write(f) into a temporary file beside it, then renamed."""
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


def check_writable(folder, create=False, advice='choose a folder you can write to'):
    """A UserError unless files can be created in folder (created first with create=True): checked before a command
    does its work, so that it never fails after it has replaced something."""
    if create:
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot create the folder {folder} ({e.strerror or e}); {advice}.") from None
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        reason = 'no such folder' if isinstance(e, FileNotFoundError) else e.strerror or str(e)
        raise UserError(f"cannot write in {folder} ({reason}); {advice}.") from None


def write_text(path, text):
    write_file(path, lambda f: f.write(text))


def append_lines(path, lines):
    try:
        with open(path, 'a', encoding='utf-8') as f:
            f.writelines(lines)
    except OSError as e:
        raise write_failed(path, e) from None


def write_json(path, obj):
    write_file(path, lambda f: f.write(json.dumps(obj, indent=1) + '\n'))


@contextmanager
def ctrl_c_held():
    """Within it, a Ctrl-C (SIGINT), and a SIGTERM the command stops on as on it (compare.py's), waits: handed
    to its handler once the block is done. A signal the command ignores stays ignored."""
    received = []
    held = [s for s in (signal.SIGINT, signal.SIGTERM) if callable(signal.getsignal(s))]
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if received:
            previous[received[0]](received[0], None)  # KeyboardInterrupt, Terminated


def read_json(path):
    """A JSON object from a file, or None if it is missing, not JSON or not an object."""
    try:
        with open(path, encoding='utf-8') as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def remove_dead_temps(folder):
    """Remove the temporary files (write_file's .NAME.tmpPID) that a process killed mid-write left in folder; a live
    process's are its writes in progress."""
    with suppress(OSError):
        for name in os.listdir(folder):
            pid = name.rpartition('.tmp')[2]
            if name.startswith('.') and pid.isascii() and pid.isdigit() and not _alive(int(pid)):
                with suppress(OSError):
                    os.remove(os.path.join(folder, name))


def _alive(pid):
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: past any pid, so no process's (.x.tmp99999999999)
        return False
    except OSError:  # another user's process
        pass
    return True
