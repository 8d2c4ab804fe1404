"""Prepares shakespeare_char: the bundled Shakespeare corpus, one token per character, offline, in about a second.

    python data/shakespeare_char/prepare.py [--out_dir=DIR] [--shard_tokens=N]
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root, so `python data/.../prepare.py` works
from machinery.cli import quiet_interrupt  # first, once cli can be found: a Ctrl-C while numpy and torch import ends quietly
quiet_interrupt(__name__)

import numpy as np

from data.corpus import VAL_WORKS, prepare_main, read_shakespeare, split_works
from data.write import SHARD_TOKENS, check_out_dir, write_dataset
from data.tokenizer import CharTokenizer
from machinery.cli import run_cli


def prepare(out_dir=HERE, shard_tokens=SHARD_TOKENS):
    """Writes the dataset into out_dir and returns its meta dict."""
    check_out_dir(out_dir, shard_tokens)
    text = read_shakespeare()
    tok = CharTokenizer.from_text(text)  # vocabulary from the whole corpus, so val has no unknown characters
    encode = lambda t: np.fromiter(map(tok.stoi.__getitem__, t), dtype=np.uint16, count=len(t))
    train_text, val_text = split_works(text)
    meta = {**tok.meta(), "dataset": "shakespeare_char", "split": VAL_WORKS}
    return write_dataset(out_dir, encode(train_text), encode(val_text), meta, shard_tokens)


def main(argv):
    prepare_main(prepare, HERE, __doc__, argv)


if __name__ == "__main__":
    run_cli(main)
