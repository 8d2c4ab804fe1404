"""Prepares shakespeare: the bundled Shakespeare corpus in GPT-2 BPE tokens.

    python data/shakespeare/prepare.py [--out_dir=DIR]

Writes train_000.bin, val_000.bin and meta.json into data/shakespeare/ by default, in a few seconds, with no
network (the corpus and the GPT-2 ranks are committed in data/). Validation holds out the same whole works as
shakespeare_char (the last four, 10.4%; see data/corpus.py). Each work is tokenised on its own, in parallel; the
works follow each other as in the file (no EOT between them: this is one continuous text, as in nanoGPT).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root, so `python data/.../prepare.py` works

import numpy as np

from configurator import run_cli
from data.corpus import prepare_main, read_shakespeare, split_works, work_starts
from data.shards import write_dataset
from data.tokenizer import GPT2Tokenizer


def encode_works(tok, text):
    """Tokenises text work by work on all cores. Cutting at work starts changes no token inside a work."""
    cuts = [0] + [s for s in work_starts(text) if s > 0] + [len(text)]
    works = [text[a:b] for a, b in zip(cuts, cuts[1:])]
    ids = tok.encode_batch(works)
    return np.fromiter((i for w in ids for i in w), dtype=np.uint16, count=sum(map(len, ids)))


def prepare(out_dir=HERE, shard_tokens=100_000_000):
    """Writes the dataset into out_dir and returns its meta dict."""
    tok = GPT2Tokenizer()
    train_text, val_text = split_works(read_shakespeare())
    train, val = encode_works(tok, train_text), encode_works(tok, val_text)
    meta = {**tok.meta(), "dataset": "shakespeare",
            "split": "val = the last four works, from THE HISTORY OF TROILUS AND CRESSIDA on"}
    return write_dataset(out_dir, train, val, meta, shard_tokens)


if __name__ == "__main__":
    run_cli(lambda argv: prepare_main(prepare, __doc__, HERE, argv))
