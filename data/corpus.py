"""The bundled Shakespeare corpus (data/shakespeare.txt.gz, see data/README.md) and its train/val split.

The split holds out whole works: validation is the tail of the file from the start of the work nearest to 90% of
the characters. With the bundled file that is the last four works, from "THE HISTORY OF TROILUS AND CRESSIDA" to
"THE WINTER'S TALE" (10.4% of the characters). Why whole works rather than a cut mid-play: a model is then scored on
plays it has never seen a line of, which is the honest question, and the split is the same for the char-level and
the BPE dataset.
"""
import argparse
import gzip
import hashlib
import os
import re
import time

from configurator import UserError

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shakespeare.txt.gz")
CORPUS_SHA256 = "127def5f65170e14cc06e3899fcec39c223fd81b281537a0a8a168e853972790"  # of the .gz file


def read_shakespeare(path=CORPUS):
    """The corpus as one string, after checking the compressed file's hash."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        raise UserError(f"the bundled corpus {path} is missing; restore it with `git checkout data/shakespeare.txt.gz`.")
    if hashlib.sha256(raw).hexdigest() != CORPUS_SHA256:
        raise UserError(f"the bundled corpus {path} does not have the expected sha256 {CORPUS_SHA256}; "
                        f"restore it with `git checkout data/shakespeare.txt.gz`.")
    return gzip.decompress(raw).decode("ascii")


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


def prepare_main(prepare, doc, default_out_dir, argv=None):
    """The command line of both Shakespeare prepare scripts: --out_dir, --shard_tokens; reports what was written."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out_dir", default=default_out_dir, help="where to write the shards and meta.json")
    parser.add_argument("--shard_tokens", type=int, default=100_000_000, help="tokens per shard at most")
    args = parser.parse_args(argv)
    t0 = time.time()
    meta = prepare(args.out_dir, args.shard_tokens)
    dt = time.time() - t0
    n = meta["train_tokens"] + meta["val_tokens"]
    print(f"{meta['dataset']}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} val {meta['tokenizer']} tokens "
          f"(vocab {meta['vocab_size']}), written to {args.out_dir} in {dt:.1f}s ({n / dt:,.0f} tokens/s)")
