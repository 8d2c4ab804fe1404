"""Prepares openwebtext: Skylion007/openwebtext from the Hugging Face hub, subset by subset, in GPT-2 tokens.

    python data/openwebtext/prepare.py                    # subsets 0 and 1 (~1.3 GB download, ~1.7 GB of shards)
    python data/openwebtext/prepare.py --subsets=0-4      # or --subsets=0,3,7 or --num_subsets=21 (all)

The hub holds the corpus as 21 archives subsets/urlsf_subset00.tar ... 20.tar (~630 MB each). Each is a tar of
.xz files; each .xz is an xz-compressed tar of .txt documents. For each chosen subset this script
  1. downloads the archive with huggingface_hub at a pinned revision (REVISION below), into data/openwebtext/cache/;
  2. streams the documents out of the nested archives (nothing is unpacked to disk), collapses runs of 3+ newlines
     and strips each document, as the hub's own loading script does;
  3. tokenises them on all cores (tiktoken encode_ordinary_batch) and writes every document as [EOT] + its tokens;
  4. sends a fixed 0.5% of documents, chosen by a hash of their name, to validation, and cuts the rest into shards
     of 1e8 tokens: train_s00_000.bin, train_s00_001.bin, ..., val_s00_000.bin (s00 = subset 0);
  5. records the subset as done (done_s00.json) and updates meta.json; then deletes the archive (--keep_archives
     to keep it).
It is resumable: a subset already done is skipped; an interrupted subset is redone from its start, and as every
choice above is deterministic its shards come out byte-identical. Each shard is written under a temporary name and
renamed when complete, and a subset's shards keep a partial_ prefix (invisible to the loader) until the whole subset
is done.
"""
import argparse
import glob
import hashlib
import json
import lzma
import os
import queue
import re
import sys
import tarfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root, so `python data/.../prepare.py` works

import numpy as np
from tqdm import tqdm

from configurator import UserError, run_cli
from data.shards import check_shard_tokens, read_header, write_json, write_shard
from data.tokenizer import EOT, GPT2Tokenizer

REPO_ID = "Skylion007/openwebtext"
# A commit of the dataset's main branch ("Fix bibtex") whose tree has subsets/urlsf_subset00.tar ... 20.tar.
# The branch has since moved to parquet files, so an unpinned download would not find the archives.
REVISION = "f3808c30e817981b845ec549c43e82bb467d8144"
N_SUBSETS = 21
SHARD_TOKENS = 100_000_000
VAL_FRACTION = 0.005
DOCS_PER_BATCH = 1024  # documents handed to the tokenizer at once


def subset_filename(subset):
    return f"subsets/urlsf_subset{subset:02d}.tar"


def download(subset, cache_dir):
    """Downloads one subset archive (or finds it already downloaded) and returns its local path.
    The only function here that touches the network; the tests replace it with a local file."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import RemoteEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
    filename = subset_filename(subset)
    try:
        return hf_hub_download(REPO_ID, filename, repo_type="dataset", revision=REVISION, local_dir=cache_dir)
    except RemoteEntryNotFoundError:
        raise UserError(f"the hub has no {filename} in dataset {REPO_ID} at revision {REVISION}: its layout is not "
                        f"the subsets/urlsf_subsetNN.tar this script expects; check the dataset's files on the hub "
                        f"and update REVISION in data/openwebtext/prepare.py.")
    except RevisionNotFoundError:
        raise UserError(f"dataset {REPO_ID} has no revision {REVISION} on the hub; pick a commit that has "
                        f"subsets/urlsf_subsetNN.tar and set REVISION in data/openwebtext/prepare.py.")
    except RepositoryNotFoundError:
        raise UserError(f"the hub has no dataset {REPO_ID} (or it needs a login); check its name on huggingface.co.")
    except Exception as e:  # no network, a timeout, a full disk...
        raise UserError(f"could not download {filename} from {REPO_ID} ({type(e).__name__}: {str(e).splitlines()[0]}); "
                        f"check the network connection and disk space, then rerun (finished subsets are kept).")


def parse_subsets(subsets, num_subsets):
    """'0-2' -> [0, 1, 2]; '0,3,7' -> [0, 3, 7]; or the first num_subsets subsets (default 2)."""
    if subsets is not None and num_subsets is not None:
        raise UserError("give either --subsets or --num_subsets, not both.")
    if subsets is None:
        num_subsets = 2 if num_subsets is None else num_subsets
        if not 1 <= num_subsets <= N_SUBSETS:
            raise UserError(f"--num_subsets must be between 1 and {N_SUBSETS}, not {num_subsets}.")
        return list(range(num_subsets))
    chosen = []
    for part in str(subsets).split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise UserError(f"cannot read the subset {part!r}; write subsets as numbers and ranges, e.g. --subsets=0-2,5.")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        for s in range(lo, hi + 1):
            if s >= N_SUBSETS:
                raise UserError(f"there is no subset {s}: {REPO_ID} has subsets 0-{N_SUBSETS - 1} "
                                f"(urlsf_subset00.tar ... urlsf_subset{N_SUBSETS - 1}.tar).")
            if s not in chosen:
                chosen.append(s)
    if not chosen:
        raise UserError(f"no subset chosen in {subsets!r}; e.g. --subsets=0-2.")
    return chosen


def clean(text):
    """As the hub's loading script: at most one blank line in a row, no surrounding whitespace."""
    return re.sub("\n\n\n+", "\n\n", text).strip()


