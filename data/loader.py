"""The one data loader used by training: random windows of token shards, reproducible and resumable (data/README.md).

    loader = DataLoader("shakespeare_char", block_size=256, batch_size=64, seed=1337)
    x, y = loader.next_batch()          # (B, T) int64 CPU tensors, y is x shifted by one token
    evals = loader.val_batches(20)      # the same 20 batches for every run on this dataset
"""
import difflib
import fcntl
import hashlib
import os
import subprocess
import sys

import numpy as np
import torch

from data.shards import check_vocab, open_shard, shard_info, shard_paths
from machinery.cli import RunStopped, UserError
from machinery.files import read_json

DATA_DIR = os.path.dirname(os.path.abspath(__file__))  # the repo's data/, where prepare scripts write by default
TRAIN_STREAM, VAL_STREAM = 0, 1  # keep the training and validation generators apart
VAL_SEED = 20240520  # validation windows do not depend on the run's seed

PREPARE_COMMANDS = {
    "shakespeare_char": "python data/shakespeare_char/prepare.py",
    "shakespeare": "python data/shakespeare/prepare.py",
    "openwebtext": "python data/openwebtext/prepare.py",
    "fineweb10B": "python data/fineweb10B/prepare.py --shards=8",
}


BUNDLED = ("shakespeare_char", "shakespeare")  # built from the corpus in the repo in seconds, so prepared on demand


class DatasetNotPrepared(UserError):
    """The dataset's shards or meta.json are not there."""


