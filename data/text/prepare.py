"""Prepares your own text: any .txt files or folders of them, as GPT-2 BPE or character tokens.

    python data/text/prepare.py --input=notes.txt,books/ [--tokenizer=gpt2|char] [--name=text]
    python train.py --dataset=text ...

Each file is a document. Folders are searched recursively for *.txt; files are taken in sorted path order.
- gpt2: every document is written as [EOT] + its tokens, as for OpenWebText.
- char: documents are joined with a blank line; the vocabulary is every character of the text (saved in meta.json,
  so sampling can decode it).
Validation is the last --val_fraction (default 10%) of the token stream; put the text you want held out last.
Shards and meta.json go to data/<name>/ (data/text/ by default), or to --out_dir.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.dirname(HERE)
sys.path.insert(0, os.path.dirname(DATA))  # the repo root, so `python data/.../prepare.py` works

import numpy as np

from configurator import UserError, run_cli
from data.shards import write_dataset
from data.tokenizer import EOT, CharTokenizer, GPT2Tokenizer


def find_files(inputs):
    """The .txt files named by inputs (files, or folders searched recursively), sorted, without duplicates."""
    files = set()
    for item in inputs:
        if os.path.isdir(item):
            for root, _, names in os.walk(item):
                files.update(os.path.join(root, n) for n in names if n.endswith(".txt"))
        elif os.path.isfile(item):
            files.add(item)
        else:
            raise UserError(f"{item} is neither a file nor a folder; give --input existing .txt files or folders.")
    if not files:
        raise UserError(f"no .txt files found in {', '.join(inputs)}; give --input .txt files or folders holding them.")
    return sorted(files)


def read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text (byte {e.start}); convert it to UTF-8 or leave it out.")


def prepare(inputs, tokenizer="gpt2", out_dir=None, name="text", val_fraction=0.1, shard_tokens=100_000_000):
    """Writes the dataset and returns its meta dict. inputs: a list of paths (or one comma-separated string)."""
    if isinstance(inputs, str):
        inputs = [p for p in inputs.split(",") if p]
    if not 0 < val_fraction < 1:
        raise UserError(f"--val_fraction must be between 0 and 1, not {val_fraction}.")
    out_dir = out_dir or os.path.join(DATA, name)
    files = find_files(inputs)
    docs = [read_text(p) for p in files]
    if tokenizer == "gpt2":
        tok = GPT2Tokenizer()
        tokens = np.array([t for ids in tok.encode_batch(docs) for t in [EOT] + ids], dtype=np.uint16)
    elif tokenizer == "char":
        text = "\n\n".join(docs)
        tok = CharTokenizer.from_text(text)
        if tok.vocab_size > 1 << 16:
            raise UserError(f"the text has {tok.vocab_size} distinct characters, more than 65536; use --tokenizer=gpt2.")
        tokens = np.fromiter(map(tok.stoi.__getitem__, text), dtype=np.uint16, count=len(text))
    else:
        raise UserError(f"unknown tokenizer {tokenizer!r}; use --tokenizer=gpt2 or --tokenizer=char.")
    n_val = max(1, int(round(len(tokens) * val_fraction)))
    if len(tokens) - n_val < 2:
        raise UserError(f"the text is only {len(tokens)} tokens long, too short to split into train and val.")
    meta = {**tok.meta(), "dataset": os.path.basename(os.path.normpath(out_dir)), "files": len(files),
            "split": f"val = the last {val_fraction:g} of the token stream"}
    return write_dataset(out_dir, tokens[:-n_val], tokens[-n_val:], meta, shard_tokens)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="comma-separated .txt files and/or folders")
    parser.add_argument("--tokenizer", default="gpt2", choices=["gpt2", "char"])
    parser.add_argument("--name", default="text", help="dataset name: written to data/NAME/ (train with --dataset=NAME)")
    parser.add_argument("--out_dir", default=None, help="where to write the shards and meta.json (default data/NAME)")
    parser.add_argument("--val_fraction", type=float, default=0.1, help="the last fraction of tokens held out")
    parser.add_argument("--shard_tokens", type=int, default=100_000_000, help="tokens per shard at most")
    args = parser.parse_args(argv)
    t0 = time.time()
    meta = prepare(args.input, args.tokenizer, args.out_dir, args.name, args.val_fraction, args.shard_tokens)
    print(f"{meta['dataset']}: {meta['files']} files, {meta['train_tokens']:,} train + {meta['val_tokens']:,} val "
          f"{args.tokenizer} tokens, written in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    run_cli(main)