def is_val(key, val_fraction):
    """Whether a document belongs to validation: a fixed function of its name, so reruns choose the same ones."""
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "little")
    return h < val_fraction * 2.0 ** 64


def xz_members(outer, archive_path):
    """The .xz members of an opened subset archive, or a clear error if there are none."""
    members = [m for m in outer.getmembers() if m.isfile()]
    xz = [m for m in members if m.name.endswith(".xz")]
    if not xz:
        names = ", ".join(m.name for m in members[:3]) or "nothing"
        raise UserError(f"{archive_path} is not laid out as {REPO_ID} subsets are (a tar of .xz files): "
                        f"it holds no .xz files (it holds {names}).")
    return xz


def open_archive(archive_path):
    try:
        return tarfile.open(archive_path, "r:")  # the outer tar is not compressed: members are read in place
    except (OSError, tarfile.TarError) as e:
        raise UserError(f"{archive_path} is not a tar file ({e}); delete it and rerun to download it again.")


def document_batches(archive_path, docs_per_batch=DOCS_PER_BATCH):
    """Yields (keys, texts, compressed_bytes_read) in archive order: tar -> .xz -> tar -> .txt, all streamed."""
    with open_archive(archive_path) as outer:
        keys, texts, nbytes = [], [], 0
        for member in xz_members(outer, archive_path):
            try:
                with outer.extractfile(member) as raw, lzma.open(raw) as xz, tarfile.open(fileobj=xz, mode="r|") as inner:
                    for doc in inner:
                        if not doc.isfile():
                            continue
                        if not doc.name.endswith(".txt"):
                            raise UserError(f"{archive_path} is not laid out as {REPO_ID} subsets are: "
                                            f"{member.name} holds {doc.name}, where .txt documents were expected.")
                        text = clean(inner.extractfile(doc).read().decode("utf-8", errors="replace"))
                        if text:
                            keys.append(f"{member.name}/{doc.name}")
                            texts.append(text)
                        if len(texts) == docs_per_batch:
                            yield keys, texts, nbytes
                            keys, texts, nbytes = [], [], 0
            except (lzma.LZMAError, tarfile.TarError, EOFError) as e:
                raise UserError(f"{archive_path} is not laid out as {REPO_ID} subsets are: {member.name} is not an "
                                f"xz-compressed tar ({e}); delete the archive and rerun to download it again.")
            nbytes += member.size
        yield keys, texts, nbytes


