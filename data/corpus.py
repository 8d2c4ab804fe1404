"""The bundled Shakespeare corpus (data/shakespeare.txt.gz) and its train/val split.

Validation holds out whole works: the tail of the file from the work start nearest to 90% of the characters (the
last four works, 10.4%), so a model is scored on plays it has never seen a line of (see data/README.md).
"""
import gzip
import os
import re
import time

from configurator import UserError, parse_args
from data.tokenizer import read_vendored

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shakespeare.txt.gz")
CORPUS_SHA256 = "127def5f65170e14cc06e3899fcec39c223fd81b281537a0a8a168e853972790"  # of the .gz file
VAL_WORKS = "val = the last four works, from THE HISTORY OF TROILUS AND CRESSIDA on"  # meta.json's "split"


def read_shakespeare(path=CORPUS):
    """The corpus as one string, after checking the compressed file's hash."""
    return gzip.decompress(read_vendored(path, CORPUS_SHA256, "the bundled corpus")).decode("ascii")


def work_starts(text):
    """Offsets where each work begins: its title line, the last line before 'by William Shakespeare'."""
    starts = []
    for m in re.finditer(r"(?m)^by William Shakespeare$", text):
        end_of_title = m.start()
        while end_of_title > 0 and text[end_of_title - 1] == "\n":
            end_of_title -= 1
        starts.append(text.rfind("\n", 0, end_of_title) + 1)
    return starts


def split_works(text, val_fraction=0.1):
    """(train_text, val_text): val is every work from the work start nearest to (1 - val_fraction) of the text."""
    starts = [s for s in work_starts(text) if s > 0]
    if not starts:
        raise UserError("the corpus has no 'by William Shakespeare' lines to split it into works.")
    target = (1 - val_fraction) * len(text)
    cut = min(starts, key=lambda s: abs(s - target))
    return text[:cut], text[cut:]


def prepare_main(prepare, defaults, doc, argv):
    """The command line of both Shakespeare prepare scripts; reports what was written."""
    name = os.path.basename(defaults["out_dir"])  # the script's own folder: shakespeare or shakespeare_char
    cfg, _ = parse_args(defaults, argv, prog=f"data/{name}/prepare.py", doc=doc)
    t0 = time.time()
    meta = prepare(cfg["out_dir"], cfg["shard_tokens"])
    dt = time.time() - t0
    print(f"{meta['dataset']}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} val {meta['tokenizer']} tokens "
          f"(vocab {meta['vocab_size']}), written to {cfg['out_dir']} in {dt:.1f}s "
          f"({(meta['train_tokens'] + meta['val_tokens']) / dt:,.0f} tokens/s)")
