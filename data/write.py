"""Writing a prepared dataset: its token shards (data/shards.py's format), atomically, staged and swapped in only
once all are written, then meta.json last (details: data/README.md). Only the prepare scripts write; training reads."""
import contextlib
import fcntl
import filecmp
import glob
import os
import re

import numpy as np

from data.shards import HEADER_INTS, MAGIC, TOKEN_DTYPE, VERSION, shard_paths
from machinery.cli import UserError
from machinery.files import check_writable, read_json, write_file, write_json

SHARD_TOKENS = 100_000_000  # tokens per shard at most, by default
STAGING = "partial_"  # shards being written carry this prefix: the loader never reads them


def write_shard(path, tokens):
    """Writes tokens (any int array-like, values < 65536) as one shard, atomically."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 1 << 16):
        raise ValueError(f"token ids must fit in uint16 to be written to {path}")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:4] = MAGIC, VERSION, len(tokens), int(tokens.max()) + 1 if tokens.size else 0
    data = tokens.astype(TOKEN_DTYPE, copy=False)
    write_file(path, lambda f: (f.write(header.tobytes()), f.write(data.tobytes())), binary=True)


def shard_names(dataset_dir):
    """The file names of the shards in dataset_dir, train's then val's."""
    return [os.path.basename(p) for p in shard_paths(dataset_dir, "train") + shard_paths(dataset_dir, "val")]


def check_out_dir(out_dir, shard_tokens=SHARD_TOKENS):
    """Creates out_dir, or a UserError if it cannot take files: before any work, before anything is removed."""
    if not 1 <= shard_tokens < 2**31:  # the header counts a shard's tokens in an int32
        raise UserError(f"--shard_tokens must be between 1 and {2**31 - 1}, got {shard_tokens}.")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"--out_dir={out_dir} is a file, not a folder; choose another --out_dir.")
    check_writable(out_dir, create=True)


def check_alone(dataset_dir, dataset, own):
    """A UserError if dataset_dir holds another dataset, whose shards the loader would read with this one's (it reads
    every shard of its folder): a meta.json of another dataset, or shards whose names the regex `own` does not match
    (for a preparation that adds its shards beside those it wrote earlier)."""
    other = (read_json(os.path.join(dataset_dir, "meta.json")) or {}).get("dataset", dataset)
    foreign = [n for n in shard_names(dataset_dir) if not re.fullmatch(own, n)]
    if other != dataset or foreign:
        held = (f"the dataset {other}, whose shards" if other != dataset else
                ", ".join(foreign[:3]) + (", ..." if foreign[3:] else "") + ", shards that")
        raise UserError(f"{dataset_dir} holds {held} the loader would read with {dataset}'s; prepare {dataset} into a "
                        f"folder of its own (--out_dir).")


def check_replaceable(dataset_dir):
    """A UserError unless every file a preparation of dataset_dir would replace (shards, meta.json) is one a
    preparation wrote: there is a meta.json that counts its tokens (every prepare.py's does), in place or staged (a
    swap under way, or one a kill cut short)."""
    if any("train_tokens" in (read_json(os.path.join(dataset_dir, s + "meta.json")) or {}) for s in ("", STAGING)):
        return
    names = shard_names(dataset_dir)
    names += ["meta.json"] if os.path.exists(os.path.join(dataset_dir, "meta.json")) else []
    if names:
        raise UserError(f"{dataset_dir} holds {', '.join(names[:3])}{', ...' if len(names) > 3 else ''} but no "
                        f"meta.json of a prepared dataset, so preparing there would replace them; move them away, or "
                        f"choose another folder.")


def write_dataset(dataset_dir, train, val, meta, shard_tokens=SHARD_TOKENS):
    """A dataset as {split}_000.bin, ... of at most shard_tokens tokens, then meta.json last (it marks a complete
    dataset). The new files replace the earlier ones only once all are written: a failed write changes nothing, and
    the same data again leave every file as it was (a run reading them goes on). One preparation of a folder at a time
    (a second waits, then replaces the first's), never over files that none wrote: all along, the folder holds a
    meta.json or a staged one (check_replaceable)."""
    check_out_dir(dataset_dir, shard_tokens)
    check_replaceable(dataset_dir)
    if foreign := [n for n in shard_names(dataset_dir) if not re.fullmatch(r"(train|val)_(\d{3}|[1-9]\d{3,})\.bin", n)]:
        raise UserError(f"{dataset_dir} holds {', '.join(foreign[:2])}{', ...' * (len(foreign) > 2)}, shards of "
                        f"another preparation (a download's), which this one would delete; choose another folder.")
    path = lambda name: os.path.join(dataset_dir, name)
    with open(path(".prepare.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        for pattern in ("partial_train_*.bin", "partial_val_*.bin", ".partial_*.tmp*"):  # a killed preparation's
            for leftover in glob.glob(os.path.join(glob.escape(dataset_dir), pattern)):
                if os.path.isfile(leftover):
                    os.remove(leftover)
        parts = [(f"{split}_{k:03d}.bin", tokens[i:i + shard_tokens])
                 for split, tokens in (("train", train), ("val", val))
                 for k, i in enumerate(range(0, max(len(tokens), 1), shard_tokens))]
        names = [name for name, _ in parts] + ["meta.json"]  # meta.json last: it marks a complete dataset
        meta = {**meta, "train_tokens": len(train), "val_tokens": len(val)}
        try:
            for name, tokens in parts:
                write_shard(path(STAGING + name), tokens)
            write_json(path(STAGING + "meta.json"), meta)  # over a cut swap's own, which marked the folder till now
        except BaseException:
            for name, _ in parts:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path(STAGING + name))
            raise
        old = shard_names(dataset_dir)
        if sorted(names) == sorted(old + ["meta.json"] * os.path.exists(path("meta.json"))) and all(
                filecmp.cmp(path(STAGING + name), path(name), shallow=False) for name in names):
            for name in names:
                os.remove(path(STAGING + name))
            return meta
        with contextlib.suppress(FileNotFoundError):
            os.remove(path("meta.json"))  # until the new one is in, the dataset is not prepared
        for name in old:
            os.remove(path(name))  # no stale shard may outlive a re-prepare
        for name in names:
            os.replace(path(STAGING + name), path(name))
        return meta
