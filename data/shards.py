"""Token shards (modded-nanogpt's format): a 256 x int32 header [20240520, 1, n_tokens, 1 + largest id or 0, 0...],
then n_tokens uint16 tokens, little-endian, checked when opened (details: data/README.md). data/write.py writes them.
"""
import glob
import os

import numpy as np

from machinery.cli import UserError

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPE = np.dtype("<u2")


class ShardError(UserError):
    """A file that should be a token shard is damaged or is not one."""


def shard_info(path):
    """Validates a shard's header against its file size; returns (token count, id_bound or 0 if not recorded)."""
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
    n_tokens = shard_info(path)[0] if n_tokens is None else n_tokens
    return np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(n_tokens,))


def shard_paths(dataset_dir, split):
    """The shards of one split ('train' or 'val'), in name order."""
    return sorted(glob.glob(os.path.join(glob.escape(dataset_dir), f"{split}_*.bin")))
