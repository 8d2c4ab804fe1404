"""
How every nanoFFN command reads its settings and ends: config files and --key=value overrides, and the errors a user
can act on, each ending the command with one sentence.

    python train.py [config/FILE.py ...] [--key=value ...]

A config file (FILE.py) is plain Python, exec'd with the defaults and the earlier files' settings in scope (so it may
write `lr_decay_iters = max_iters`); every public name it assigns must be a known key (names starting with '_', and
functions and modules of other names, are its own helpers). Then each --key=value override is applied in order, also one
written before a file, which therefore never sees it. A value must have the type of the key's default: an int key takes
12 or 1e4 but not 3.5 (never silently truncated), a float key 3 or 6e-4, a bool key True/False (--key alone means True),
a str key the text as written (no NUL character); an int is one of 64 bits. A key whose default is None means "auto" and
also takes the word auto.

A mistake raises UserError with one sentence; run_cli(main) prints it on stderr and exits with status 2, no traceback.
A file nanoFFN wrote itself is trusted where it is used, and any failure to use it becomes such a sentence (reading).
A run that has to stop raises RunStopped (exit status 3); Ctrl-C exits with 130, also while a command imports torch
(quiet_interrupt), and SIGTERM where a command stops on it as on Ctrl-C (compare.py) with 143. Only the standard
library is imported here, so that a command can call it first, and on Windows it ends the command at once.
"""
import ast
import difflib
import errno
import os
import re
import signal
import sys
import textwrap
from contextlib import contextmanager

if sys.platform == 'win32':  # flock (a run's lock, a dataset's), pass_fds and POSIX signals: not on Windows
    print("error: nanoFFN runs on Linux and macOS; on Windows, run it in WSL (wsl --install).", file=sys.stderr)
    sys.exit(2)

class UserError(Exception):
    """A mistake the user can fix: the CLI prints its one-sentence message and exits with status 2."""


class RunStopped(Exception):
    """A run that had to stop (e.g. a non-finite loss, a full disk): message on stderr, exit status 3."""


class Terminated(BaseException):
    """SIGTERM (`kill`, `timeout`), raised where the command is: not an Exception, and no SystemExit, so nothing on its
    way out takes it for an error or for a config file's own sys.exit; 'terminated.', exit status 143."""


_TYPE_NAMES = {bool: 'a bool (True/False)', int: 'an int', float: 'a float', str: 'a string'}
INT_RANGE = 2**63  # every int a command takes goes into int64 (torch, numpy) or the log's JSON, read back as such


def coerce(key, value, want, default, where):
    """Return `value` (a Python object) as type `want`, or raise UserError."""
    if want is int and isinstance(value, float) and value.is_integer():  # 1e4 is an int-valued float: fine
        value = int(value)
    if isinstance(value, int) and not -INT_RANGE <= value < INT_RANGE:  # also float(10**400) would overflow
        raise UserError(f"{where}{key} must lie within -2**63 and 2**63 - 1, got an int of {value.bit_length()} bits.")
    if isinstance(value, str) and '\0' in value:  # no file name or path can hold one, and argv cannot carry one
        raise UserError(f"{where}{key} holds a NUL character (\\0); remove it.")
    if default is None and (value is None or str(value).strip().lower() == 'auto'):  # a config file's 'auto' too
        return None
    if want is bool and isinstance(value, str) and value.lower() in ('true', 'false', '1', '0'):
        return value.lower() in ('true', '1')
    if want is bool and isinstance(value, int) and value in (0, 1):  # True, False, 1 or 0
        return bool(value)
    if want is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if want is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if want is str and isinstance(value, str):  # a path's ~ too (a folder's, bench.py's report's): no shell expands
        return os.path.expanduser(value) if key.endswith('_dir') or key == 'json' else value  # one after --key=
    shown = value if isinstance(value, str) else f'a {type(value).__name__}' if callable(value) else repr(value)
    # no default named: a config file's value is often another (config/shakespeare_char.py: max_iters 2000, not 5000)
    raise UserError(f"{where}{key} expects {_TYPE_NAMES.get(want, want.__name__)}{' or auto' * (default is None)}, "
                    f"got '{shown}'.")


def _unknown_key(key, valid, where):
    close = difflib.get_close_matches(key, valid, n=2, cutoff=0.75)
    if close:
        return UserError(f"{where}unknown config key '{key}' (did you mean {' or '.join(repr(c) for c in close)}?); "
                         f"run with --help to list all {len(valid)} keys.")
    own = " (a config file's own names, a loop's variable or an imported value, start with _)" * bool(where)
    return UserError(f"{where}unknown config key '{key}'{own}; valid keys: {', '.join(sorted(valid))}.")


