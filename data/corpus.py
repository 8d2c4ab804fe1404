"""The bundled Shakespeare corpus, its train/val split by whole works, and both Shakespeare scripts' command line."""
import gzip
import os
import re
import time

from data.write import SHARD_TOKENS
from data.tokenizer import read_vendored
from machinery.cli import parse_args

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shakespeare.txt.gz")
CORPUS_SHA256 = "127def5f65170e14cc06e3899fcec39c223fd81b281537a0a8a168e853972790"  # of the .gz file
VAL_WORKS = "val = the last four works, from THE HISTORY OF TROILUS AND CRESSIDA on"  # meta.json's "split"


def read_shakespeare():
    """The corpus as one string, after checking the compressed file's hash."""
    return gzip.decompress(read_vendored(CORPUS, CORPUS_SHA256, "the bundled corpus")).decode("ascii")


def work_starts(text):
    """Offsets where each work begins: its title line, the last line before 'by William Shakespeare'."""
    return [m.start() for m in re.finditer(r"(?m)^.*\n+by William Shakespeare$", text)]


def split_works(text, val_fraction=0.1):
    """(train_text, val_text): val is every work from the work start nearest to (1 - val_fraction) of the text."""
    target = (1 - val_fraction) * len(text)
    cut = min((s for s in work_starts(text) if s > 0), key=lambda s: abs(s - target))
    return text[:cut], text[cut:]


def prepare_main(prepare, out_dir, doc, argv):
    """The command line of both Shakespeare prepare scripts (--out_dir, --shard_tokens); reports what was written."""
    name = os.path.basename(out_dir)  # the script's own folder: shakespeare or shakespeare_char
    defaults = dict(out_dir=out_dir, shard_tokens=SHARD_TOKENS)
    cfg, _ = parse_args(defaults, argv, prog=f"data/{name}/prepare.py", doc=doc)
    t0 = time.time()
    meta = prepare(cfg["out_dir"], cfg["shard_tokens"])
    dt = time.time() - t0
    print(f"{meta['dataset']}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} val {meta['tokenizer']} tokens "
          f"(vocab {meta['vocab_size']}), written to {cfg['out_dir']} in {dt:.1f}s "
          f"({(meta['train_tokens'] + meta['val_tokens']) / dt:,.0f} tokens/s)")
