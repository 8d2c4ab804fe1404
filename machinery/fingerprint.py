"""
The code a run trains with: a fingerprint of activations.py and model.py, which a learner edits to try an idea. Each
run logs it and its checkpoint keeps it, so that a comparison never reuses, and a reader never blames on damage, a run
of other code.
"""
import ast
import functools
import hashlib
import io
import os
import tokenize

IDEAS = ('activations.py', 'model.py')  # the code a learner edits to try an idea: each run logs which it trained with
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's
SKIPPED = (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING)  # what Python reads past
OTHER_CODE = f"other code of {' or '.join(IDEAS)} than they hold now"  # what every note and refusal of it says


@functools.lru_cache(maxsize=None)
def code_hash(root=ROOT):
    """12 hex digits of a SHA-256 of the code of activations.py and model.py as they are now: their tokens, so that
    comments, docstrings and the spacing between tokens do not count (what a reader sees, not what runs), but every
    string's text and the blocks indentation opens do."""
    digest = hashlib.sha256()
    for name in IDEAS:
        with open(os.path.join(root, name), 'rb') as f:
            digest.update('\0'.join(code_tokens(f.read())).encode())
    return digest.hexdigest()[:12]


def code_tokens(source):
    """The tokens of a Python source (bytes) that decide what it runs. An f-string is one token, its text, as Python
    before 3.12 reads it (3.12 splits it into parts), so that the hash is the same under every Python."""
    tree = ast.parse(source)
    docs = {(body[0].value.lineno, body[0].value.col_offset) for node in ast.walk(tree)
            if isinstance(body := getattr(node, 'body', None), list) and body and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)}
    lines = source.decode(tokenize.detect_encoding(io.BytesIO(source).readline)[0]).split('\n')  # a BOM, a cookie
    out, depth, doc, start = [], 0, False, None
    for t in tokenize.tokenize(io.BytesIO(source).readline):
        if t.type in SKIPPED or doc and t.type == tokenize.NEWLINE:  # the statement a docstring was ends with it
            doc = False
            continue
        name = tokenize.tok_name[t.type]
        if name in ('FSTRING_START', 'FSTRING_END'):  # Python 3.12+: its text taken whole from the source
            depth += 1 if name == 'FSTRING_START' else -1
            start = t.start if name == 'FSTRING_START' and depth == 1 else start
            if depth == 0:
                (r0, c0), (r1, c1) = start, t.end
                out.append('\n'.join([lines[r0 - 1][c0:]] + lines[r0:r1 - 1] + [lines[r1 - 1][:c1]])
                           if r1 > r0 else lines[r0 - 1][c0:c1])
        elif depth:  # inside an f-string: in its text already
            continue
        elif t.type == tokenize.STRING and t.start in docs or doc and t.type == tokenize.STRING:
            doc = True  # a docstring, of one string or of several side by side
        elif t.type in (tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE):
            out.append(name)  # a block opened or closed, a statement ended: not their spacing
        else:
            out.append(t.string)
    return out