def _parse_literal(text, want):
    """The text of --key=value as a Python object: a literal, or the raw text for string keys."""
    if want is str:
        return text[1:-1] if len(text) >= 2 and text[0] == text[-1] and text[0] in '"\'' else text
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # coerce() reports it with the expected type


def read_text(path, what, example):
    """A UTF-8 text file the user named (a config file, a prompt), or the UserError that says what is wrong with it."""
    path = os.path.expanduser(path)  # --start=FILE:~/prompt.txt
    if not os.path.exists(path) or os.path.isdir(path):  # a pipe is text too: a shell's --start=FILE:<(...)
        raise UserError(f"{what} '{path}' {'is a folder' if os.path.isdir(path) else 'not found'}; give a path such "
                        f"as {example}.")
    try:
        with open(path, encoding='utf-8-sig') as f:  # a byte-order mark (as Windows' Notepad saves) is not text
            return f.read()
    except UnicodeDecodeError:
        raise UserError(f"{what} '{path}' is not UTF-8 text; save it as UTF-8.") from None
    except OSError as e:
        raise UserError(f"{what} '{path}' cannot be read ({e.strerror}).") from None


@contextmanager
def reading(path, hint, cause='it is damaged or not written by nanoFFN'):
    """Where a file nanoFFN wrote itself is used: it is trusted, and any failure to use it (its owners' own checks as
    they load it, or an exception deeper in) becomes one sentence naming the file, its likely cause, and hint, what to
    do. A UserError there is a sentence already (e.g. a resume on another number of processes)."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:
        why = textwrap.shorten(f"{type(e).__name__}: {str(e).rstrip('.')}", 200, placeholder=' ...')
        raise UserError(f"cannot use {path} ({why}), so {cause}; {hint}.") from None


def _run_config_file(path, config, defaults, types, given):
    source = read_text(path, 'config file', 'config/shakespeare_char.py')
    scope = {**config, '__builtins__': __builtins__, '__file__': os.path.abspath(path)}  # a file may build on another
    try:
        exec(compile(source, path, 'exec'), scope)
    except SystemExit as e:  # the file stopped the command on purpose: its message is the sentence
        said = e.code if isinstance(e.code, str) else f'exit status {e.code or 0}'
        raise UserError(f"config file '{path}' called sys.exit ({said}), so nothing was run.") from None
    except Exception as e:
        raise UserError(f"config file '{path}' failed to run ({type(e).__name__}: {e}); fix the file.") from None
    # names the file assigns at its top level, so that a value equal to the default still counts as chosen
    assigns = [node for node in ast.parse(source).body if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))]
    targets = [t for node in assigns for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
    assigned = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    for key, value in scope.items():
        if key.startswith('_') or key not in defaults and (callable(value) or type(value).__name__ == 'module'):
            continue  # the file's own helpers and imports; a known key's value must be of its type, whatever it is
        if key not in defaults:
            raise _unknown_key(key, list(defaults), f"{path}: ")
        if key in assigned or value is not config[key]:
            config[key] = coerce(key, value, types.get(key, type(defaults[key])), defaults[key], f"{path}: ")
            given[key] = path


def key_notes(*paths):
    """{key: the comment beside it} in the files that define a command's keys, one to a line (`key=...  # what`, or a
    dataclass field's `key: type = ...  # what`), a later file's over an earlier's: --help shows them."""
    notes = {}
    for path in paths:
        with open(path, encoding='utf-8') as f:
            notes.update(m.groups() for line in f if (m := re.match(r"\s*(\w+)\s*(?::[^=]*)?=[^#]*#\s*(.*)", line)))
    return notes


def format_help(prog, config, doc='', notes=()):
    """--help: the usage line, the script's own words, and every key with the value it has now and what it is (the
    comment beside it in the files named by notes)."""
    lines = [f"usage: python {prog} [config/FILE.py ...] [--key=value ...]"]
    if doc:
        lines.append(textwrap.indent(textwrap.dedent(doc).strip('\n'), '  '))
    lines.append('keys (values after the config files and overrides given before --help):')
    width, said = max(len(k) for k in config), key_notes(*notes)
    lines += [f"  --{k.ljust(width)} {'auto' if config[k] is None else repr(config[k])}"
              + (f"  # {said[k]}" if k in said else '') for k in sorted(config)]
    return '\n'.join(lines)


