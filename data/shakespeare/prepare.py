"""Prepares shakespeare: the bundled Shakespeare corpus in GPT-2 BPE tokens, offline, in a few seconds.

    python data/shakespeare/prepare.py [--out_dir=DIR] [--shard_tokens=N]
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root, so `python data/.../prepare.py` works
from machinery.cli import quiet_interrupt  # first, once cli can be found: a Ctrl-C while numpy and torch import ends quietly
quiet_interrupt(__name__)

import numpy as np

from data.corpus import VAL_WORKS, prepare_main, read_shakespeare, split_works, work_starts
from data.write import SHARD_TOKENS, check_out_dir, write_dataset
from data.tokenizer import GPT2Tokenizer
from machinery.cli import run_cli


def encode_works(tok, text):
    """Tokenises text work by work on all cores. Cutting at work starts changes no token inside a work."""
    cuts = [0] + [s for s in work_starts(text) if s > 0] + [len(text)]
    ids = tok.encode_batch([text[a:b] for a, b in zip(cuts, cuts[1:])])
    return np.fromiter((i for w in ids for i in w), dtype=np.uint16, count=sum(map(len, ids)))


def prepare(out_dir=HERE, shard_tokens=SHARD_TOKENS):
    """Writes the dataset into out_dir and returns its meta dict."""
    check_out_dir(out_dir, shard_tokens)
    tok = GPT2Tokenizer()
    train_text, val_text = split_works(read_shakespeare())
    meta = {**tok.meta(), "dataset": "shakespeare", "split": VAL_WORKS}
    return write_dataset(out_dir, encode_works(tok, train_text), encode_works(tok, val_text), meta, shard_tokens)


def main(argv):
    prepare_main(prepare, HERE, __doc__, argv)


if __name__ == "__main__":
    run_cli(main)
