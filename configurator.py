"""Command-line configuration in nanoGPT's style, with strict checking.

    python train.py [config/FILE.py ...] [--key=value ...]

A config file is plain Python, exec'd with the current settings in scope (so it may write
`lr_decay_iters = max_iters`); every public name it assigns must be a known key. Names that start
with '_' are private helpers and are ignored. Then each --key=value override is applied in order.

Values are parsed with ast.literal_eval and must match the type of the key's default: an int key
takes 12 or 1e4 (an integral float is fine) but not 3.5 (never silently truncated); a float key takes
3 or 6e-4; a bool key takes True/False (also true/false/1/0; --key alone means --key=True); a str key
takes the text as written (--dataset=shakespeare_char, no quotes needed). A key whose default is None means "auto"; its type is
given in `types` and it also accepts the words auto/None.

A config file that calls sys.exit("why") stops the command before anything runs: like any other mistake in a
config file it is reported as one sentence carrying its message ('why', or the exit status it gave), exit status 2.

Mistakes raise UserError with one sentence; `run_cli(main)` prints it on stderr and exits 2 with no
traceback. Every script (train.py, sample.py, compare.py, bench.py) should end with
`if __name__ == '__main__': run_cli(main)`.
"""

import ast
import difflib
import os
import sys
import textwrap


class UserError(Exception):
    """A mistake the user can fix: the CLI prints its one-sentence message and exits with status 2."""


class RunStopped(Exception):
    """A run that had to stop (e.g. non-finite loss): message on stderr, exit status 3, no traceback."""


_TYPE_NAMES = {bool: 'a bool (True/False)', int: 'an int', float: 'a float', str: 'a string'}


def _type_of(key, defaults, types):
    if types and key in types:
        return types[key]
    return type(defaults[key])


def coerce(key, value, want, default, where):
    """Return `value` as type `want`, or raise UserError. `value` is already a Python object."""
    name = _TYPE_NAMES.get(want, want.__name__)
    shown = value if isinstance(value, str) else repr(value)

    def bad():
        return UserError(f"{where}{key} expects {name} (default {'auto' if default is None else repr(default)}), got '{shown}'.")

    if value is None:
        if default is None:
            return None
        raise bad()
    if want is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ('true', 'false', '1', '0'):
            return value.lower() in ('true', '1')
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise bad()
    if want is int:
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():  # 1e4 is an int-valued float: fine
            return int(value)
        raise bad()
    if want is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad()
        return float(value)
    if want is str:
        if isinstance(value, str):
            return value
        raise bad()
    if isinstance(value, want):
        return value
    raise bad()


def _unknown_key(key, valid, where):
    close = difflib.get_close_matches(key, valid, n=2, cutoff=0.75)
    if close:
        hint = ' or '.join(f"'{c}'" for c in close)
        return UserError(f"{where}unknown config key '{key}' (did you mean {hint}?); "
                         f"run with --help to list all {len(valid)} keys.")
    return UserError(f"{where}unknown config key '{key}'; valid keys: {', '.join(sorted(valid))}.")


def _assigned_names(source):
    """Names a config file assigns at its top level (so a value equal to the default still counts as chosen)."""
    names = set()
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    names.add(n.id)
    return names


def _parse_literal(text, want, default):
    """Parse the text of --key=value: a Python literal, or the raw text for string keys."""
    if default is None and text.strip().lower() in ('auto', 'none'):
        return None
    if want is str:
        return text  # strings need no quotes; a quoted string keeps its quotes stripped below
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # let coerce() report it with the expected type


def format_help(prog, defaults, types=None, doc=''):
    lines = [f"usage: python {prog} [config/FILE.py ...] [--key=value ...]"]
    if doc:
        lines.append(textwrap.indent(textwrap.dedent(doc).strip('\n'), '  '))
    lines.append('keys (default):')
    width = max(len(k) for k in defaults)
    for k in sorted(defaults):
        v = defaults[k]
        v = 'auto' if v is None else repr(v)
        lines.append(f"  --{k.ljust(width)} {v}")
    return '\n'.join(lines)


def parse_args(defaults, argv, types=None, prog='train.py', doc=''):
    """Apply config files and --key=value overrides from argv to a copy of `defaults`.

    Returns (config, given): the resolved dict and the set of keys set explicitly (by a config file or
    an override), so that e.g. a resumed run can tell the user's choices from plain defaults.
    """
    config = dict(defaults)
    given = set()
    for arg in argv:
        if arg in ('-h', '--help'):
            print(format_help(prog, defaults, types, doc))
            sys.exit(0)
        if not arg.startswith('-'):
            # a config file: exec it with the current settings in scope
            if not os.path.isfile(arg):
                raise UserError(f"config file '{arg}' not found; give a path such as config/shakespeare_char.py.")
            try:
                with open(arg, encoding='utf-8') as f:
                    source = f.read()
            except UnicodeDecodeError:
                raise UserError(f"config file '{arg}' is not UTF-8 text; save it as UTF-8.") from None
            scope = dict(config)
            scope['__builtins__'] = __builtins__
            try:
                exec(compile(source, arg, 'exec'), scope)
            except SystemExit as e:  # the file stopped the command on purpose: its message is the sentence
                said = e.code if isinstance(e.code, str) else f'exit status {e.code or 0}'
                raise UserError(f"config file '{arg}' called sys.exit ({said}), so nothing was run.") from None
            except Exception as e:  # a broken config file is the user's to fix, report it in one line
                raise UserError(f"config file '{arg}' failed to run ({type(e).__name__}: {e}); fix the file.") from None
            assigned = _assigned_names(source)
            for key, value in scope.items():
                if key.startswith('_') or callable(value) or type(value).__name__ == 'module':
                    continue
                if key not in defaults:
                    raise _unknown_key(key, list(defaults), f"{arg}: ")
                if key in assigned or value is not config[key]:
                    config[key] = coerce(key, value, _type_of(key, defaults, types), defaults[key], f"{arg}: ")
                    given.add(key)
            continue
        flag = arg[2:].replace('-', '_')
        if arg.startswith('--') and '=' not in arg and flag in defaults and _type_of(flag, defaults, types) is bool:
            arg = f'--{flag}=True'  # a bool key alone switches it on: --plan means --plan=True
        if not arg.startswith('--') or '=' not in arg:
            raise UserError(f"cannot read argument '{arg}'; write overrides as --key=value (e.g. --n_layer=4).")
        key, text = arg[2:].split('=', 1)
        key = key.replace('-', '_') if key not in defaults else key
        if key not in defaults:
            raise _unknown_key(key, list(defaults), '')
        want = _type_of(key, defaults, types)
        value = _parse_literal(text, want, defaults[key])
        if want is str and len(value) >= 2 and value[0] == value[-1] and value[0] in '"\'':
            value = value[1:-1]
        config[key] = coerce(key, value, want, defaults[key], '--')
        given.add(key)
    return config, given


def one_line(message):
    """Errors are reported as a single line on stderr."""
    return ' '.join(str(message).split())


def run_cli(main, argv=None):
    """Run main(argv); turn a UserError into 'error: message' on stderr with exit status 2 (no traceback)
    and a RunStopped into its message with exit status 3."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        main(argv)
    except UserError as e:
        sys.stdout.flush()
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)
    except RunStopped as e:
        sys.stdout.flush()
        print(f"stopped: {one_line(e)}", file=sys.stderr)
        sys.exit(3)
    except KeyboardInterrupt:
        sys.stdout.flush()
        print('interrupted.', file=sys.stderr)
        sys.exit(130)
