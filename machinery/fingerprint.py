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


@functools.lru_cache(maxsize=None)
def code_hash(root=ROOT):
    """12 hex digits of a SHA-256 of the code of activations.py and model.py as they are now, their comments,
    docstrings and spacing aside (what a reader sees, not what runs), but not the indentation a statement starts at,
    which is syntax: train.py logs it, and a comparison refuses to reuse a run whose log names other code. Taken from
    the source's lines, not from a syntax tree's dump, which differs between Python versions."""
    digest = hashlib.sha256()
    for name in IDEAS:
        with open(os.path.join(root, name), 'rb') as f:
            source = f.read()
        lines = source.decode(tokenize.detect_encoding(io.BytesIO(source).readline)[0]).splitlines()  # a BOM, a cookie
        starts, new = set(), True  # the lines a statement starts on: their indentation is syntax, so it counts
        for t in tokenize.tokenize(io.BytesIO(source).readline):
            if t.type == tokenize.COMMENT and lines[t.start[0] - 1].endswith(t.string):  # to the end of its line
                lines[t.start[0] - 1] = lines[t.start[0] - 1][:-len(t.string)]
            if t.type in (tokenize.NEWLINE, tokenize.ENCODING):
                new = True
            elif new and t.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
                starts.add(t.start[0])
                new = False
        docs = {n for node in ast.walk(ast.parse(source)) if isinstance(body := getattr(node, 'body', None), list)
                and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str) for n in range(body[0].lineno, body[0].end_lineno + 1)}
        digest.update(''.join(f"{len(l) - len(l.lstrip())}:" * (i in starts) + ''.join(l.split())
                              for i, l in enumerate(lines, 1) if i not in docs).encode())
    return digest.hexdigest()[:12]