def prefetch(iterator, depth=8):
    """Runs iterator in a background thread, so xz decompression overlaps tokenization (both release the GIL).
    If the consumer stops early (an error, Ctrl-C), the thread stops at its next hand-over."""
    q, stop, done = queue.Queue(depth), threading.Event(), object()

    def put(item):
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def produce():
        try:
            for item in iterator:
                if not put(item):
                    return
            put(done)
        except BaseException as e:  # handed to the consumer, raised there
            put(e)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        while (item := q.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


class ShardWriter:
    """Cuts one token stream into shards of exactly shard_tokens tokens (the last one shorter), named
    {prefix}_000.bin, {prefix}_001.bin, ..."""

    def __init__(self, prefix, shard_tokens):
        self.prefix, self.buf, self.n, self.paths, self.tokens = prefix, np.empty(shard_tokens, np.uint16), 0, [], 0

    def add(self, tokens):
        while len(tokens):
            take = min(len(self.buf) - self.n, len(tokens))
            self.buf[self.n:self.n + take] = tokens[:take]
            self.n, tokens, self.tokens = self.n + take, tokens[take:], self.tokens + take
            if self.n == len(self.buf):
                self.flush()

    def flush(self):
        self.paths.append(f"{self.prefix}_{len(self.paths):03d}.bin")
        write_shard(self.paths[-1], self.buf[:self.n])
        self.n = 0

    def close(self):
        if self.n or not self.paths:
            self.flush()
        return [os.path.basename(p) for p in self.paths]


STAGING = "partial_"  # a subset's shards carry this prefix until the subset is done: the loader never reads them


def subset_files(out_dir, subset):
    tag = f"s{subset:02d}"
    patterns = [f"{prefix}{split}_{tag}_*" for prefix in ("", STAGING) for split in ("train", "val")]
    return [p for pattern in patterns for p in glob.glob(os.path.join(glob.escape(out_dir), pattern))]


def is_done(out_dir, subset, shard_tokens=SHARD_TOKENS, val_fraction=VAL_FRACTION):
    """A subset is done when its record exists, was made with the same settings, and every shard it lists is whole."""
    record = os.path.join(out_dir, f"done_s{subset:02d}.json")
    if not os.path.isfile(record):
        return False
    try:
        with open(record) as f:
            info = json.load(f)
        for name in info["train_shards"] + info["val_shards"]:
            read_header(os.path.join(out_dir, name))
    except (ValueError, KeyError, UserError):
        return False
    return (info.get("revision"), info.get("shard_tokens"), info.get("val_fraction")) == (REVISION, shard_tokens, val_fraction)


def prepare_subset(subset, archive_path, out_dir, shard_tokens=SHARD_TOKENS, val_fraction=VAL_FRACTION,
                   num_threads=None, docs_per_batch=DOCS_PER_BATCH):
    """Tokenises one downloaded subset archive into its shards and writes its done record; returns the record."""
    for path in subset_files(out_dir, subset):  # the leftovers of an interrupted run are redone from the start
        os.remove(path)
    tok = GPT2Tokenizer()
    tag = f"s{subset:02d}"
    train = ShardWriter(os.path.join(out_dir, f"{STAGING}train_{tag}"), shard_tokens)
    val = ShardWriter(os.path.join(out_dir, f"{STAGING}val_{tag}"), shard_tokens)
    n_docs = n_val_docs = 0
    with open_archive(archive_path) as outer:
        total = sum(m.size for m in xz_members(outer, archive_path))
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"tokenizing subset {subset:02d}") as bar:
        for keys, texts, nbytes in prefetch(document_batches(archive_path, docs_per_batch)):
            for key, ids in zip(keys, tok.encode_batch(texts, num_threads)):
                tokens = np.array([EOT] + ids, dtype=np.uint16)
                if is_val(key, val_fraction):
                    val.add(tokens)
                    n_val_docs += 1
                else:
                    train.add(tokens)
            n_docs += len(keys)
            bar.update(nbytes)
            bar.set_postfix(docs=n_docs, tokens=train.tokens + val.tokens)
    # the subset is complete: give its shards their final names (train_sNN_*, read by the loader), then the record
    shards = {}
    for split, writer in (("train", train), ("val", val)):
        shards[split] = [name[len(STAGING):] for name in writer.close()]
        for name in shards[split]:
            os.replace(os.path.join(out_dir, STAGING + name), os.path.join(out_dir, name))
    record = {"subset": subset, "file": subset_filename(subset), "repo": REPO_ID, "revision": REVISION,
              "shard_tokens": shard_tokens, "val_fraction": val_fraction, "documents": n_docs, "val_documents": n_val_docs, "train_tokens": train.tokens,
              "val_tokens": val.tokens, "train_shards": shards["train"], "val_shards": shards["val"]}
    write_json(os.path.join(out_dir, f"done_{tag}.json"), record)
    return record