def parse_args(defaults, argv, types=None, prog='train.py', doc='', notes=()):
    """Apply config files and --key=value overrides from argv to a copy of `defaults`. Returns (config, given): the
    settings and the keys set explicitly, each with what set it last ('--' for an override, else the config file's
    path), so that e.g. a resumed run can tell the user's choices from plain defaults, and say where each came from."""
    config, given, types = dict(defaults), {}, types or {}
    if asked := [i for i, arg in enumerate(argv) if arg in ('-h', '--help')]:
        argv = argv[:asked[0] + 1]  # --help shows the values the arguments before it give
    for arg in sorted(argv, key=lambda a: a.startswith('-')):  # the config files first: an override always wins
        if arg in ('-h', '--help'):
            print(format_help(prog, config, doc, notes))
            sys.exit(0)
        if not arg.startswith('-'):  # a config file, run as Python: only a file named as one
            if not arg.endswith('.py'):
                before = argv[argv.index(arg) - 1] if argv.index(arg) else ''  # --ffn polynorm, as argparse takes it
                meant = f" (did you mean {before}={arg}?)" if before.startswith('--') and '=' not in before else ''
                raise UserError(f"cannot read argument '{arg}'{meant}: a config file is a FILE.py and an override "
                                f"--key=value (a value with spaces goes in quotes, a list is comma-separated without "
                                f"spaces).")
            _run_config_file(arg, config, defaults, types, given)
            continue
        key, equals, text = split_arg(arg)
        want = types.get(key, type(defaults.get(key)))
        if arg.startswith('--') and not equals and want is bool:
            equals, text = '=', 'True'  # a bool key alone switches it on: --plan means --plan=True
        if not arg.startswith('--') or not equals:
            example = key if arg.startswith('--') and key in defaults else next(iter(defaults))  # a key it has
            raise UserError(f"cannot read argument '{arg}'; write overrides as --key=value (e.g. --{example}=VALUE).")
        if key not in defaults:
            raise _unknown_key(key, list(defaults), '')
        config[key] = coerce(key, _parse_literal(text, want), want, defaults[key], '--')
        given[key] = '--'
    return config, given


def split_arg(arg):
    """'--key=value' -> (key, '=', value), a '-' in key read as '_' (--n-layer): every override is split here."""
    key, equals, text = arg[2:].partition('=')
    return key.replace('-', '_'), equals, text


def split_list(text):
    """'a, b,,c' -> ['a', 'b', 'c']: every comma-separated setting is read this way."""
    return [part.strip() for part in text.split(',') if part.strip()]


def _interrupted(signum, frame):
    os.write(2, b'interrupted.\n')
    os._exit(130)  # at once: a SystemExit raised inside an import being run could be caught or printed on the way out


def quiet_interrupt(name):
    """Ctrl-C ends the command at once with 'interrupted.' and status 130 until run_cli starts main, and again once
    main is done: a command's first statement (`quiet_interrupt(__name__)`), before it imports torch for seconds. Only
    for a script run as a command, and not where SIGINT is ignored (a script's background job, `cmd &`)."""
    if name == '__main__' and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted)


def run_cli(main, argv=None):
    """Run main(argv), ending the command as the module's docstring says: one line on stderr and an exit status for each
    way out below, but a closed stdout pipe, which exits 141 quietly, as a shell tool does. Within main, Ctrl-C is
    Python's KeyboardInterrupt (a run saves nothing half-written, then stops)."""
    quiet = signal.getsignal(signal.SIGINT) is _interrupted
    if hasattr(sys.stdout, 'reconfigure'):  # a result reaches a log file as it is printed, in order with stderr's lines
        sys.stdout.reconfigure(line_buffering=True)
    try:
        if quiet:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        return main(sys.argv[1:] if argv is None else argv)
    except UserError as e:
        message, status = f"error: {e}", 2
    except RunStopped as e:
        message, status = f"stopped: {e}", 3
    except KeyboardInterrupt:
        message, status = 'interrupted.', 130
    except Terminated:
        message, status = 'terminated.', 143
    except OSError as e:  # on stdout: its reader stopped reading (`| head`), or its disk is full (`> log`)
        if e.errno not in (errno.EPIPE, errno.ENOSPC, errno.EDQUOT):  # the files nanoFFN writes say so (RunStopped)
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush cannot fail again
        if e.errno == errno.EPIPE:
            sys.exit(141)  # quietly, as a shell tool ends
        message, status = f"stopped: could not write the output ({e.strerror}); free some space, then try again.", 3
    finally:
        if quiet:  # the exit (torch's and wandb's handlers at shutdown) is as quiet as the start
            signal.signal(signal.SIGINT, _interrupted)
    sys.stdout.flush()
    print(' '.join(message.split()), file=sys.stderr)  # one line, whatever the message held
    sys.exit(status)