def open_loader(dataset, block_size, batch_size, seed, data_dir="data", rank=0, world_size=1, prepare=True):
    """A DataLoader, preparing a bundled dataset (BUNDLED) first where it is not prepared yet and prepare is set (of
    several processes, one prepares while the others wait: train.py's rank 0), never over shards it did not write; any
    other dataset that is not prepared is refused, with the command that prepares it."""
    try:
        return DataLoader(dataset, block_size, batch_size, seed, rank, world_size, data_dir)
    except DatasetNotPrepared:
        if dataset not in BUNDLED or not prepare:
            raise
    out = os.path.join(data_dir, dataset)
    if not os.path.isdir(data_dir):  # a typo, or a command run outside the repository: no folder is made for it
        raise UserError(f"--data_dir={data_dir} is not a folder here; give the folder that holds the datasets (the "
                        f"repository's data/, the default when run from its root).")
    try:
        lock = open(os.path.join(data_dir, f".{dataset}.lock"), "a")
    except OSError as e:
        raise UserError(f"could not prepare {dataset} into {out} ({e.strerror or e}); point --data_dir at a folder you "
                        f"can write to.") from None
    with lock:  # two commands started at once: one prepares, the other waits for it, then reads what it prepared
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return DataLoader(dataset, block_size, batch_size, seed, rank, world_size, data_dir)
        except DatasetNotPrepared:
            pass
        print(f"preparing the bundled dataset {dataset} into {out} (once, seconds)", file=sys.stderr)
        p = subprocess.run([sys.executable, os.path.join(DATA_DIR, dataset, "prepare.py"), f"--out_dir={out}"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:  # its one sentence (e.g. files there no preparation wrote, kept), or a crash's last line
        why = (p.stderr.strip().splitlines() or ["no reason given"])[-1].split(": ", 1)[-1].rstrip(".")
        hint = "" if p.returncode in (2, 3) else "; point --data_dir at another folder"
        raise UserError(f"could not prepare {dataset} into {out}: {why}{hint}.")
    return DataLoader(dataset, block_size, batch_size, seed, rank, world_size, data_dir)


class _Split:
    """The shards of one split and where the windows of length T+1 can start in each."""

    def __init__(self, paths, window, vocab_size):
        self.paths, self.window, self.vocab_size = paths, window, vocab_size
        info = [shard_info(p) for p in paths]  # validates every header
        self.files = [_file_id(p) for p in paths]  # a shard replaced while a run reads it is caught as it is drawn
        self.n_tokens = np.array([n for n, _ in info], dtype=np.int64)
        # an id outside the vocabulary would fail deep in the model: checked here, or when first read if not recorded
        for path, (_, id_bound) in zip(paths, info):
            check_vocab(path, id_bound, vocab_size)
        self.unchecked = {s for s, (_, id_bound) in enumerate(info) if id_bound == 0}
        n_windows = np.maximum(self.n_tokens - window + 1, 0)  # starts 0 .. n - window
        self.first_window = np.concatenate([[0], np.cumsum(n_windows)[:-1]])
        self.total_windows = int(n_windows.sum())

    def sample(self, rng, n):
        """n windows as a (n, T+1) uint16 array, uniform over every window of every shard."""
        u = rng.integers(0, self.total_windows, size=n)
        shard = np.searchsorted(self.first_window, u, side="right") - 1
        start = u - self.first_window[shard]
        out = np.empty((n, self.window), dtype=np.uint16)
        for s in np.unique(shard):
            if _file_id(self.paths[s]) != self.files[s]:  # its windows and hashes would be another dataset's
                raise RunStopped(f"{self.paths[s]} was replaced while this command read it (its dataset was prepared "
                                 f"again), so its batches are no longer this run's; prepare the data it trained on "
                                 f"and resume, or start the run again.")
            tokens = open_shard(self.paths[s], int(self.n_tokens[s]))
            if s in self.unchecked:
                check_vocab(self.paths[s], int(tokens.max()) + 1, self.vocab_size)  # a drawn shard has tokens
                self.unchecked.discard(s)
            for i in np.flatnonzero(shard == s):
                out[i] = tokens[start[i]:start[i] + self.window]
            del tokens  # a memmap kept open would grow the process' resident memory with every page it touched
        return out


def _file_id(path):
    """Which file path names now: another size or modification time is another file (inode numbers are not stable on
    every network filesystem)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _to_xy(windows):
    t = torch.from_numpy(windows.astype(np.int64))
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


class DataLoader:
    def __init__(self, dataset, block_size, batch_size, seed, rank=0, world_size=1, data_dir="data"):
        self.dataset, self.block_size, self.batch_size, self.seed = dataset, block_size, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.dir = os.path.join(data_dir, dataset)
        meta_path = os.path.join(self.dir, "meta.json")
        train_paths, val_paths = shard_paths(self.dir, "train"), shard_paths(self.dir, "val")
        if not (os.path.isfile(meta_path) and train_paths and val_paths):
            command = PREPARE_COMMANDS.get(dataset, f"python data/text/prepare.py --input=YOUR_FILES --name={dataset}")
            if os.path.abspath(self.dir) != os.path.join(DATA_DIR, dataset):
                command += f" --out_dir={self.dir}"
            try:  # a typo of a known dataset or of a folder in data_dir: 'shakespear'
                known = {*PREPARE_COMMANDS, *(d for d in os.listdir(data_dir)
                                              if os.path.isdir(os.path.join(data_dir, d)))}
            except OSError:  # no such folder, or not one to read
                known = set(PREPARE_COMMANDS)
            close = difflib.get_close_matches(dataset, sorted(known - {dataset}), n=1, cutoff=0.8)
            raise DatasetNotPrepared(f"dataset {dataset} is not prepared in {self.dir}; run `{command}` first"
                                     + (f" (or did you mean --dataset={close[0]}?)." if close else "."))
        self.meta = read_json(meta_path) or {}  # checked: a positive int vocab_size sizes the model
        vocab_size = self.meta.get("vocab_size")
        if type(vocab_size) is not int or vocab_size < 1:
            raise UserError(f"{meta_path} is damaged (it must be a JSON object with an integer vocab_size); delete it "
                            f"and the shards beside it, then prepare the dataset again.")
        self.train = _Split(train_paths, block_size + 1, vocab_size)
        self.val = _Split(val_paths, block_size + 1, vocab_size)
        for name, split in (("train", self.train), ("val", self.val)):
            if split.total_windows == 0:
                raise UserError(f"no {name} shard of dataset {dataset} holds block_size + 1 = {block_size + 1} tokens; "
                                f"use a smaller block_size, or prepare it from more text.")
        self.step = 0  # micro-batches this rank has returned
        self.batch_hash = self.prev_hash = hashlib.sha256().hexdigest()  # the chain now, and before the last batch
        self._val_cache = []

    def _windows(self, k):
        """Micro-batch number k of the shared training stream, as a (batch_size, block_size + 1) array."""
        return self.train.sample(np.random.default_rng([TRAIN_STREAM, self.seed, k]), self.batch_size)

    def next_batch(self):
        """The next training micro-batch of this rank: (x, y) int64 tensors of shape (batch_size, block_size)."""
        windows = self._windows(self.rank + self.world_size * self.step)  # its number in the shared stream
        self.step += 1
        self.prev_hash, self.batch_hash = self.batch_hash, chain(self.batch_hash, windows)
        return _to_xy(windows)

    def val_batches(self, n_batches):
        """The first n_batches validation batches: the same for every run and rank (batch_size, block_size matter)."""
        while len(self._val_cache) < n_batches:
            rng = np.random.default_rng([VAL_STREAM, VAL_SEED, len(self._val_cache)])
            self._val_cache.append(_to_xy(self.val.sample(rng, self.batch_size)))
        return self._val_cache[:n_batches]

    def val_hash(self, n_batches):
        """A SHA-256 of the first n_batches validation batches: the same hash, the same validation windows (train.py
        logs it; a comparison tells by it a run trained before its dataset was prepared again)."""
        return hashlib.sha256(b''.join(X.numpy().tobytes() + Y.numpy().tobytes()
                                       for X, Y in self.val_batches(n_batches))).hexdigest()

    def state_dict(self):
        return {"dataset": self.dataset, "seed": self.seed, "batch_size": self.batch_size,
                "block_size": self.block_size, "rank": self.rank, "world_size": self.world_size, "step": self.step,
                "batch_hash": self.batch_hash, "prev_hash": self.prev_hash}

    def load_state_dict(self, state, tokens):
        """Continues the stream exactly where the saved loader stopped, re-split if the world size changed, once its
        position is proven, since an exact resume is promised: the run's token count (tokens) says how many
        micro-batches all its processes drew, and the saved rank's last one, drawn again, closes its hash chain."""
        for key in ("dataset", "seed", "batch_size", "block_size"):
            if state[key] != getattr(self, key):
                raise ValueError(f"its data stream was saved with {key}={state[key]!r} but this run has "
                                 f"{key}={getattr(self, key)!r}")
        consumed = state["step"] * state["world_size"]
        if consumed * self.batch_size * self.block_size != tokens:
            raise ValueError(f"its data stream's position ({state['step']} micro-batches of {state['world_size']} "
                             f"process(es)) is not where its {tokens} tokens end")
        if consumed % self.world_size:
            raise UserError(f"cannot resume the data stream: {consumed} micro-batches were consumed, which does not "
                            f"split evenly over {self.world_size} processes; resume with a number of processes that "
                            f"divides {consumed}, such as {state['world_size']}.")
        # the last batch drawn again must close the saved chain: another stream, or a dataset prepared again, does not
        # (one batch, not the whole stream, so that a resume costs no more than a step)
        last = state["rank"] + state["world_size"] * (state["step"] - 1)  # its number in the shared stream
        if state["step"] and chain(state["prev_hash"], self._windows(last)) != state["batch_hash"]:
            # its meta.json matched (train.py checks it first), so the same settings read other tokens: the data's fault
            raise UserError(f"{self.dataset}'s shards are not those this run trained on (its last batch, drawn again, "
                            f"differs: prepared again, from other text or with another --shard_tokens?); resume with "
                            f"the data it trained on, or train a new run in another out_dir.")
        self.step = consumed // self.world_size
        self.batch_hash, self.prev_hash = state["batch_hash"], state["prev_hash"]


def chain(batch_hash, windows):
    """A hash chain over the raw windows: equal hashes mean the same batches in the same order."""
    return hashlib.sha256(bytes.fromhex(batch_hash) + windows.tobytes()).hexdigest()