def write_meta(out_dir):
    """meta.json describes every finished subset in out_dir (the loader reads all shards in the folder)."""
    records = []
    for path in sorted(glob.glob(os.path.join(glob.escape(out_dir), "done_s*.json"))):
        with open(path) as f:
            records.append(json.load(f))
    meta = {**GPT2Tokenizer().meta(), "dataset": "openwebtext", "repo": REPO_ID, "revision": REVISION,
            "subsets": [r["subset"] for r in records], "train_tokens": sum(r["train_tokens"] for r in records),
            "val_tokens": sum(r["val_tokens"] for r in records),
            "val_fraction_of_documents": sorted({r["val_fraction"] for r in records})}
    write_json(os.path.join(out_dir, "meta.json"), meta)
    return meta


def prepare(subsets=None, num_subsets=None, out_dir=HERE, cache_dir=None, shard_tokens=SHARD_TOKENS,
            val_fraction=VAL_FRACTION, keep_archives=False, num_threads=None, archive_dir=None):
    """Downloads and tokenises the chosen subsets that are not done yet; returns the meta dict.
    archive_dir: take urlsf_subsetNN.tar from this folder instead of downloading (archives fetched another way)."""
    chosen = parse_subsets(subsets, num_subsets)
    check_shard_tokens(shard_tokens)
    cache_dir = cache_dir or os.path.join(out_dir, "cache")
    os.makedirs(out_dir, exist_ok=True)
    for subset in chosen:
        if is_done(out_dir, subset, shard_tokens, val_fraction):
            print(f"subset {subset:02d} is already done in {out_dir}; skipping it")
            continue
        if archive_dir:
            archive = os.path.join(archive_dir, os.path.basename(subset_filename(subset)))
            if not os.path.isfile(archive):
                raise UserError(f"there is no {archive}; put the subset archives in --archive_dir or leave it out to download them.")
        else:
            archive = download(subset, cache_dir)
        record = prepare_subset(subset, archive, out_dir, shard_tokens, val_fraction, num_threads)
        write_meta(out_dir)
        print(f"subset {subset:02d}: {record['documents']:,} documents, {record['train_tokens']:,} train + "
              f"{record['val_tokens']:,} val tokens")
        if not keep_archives and os.path.abspath(archive).startswith(os.path.abspath(cache_dir) + os.sep):
            os.remove(archive)  # only our own download, never an archive the user pointed us to
    return write_meta(out_dir)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subsets", default=None, help="which subsets (0-20), e.g. 0-2 or 0,3,7")
    parser.add_argument("--num_subsets", type=int, default=None, help="the first N subsets (default 2)")
    parser.add_argument("--out_dir", default=HERE, help="where to write the shards and meta.json")
    parser.add_argument("--cache_dir", default=None, help="where archives are downloaded (default OUT_DIR/cache)")
    parser.add_argument("--shard_tokens", type=int, default=SHARD_TOKENS, help="tokens per train shard")
    parser.add_argument("--val_fraction", type=float, default=VAL_FRACTION, help="fraction of documents for val")
    parser.add_argument("--keep_archives", action="store_true", help="keep each archive after its shards are done")
    parser.add_argument("--num_threads", type=int, default=None, help="tokenizer threads (default: all cores)")
    parser.add_argument("--archive_dir", default=None, help="read urlsf_subsetNN.tar from here instead of downloading")
    args = parser.parse_args(argv)
    t0 = time.time()
    meta = prepare(args.subsets, args.num_subsets, args.out_dir, args.cache_dir, args.shard_tokens,
                   args.val_fraction, args.keep_archives, args.num_threads, args.archive_dir)
    print(f"openwebtext: subsets {meta['subsets']}, {meta['train_tokens']:,} train + {meta['val_tokens']:,} val "
          f"tokens in {args.out_dir} ({time.time() - t0:.0f}s)")


if __name__ == "__main__":
    run_cli(main)
