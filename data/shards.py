"""The token shard format, as in modded-nanogpt: a 256 x int32 little-endian header [20240520, 1, n_tokens, 0, ...]
followed by n_tokens little-endian uint16 tokens. Our shards also record 1 + their largest token id in header[3]
(a spare field that other tools, modded-nanogpt's FineWeb shards among them, leave at 0 = not recorded), so the
loader can check a shard against its dataset's vocabulary without reading its tokens.

Why a header: a shard cut short by a full disk or an interrupted copy has the wrong size for the count it announces,
and a file that is not a shard at all has the wrong magic; both are caught when the shard is opened, with one
sentence naming the file, instead of training quietly on garbage.

Shards are written to '<name>.tmp' and renamed when complete, so a file with a shard's name is always whole.
"""
import glob
import json
import os

import numpy as np

from configurator import UserError

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPE = np.dtype("<u2")


class ShardError(UserError):
    """A file that should be a token shard is damaged or is not one."""


def write_shard(path, tokens):
    """Writes tokens (any int array-like, values < 65536) as one shard, atomically."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 1 << 16):
        raise ValueError(f"token ids must fit in uint16 to be written to {path}")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:4] = MAGIC, VERSION, len(tokens), int(tokens.max()) + 1 if tokens.size else 0
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(TOKEN_DTYPE, copy=False).tobytes())
    os.replace(tmp, path)


def read_header(path):
    """Validates a shard's header against its file size; returns its token count."""
    return shard_info(path)[0]


def shard_info(path):
    """Validates a shard's header against its file size; returns (token count, 1 + largest token id or 0 if the
    header does not record it)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
    except OSError as e:
        raise ShardError(f"cannot read token shard {path} ({e.strerror}); prepare the dataset again.")
    fix = "delete it and run the dataset's prepare.py again."
    if len(raw) < HEADER_BYTES:
        raise ShardError(f"{path} is not a token shard: it is {size} bytes, shorter than the {HEADER_BYTES}-byte header; {fix}")
    header = np.frombuffer(raw, dtype="<i4")
    if header[0] != MAGIC:
        raise ShardError(f"{path} is not a token shard: its magic number is {header[0]}, not {MAGIC}; {fix}")
    if header[1] != VERSION:
        raise ShardError(f"{path} is a token shard of version {header[1]}, but only version {VERSION} is supported; {fix}")
    n_tokens = int(header[2])
    expected = HEADER_BYTES + 2 * n_tokens
    if n_tokens < 0 or size != expected:
        raise ShardError(f"{path} is truncated or damaged: its header announces {n_tokens} tokens ({expected} bytes) "
                         f"but the file has {size} bytes; {fix}")
    return n_tokens, max(int(header[3]), 0)


def check_vocab(path, id_bound, vocab_size):
    """A ShardError naming the shard if it holds a token id >= vocab_size (id_bound = 1 + its largest id)."""
    if id_bound > vocab_size:
        raise ShardError(f"{path} holds token id {id_bound - 1}, outside its dataset's vocabulary of {vocab_size} "
                         f"(meta.json); the shards and meta.json come from different preparations, so prepare the "
                         f"dataset again.")


def open_shard(path, n_tokens=None):
    """The shard's tokens as a read-only uint16 memmap (validated unless the caller already knows n_tokens)."""
    if n_tokens is None:
        n_tokens = read_header(path)
    return np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(n_tokens,))


def read_shard(path):
    """The shard's tokens as an in-memory uint16 array."""
    return np.array(open_shard(path))


def shard_paths(dataset_dir, split):
    """The complete shards of one split ('train' or 'val'), in name order (temporary .tmp files are ignored)."""
    return sorted(glob.glob(os.path.join(glob.escape(dataset_dir), f"{split}_*.bin")))


def write_split(dataset_dir, split, tokens, shard_tokens=100_000_000):
    """Writes one split as {split}_000.bin, {split}_001.bin, ... of at most shard_tokens tokens each."""
    paths = []
    for k, start in enumerate(range(0, max(len(tokens), 1), shard_tokens)):
        paths.append(os.path.join(dataset_dir, f"{split}_{k:03d}.bin"))
        write_shard(paths[-1], tokens[start:start + shard_tokens])
    return paths


def write_json(path, obj):
    """Writes a JSON file atomically (meta.json is read by training and sampling)."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False)
        f.write("\n")
    os.replace(path + ".tmp", path)


def write_dataset(dataset_dir, train, val, meta, shard_tokens=100_000_000):
    """A whole in-memory dataset: replaces any earlier shards, writes both splits, then meta.json (with the token
    counts added) last, so a dataset with a meta.json is complete. Returns the meta dict."""
    check_shard_tokens(shard_tokens)  # before anything earlier is removed
    try:
        os.makedirs(dataset_dir, exist_ok=True)
        clear_split_files(dataset_dir)
        write_split(dataset_dir, "train", train, shard_tokens)
        write_split(dataset_dir, "val", val, shard_tokens)
        meta = {**meta, "train_tokens": len(train), "val_tokens": len(val)}
        write_json(os.path.join(dataset_dir, "meta.json"), meta)
    except OSError as e:  # a mistyped or read-only --out_dir, a full disk
        raise UserError(f"cannot write the dataset to {dataset_dir} ({e.strerror or e}); "
                        "choose another --out_dir.") from None
    return meta


def check_shard_tokens(shard_tokens):
    if shard_tokens < 1:
        raise UserError(f"--shard_tokens must be at least 1, got {shard_tokens}.")


def clear_split_files(dataset_dir):
    """Removes the shards (and leftover .tmp files) of an earlier preparation, so no stale shard outlives a re-prepare."""
    for path in shard_paths(dataset_dir, "train") + shard_paths(dataset_dir, "val"):
        os.remove(path)
    for path in glob.glob(os.path.join(glob.escape(dataset_dir), "*.tmp")):
        os.remove(path)
