"""Prepares your own text: any .txt files or folders of them, as GPT-2 BPE or character tokens.

    python data/text/prepare.py --input=notes.txt,books/ [--tokenizer=gpt2|char] [--name=text]
    python train.py config/shakespeare_char.py --dataset=text --out_dir=out-text   # a laptop-sized model

Each file is a document, in the order of their real paths (links resolved); validation is the last --val_fraction of
the token stream, so the held-out text is that of the files whose paths sort last.
"""
import os
import sys
import time

DATA = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(DATA))  # the repo root, so `python data/.../prepare.py` works
from machinery.cli import quiet_interrupt  # first, once cli can be found: a Ctrl-C while numpy and torch import ends quietly
quiet_interrupt(__name__)

import numpy as np

from data.write import SHARD_TOKENS, write_dataset
from data.tokenizer import CharTokenizer, EOT, GPT2Tokenizer
from machinery.cli import UserError, parse_args, read_text, run_cli, split_list

DEFAULTS = dict(
    input='',  # comma-separated .txt files and/or folders (required)
    tokenizer='gpt2',  # gpt2 | char
    name='text',  # the dataset's name: written to data/NAME/, trained with --dataset=NAME
    out_dir='',  # where the shards and meta.json go; '' = data/NAME
    val_fraction=0.1,  # the last fraction of the token stream, held out for validation
    shard_tokens=SHARD_TOKENS,  # tokens per shard at most
)


def find_files(inputs):
    """The .txt files named by inputs (files, or folders searched recursively) by their real paths, sorted, each once
    however it was named (a/b.txt, ./a/b.txt, a link): a file twice would put its text in train and val."""
    files = set()
    for item in map(os.path.expanduser, inputs):  # --input=~/notes.txt: no shell expands a ~ after '='
        if os.path.isdir(item):
            for root, _, names in os.walk(item):
                files.update(os.path.realpath(p) for n in names if n.endswith(".txt")  # not a dangling link: an
                             and os.path.isfile(p := os.path.join(root, n)))  # editor's lock (.#notes.txt)
        elif os.path.isfile(item):
            files.add(os.path.realpath(item))
        else:
            raise UserError(f"{item} is neither a file nor a folder; give --input existing .txt files or folders.")
    if not files:
        raise UserError(f"no .txt files found in {', '.join(inputs)}; give --input .txt files or folders holding them.")
    return sorted(files)


def prepare(inputs, tokenizer="gpt2", out_dir="", name="text", val_fraction=0.1, shard_tokens=SHARD_TOKENS):
    """Writes the dataset and returns its meta dict. inputs: a list of paths (or one comma-separated string)."""
    inputs = split_list(inputs) if isinstance(inputs, str) else inputs
    if not inputs:
        raise UserError("no input given; name your text with --input=FILE_OR_FOLDER[,...].")
    if tokenizer not in ("gpt2", "char"):
        raise UserError(f"unknown tokenizer {tokenizer!r}; use --tokenizer=gpt2 or --tokenizer=char.")
    if not 0 < val_fraction < 1:
        raise UserError(f"--val_fraction must be between 0 and 1, not {val_fraction}.")
    if not out_dir and (name in ("", ".", "..") or os.path.basename(name) != name):  # it must stay inside data/
        raise UserError(f"--name={name} is not a plain folder name; give one such as --name=mytext, or an --out_dir.")
    given = f"--out_dir={out_dir}" if out_dir else f"--name={name}"
    out_dir = out_dir or os.path.join(DATA, name)
    code = sorted(f for f in os.listdir(out_dir) if f.endswith(".py")) if os.path.isdir(out_dir) else []
    if code and not os.path.samefile(out_dir, os.path.dirname(os.path.abspath(__file__))):  # but data/text, its own
        raise UserError(f"{given} holds {code[0]}: it is a folder of code, or of the dataset its prepare.py writes; "
                        f"choose another {given.split('=')[0]}.")
    files = find_files(inputs)
    docs = [read_text(p, "input file", "notes.txt") for p in files]
    # its folder is checked and made once the tokens are ready (write_dataset): a mistake in the input leaves none
    if tokenizer == "gpt2":
        tok = GPT2Tokenizer()
        tokens = np.array([t for ids in tok.encode_batch(docs) for t in [EOT] + ids], dtype=np.uint16)
    else:
        text = "\n\n".join(docs)
        tok = CharTokenizer.from_text(text)
        if tok.vocab_size > 1 << 16:
            raise UserError(f"the text has {tok.vocab_size} distinct characters, more than 65536; use --tokenizer=gpt2.")
        tokens = np.fromiter(map(tok.stoi.__getitem__, text), dtype=np.uint16, count=len(text))
    n_val = max(2, int(round(len(tokens) * val_fraction)))  # a window is at least 2 tokens: an input and a target
    if len(tokens) - n_val < 2:
        raise UserError(f"the text is only {len(tokens)} token(s) long, too short to split into train and val (2 "
                        f"tokens each at least); give more text.")
    meta = {**tok.meta(), "dataset": os.path.basename(os.path.abspath(out_dir)), "files": len(files),
            "split": f"val = the last {val_fraction:g} of the token stream"}
    return write_dataset(out_dir, tokens[:-n_val], tokens[-n_val:], meta, shard_tokens)


def main(argv):
    cfg, _ = parse_args(DEFAULTS, argv, prog="data/text/prepare.py", doc=__doc__, notes=[__file__])
    t0 = time.time()
    meta = prepare(cfg.pop("input"), **cfg)  # --input is prepare's inputs; every other key its own
    print(f"{meta['dataset']}: {meta['files']} files, {meta['train_tokens']:,} train + {meta['val_tokens']:,} val "
          f"{cfg['tokenizer']} tokens, written in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    run_cli(main)
