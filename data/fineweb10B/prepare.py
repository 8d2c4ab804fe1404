"""Fetches the FineWeb 10B shards not yet in place, already in GPT-2 tokens (modded-nanogpt's): no tokenising.

    python data/fineweb10B/prepare.py                 # the validation shard + 8 train shards (0.9B tokens, ~1.8 GB)
    python data/fineweb10B/prepare.py --shards=103    # every train shard: 10.3B tokens (~20.6 GB)
    python train.py config/fineweb10B.py
"""
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root, so `python data/.../prepare.py` works
from machinery.cli import quiet_interrupt  # first, once cli can be found: a Ctrl-C while numpy and torch import ends quietly
quiet_interrupt(__name__)

from data.shards import ShardError, shard_info, shard_paths
from data.write import check_alone, check_out_dir
from data.tokenizer import GPT2Tokenizer
from machinery.cli import UserError, parse_args, run_cli
from machinery.files import write_file, write_json

REPO_ID = "kjj0/fineweb10B-gpt2"
N_TRAIN_SHARDS = 103  # fineweb_train_000001.bin ... fineweb_train_000103.bin

DEFAULTS = dict(
    shards=8,  # train shards of 100M tokens to fetch, 1-103 (8: as modded-nanogpt's speedrun)
    out_dir=HERE,  # where the shards and meta.json go
    cache_dir='',  # where files are downloaded first; '' = OUT_DIR/cache
)


def download(filename, cache_dir):
    """Downloads one file into cache_dir; returns its path. The only network access (the tests replace it)."""
    from huggingface_hub import hf_hub_download
    try:
        return hf_hub_download(REPO_ID, filename, repo_type="dataset", local_dir=cache_dir)
    except Exception as e:  # no network, a missing file or repository, a full disk...
        raise UserError(f"could not download {filename} from the Hugging Face dataset {REPO_ID} "
                        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no details'}); check the "
                        f"network and disk space, then rerun (shards already in place are kept).")


def fetch(filename, path, cache_dir):
    """Downloads one shard, checks its header against its size, and moves it to path."""
    got = download(filename, cache_dir)
    try:
        shard_info(got)
    except ShardError as e:
        os.remove(got)  # so that a rerun downloads it again
        raise UserError(f"the downloaded {filename} is corrupt and was deleted: {str(e).split('; ')[0]}; rerun to "
                        f"download it again.") from None
    meta = os.path.join(os.path.dirname(path), "meta.json")
    if os.path.exists(meta):  # till it is written anew, no run reads shards it does not count
        os.remove(meta)
    try:
        os.replace(got, path)  # a rename when the cache is on out_dir's filesystem
    except OSError:  # another filesystem: copied atomically, so a shard's final name always means a whole file
        with open(got, "rb") as src:
            write_file(path, lambda f: shutil.copyfileobj(src, f), binary=True)
        os.remove(got)


def prepare(shards=DEFAULTS["shards"], out_dir=HERE, cache_dir=""):
    """Fetches what is missing of the validation shard and the first `shards` train shards; returns the meta dict."""
    if not 1 <= shards <= N_TRAIN_SHARDS:
        raise UserError(f"--shards must be between 1 and {N_TRAIN_SHARDS} ({REPO_ID} has {N_TRAIN_SHARDS} train "
                        f"shards of 100M tokens), not {shards}.")
    check_out_dir(out_dir)
    check_alone(out_dir, "fineweb10B", r"(train|val)_\d{6}\.bin")
    for i in range(shards + 1):  # the validation shard 000000, then train shards 000001 ...
        name = f"{'train' if i else 'val'}_{i:06d}.bin"
        filename, path = f"fineweb_{name}", os.path.join(out_dir, name)
        if os.path.exists(path):
            try:
                shard_info(path)
                continue  # fetched by an earlier run
            except ShardError as e:
                print(f"{e}; fetching it again", file=sys.stderr)
        print(f"downloading {filename} from {REPO_ID}", file=sys.stderr)
        fetch(filename, path, cache_dir or os.path.join(out_dir, "cache"))
    train, val = shard_paths(out_dir, "train"), shard_paths(out_dir, "val")
    meta = {**GPT2Tokenizer().meta(), "dataset": "fineweb10B", "repo": REPO_ID, "train_shards": len(train),
            "train_tokens": sum(shard_info(p)[0] for p in train), "val_tokens": sum(shard_info(p)[0] for p in val)}
    write_json(os.path.join(out_dir, "meta.json"), meta)  # last: a dataset with a meta.json is complete
    return meta


def main(argv):
    cfg, _ = parse_args(DEFAULTS, argv, prog="data/fineweb10B/prepare.py", doc=__doc__, notes=[__file__])
    meta = prepare(**cfg)
    print(f"fineweb10B: {meta['train_shards']} train shards, {meta['train_tokens']:,} train + {meta['val_tokens']:,} "
          f"val tokens in {cfg['out_dir']}")


if __name__ == "__main__":
    run_cli(main)
