"""Fetches FineWeb 10B already in GPT-2 tokens (the shards modded-nanogpt trains on): a GPU run starts in minutes,
with no tokenising.

    python data/fineweb10B/prepare.py                 # the validation shard + 8 train shards (0.9B tokens, ~1.8 GB)
    python data/fineweb10B/prepare.py --shards=103    # every train shard: 10.3B tokens (~20.6 GB)
    python train.py config/fineweb10B.py

The Hugging Face dataset kjj0/fineweb10B-gpt2 holds fineweb_val_000000.bin and fineweb_train_000001.bin ...
fineweb_train_000103.bin, 100M tokens each, in our shard format (data/shards.py: the 256-int32 header [20240520, 1,
n_tokens, ...] and uint16 tokens). For the validation shard and the first --shards train shards this script
  1. downloads the file with huggingface_hub into data/fineweb10B/cache/;
  2. checks its header and size (magic 20240520, version 1, file size = 1024 + 2·n_tokens): a corrupt file is deleted
     and refused in one sentence that names it (exit status 2), so a rerun fetches it again;
  3. moves it to the name the loader reads, val_000000.bin and train_000001.bin ... (the hub's number kept);
and last writes meta.json (gpt2 tokenizer, vocab 50257; token counts of the shards in the folder). A shard already in
place with a valid header is not downloaded again, so a rerun, or a rerun with a larger --shards, fetches only what
is missing.
"""
import argparse
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root, so `python data/.../prepare.py` works

from configurator import UserError, run_cli
from data.shards import ShardError, read_header, shard_paths, write_json
from data.tokenizer import GPT2Tokenizer

REPO_ID = "kjj0/fineweb10B-gpt2"
N_TRAIN_SHARDS = 103  # fineweb_train_000001.bin ... fineweb_train_000103.bin
DEFAULT_SHARDS = 8  # as modded-nanogpt's speedrun fetches


def shard_names(shards):
    """(name on the hub, name in out_dir) of the validation shard and the first `shards` train shards."""
    names = [("fineweb_val_000000.bin", "val_000000.bin")]
    return names + [(f"fineweb_train_{i:06d}.bin", f"train_{i:06d}.bin") for i in range(1, shards + 1)]


def download(filename, cache_dir):
    """Downloads one file of the dataset into cache_dir and returns its path. The only function here that touches
    the network; the tests replace it with a local stand-in."""
    from huggingface_hub import hf_hub_download
    try:
        return hf_hub_download(REPO_ID, filename, repo_type="dataset", local_dir=cache_dir)
    except Exception as e:  # no network, a missing file or repository, a full disk...
        raise UserError(f"could not download {filename} from the Hugging Face dataset {REPO_ID} "
                        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no details'}); check the "
                        f"network and disk space, then rerun (shards already in place are kept).")


def fetch(filename, path, cache_dir):
    """Downloads one shard, checks its header against its size, and moves it to path. Returns its token count."""
    got = download(filename, cache_dir)
    try:
        n_tokens = read_header(got)
    except ShardError as e:
        os.remove(got)  # so that a rerun downloads it again
        raise UserError(f"the downloaded {filename} is corrupt and was deleted: {str(e).split('; ')[0]}; rerun to "
                        f"download it again.") from None
    shutil.move(got, path)  # a rename when the cache is in out_dir; a shard's final name always means a whole file
    return n_tokens


def prepare(shards=DEFAULT_SHARDS, out_dir=HERE, cache_dir=None):
    """Fetches what is missing of the validation shard and the first `shards` train shards; returns the meta dict."""
    if not 1 <= shards <= N_TRAIN_SHARDS:
        raise UserError(f"--shards must be between 1 and {N_TRAIN_SHARDS} ({REPO_ID} has {N_TRAIN_SHARDS} train "
                        f"shards of 100M tokens), not {shards}.")
    cache_dir = cache_dir or os.path.join(out_dir, "cache")
    os.makedirs(out_dir, exist_ok=True)
    for filename, name in shard_names(shards):
        path = os.path.join(out_dir, name)
        if os.path.exists(path):
            try:
                read_header(path)
                continue  # fetched by an earlier run
            except ShardError as e:
                print(f"{e}; fetching it again", file=sys.stderr)
                os.remove(path)
        print(f"downloading {filename} from {REPO_ID}", file=sys.stderr)
        fetch(filename, path, cache_dir)
    train, val = shard_paths(out_dir, "train"), shard_paths(out_dir, "val")
    meta = {**GPT2Tokenizer().meta(), "dataset": "fineweb10B", "repo": REPO_ID, "train_shards": len(train),
            "train_tokens": sum(map(read_header, train)), "val_tokens": sum(map(read_header, val))}
    write_json(os.path.join(out_dir, "meta.json"), meta)  # last: a dataset with a meta.json is complete
    return meta


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=DEFAULT_SHARDS,
                        help=f"train shards of 100M tokens to fetch, 1-{N_TRAIN_SHARDS} (default {DEFAULT_SHARDS})")
    parser.add_argument("--out_dir", default=HERE, help="where the shards and meta.json go")
    parser.add_argument("--cache_dir", default=None, help="where files are downloaded first (default OUT_DIR/cache)")
    args = parser.parse_args(argv)
    meta = prepare(args.shards, args.out_dir, args.cache_dir)
    print(f"fineweb10B: {meta['train_shards']} train shards, {meta['train_tokens']:,} train + {meta['val_tokens']:,} "
          f"val tokens in {args.out_dir}")


if __name__ == "__main__":
    run_cli(main)
