"""Prepares shakespeare_char: the bundled Shakespeare corpus, one token per character.

    python data/shakespeare_char/prepare.py [--out_dir=DIR]

Writes train_000.bin, val_000.bin and meta.json (the 84-character vocabulary, which sampling needs to decode) into
data/shakespeare_char/ by default. Runs in about a second, with no network: the corpus is committed in
data/shakespeare.txt.gz. Validation holds out whole works (the last four, 10.4%; see data/corpus.py).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root, so `python data/.../prepare.py` works

import numpy as np

from configurator import run_cli
from data.corpus import prepare_main, read_shakespeare, split_works
from data.shards import write_dataset
from data.tokenizer import CharTokenizer


def prepare(out_dir=HERE, shard_tokens=100_000_000):
    """Writes the dataset into out_dir and returns its meta dict."""
    text = read_shakespeare()
    train_text, val_text = split_works(text)
    tok = CharTokenizer.from_text(text)  # vocabulary from the whole corpus, so val has no unknown characters
    train = np.fromiter(map(tok.stoi.__getitem__, train_text), dtype=np.uint16, count=len(train_text))
    val = np.fromiter(map(tok.stoi.__getitem__, val_text), dtype=np.uint16, count=len(val_text))
    meta = {**tok.meta(), "dataset": "shakespeare_char",
            "split": "val = the last four works, from THE HISTORY OF TROILUS AND CRESSIDA on"}
    return write_dataset(out_dir, train, val, meta, shard_tokens)


if __name__ == "__main__":
    run_cli(lambda argv: prepare_main(prepare, __doc__, HERE, argv))
