"""Prepares openwebtext: Skylion007/openwebtext from the Hugging Face hub, subset by subset, in GPT-2 tokens.

    python data/openwebtext/prepare.py                    # subsets 0 and 1 (~1.3 GB download, ~1.7 GB of shards)
    python data/openwebtext/prepare.py --subsets=0-4      # or --subsets=0,3,7 or --num_subsets=21 (all)

Each subset (~630 MB) is downloaded at a pinned REVISION and streamed into shards; a rerun skips finished subsets.
"""
import glob
import hashlib
import lzma
import os
import re
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo root, so `python data/.../prepare.py` works
from machinery.cli import quiet_interrupt  # first, once cli can be found: a Ctrl-C while numpy and torch import ends quietly
quiet_interrupt(__name__)

import numpy as np
from tqdm import tqdm

from data.shards import shard_info
from data.write import SHARD_TOKENS, STAGING, check_alone, check_out_dir, write_shard
from data.tokenizer import EOT, GPT2Tokenizer
from machinery.cli import UserError, parse_args, run_cli
from machinery.files import read_json, write_json

REPO_ID = "Skylion007/openwebtext"
# a commit ("Fix bibtex") with subsets/urlsf_subset00.tar ... 20.tar: main has since moved to parquet files
REVISION = "f3808c30e817981b845ec549c43e82bb467d8144"
N_SUBSETS = 21
VAL_FRACTION = 0.005
DOCS_PER_BATCH = 1024  # documents handed to the tokenizer at once

DEFAULTS = dict(
    subsets='',  # which subsets (0-20), e.g. 0-2 or 0,3,7; '' = the first --num_subsets
    num_subsets=0,  # the first N subsets; 0 = 2 (unless --subsets is given)
    out_dir=HERE,  # where the shards and meta.json go
    cache_dir='',  # where archives are downloaded; '' = OUT_DIR/cache
    shard_tokens=SHARD_TOKENS,  # tokens per train shard (the last one of a subset is shorter)
    val_fraction=VAL_FRACTION,  # fraction of documents held out for validation
    keep_archives=False,  # keep each archive after its subset is done
    num_threads=0,  # tokenizer threads; 0 = one per core
    archive_dir='',  # read urlsf_subsetNN.tar from this folder instead of downloading ('' = download)
)


def subset_filename(subset):
    return f"subsets/urlsf_subset{subset:02d}.tar"


def download(subset, cache_dir):
    """Downloads one subset archive (or finds it downloaded); returns its path. The only network access."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import RemoteEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
    filename = subset_filename(subset)
    try:
        return hf_hub_download(REPO_ID, filename, repo_type="dataset", revision=REVISION, local_dir=cache_dir)
    except (RemoteEntryNotFoundError, RevisionNotFoundError):
        raise UserError(f"the hub has no {filename} in dataset {REPO_ID} at revision {REVISION}; pick a commit that "
                        f"has subsets/urlsf_subsetNN.tar and set REVISION in data/openwebtext/prepare.py.")
    except RepositoryNotFoundError:
        raise UserError(f"the hub has no dataset {REPO_ID} (or it needs a login); check its name on huggingface.co.")
    except Exception as e:  # no network, a timeout, a full disk...
        why = (str(e).splitlines() or ["no details"])[0]
        raise UserError(f"could not download {filename} from {REPO_ID} ({type(e).__name__}: {why}); "
                        f"check the network connection and disk space, then rerun (finished subsets are kept).")


def parse_subsets(subsets, num_subsets):
    """'0-2' -> [0, 1, 2]; '0,3,7' -> [0, 3, 7]; or the first num_subsets subsets (0, None: 2)."""
    if subsets and num_subsets:
        raise UserError("give either --subsets or --num_subsets, not both.")
    if not subsets:
        num_subsets = num_subsets or 2
        if not 1 <= num_subsets <= N_SUBSETS:
            raise UserError(f"--num_subsets must be between 1 and {N_SUBSETS}, not {num_subsets}.")
        return list(range(num_subsets))
    chosen = []
    for part in str(subsets).split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise UserError(f"cannot read the subset {part!r}; write subsets as numbers and ranges, e.g. --subsets=0-2,5.")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if lo > hi:
            raise UserError(f"cannot read the subset range {part!r}; a range goes from low to high, e.g. 3-5.")
        if hi >= N_SUBSETS:
            raise UserError(f"there is no subset {hi}: {REPO_ID} has subsets 0-{N_SUBSETS - 1} "
                            f"(urlsf_subset00.tar ... urlsf_subset{N_SUBSETS - 1}.tar).")
        chosen += range(lo, hi + 1)
    return list(dict.fromkeys(chosen))  # in the order given, without repeats


def clean(text):
    """As the hub's loading script: at most one blank line in a row, no surrounding whitespace."""
    return re.sub("\n\n\n+", "\n\n", text).strip()


def is_val(key, val_fraction):
    """Whether a document belongs to validation: a fixed function of its name, so reruns choose the same ones."""
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "little")
    return h < val_fraction * 2.0 ** 64


def open_archive(archive_path):
    """(the opened subset archive, its .xz members), or a UserError if it is not laid out as the hub's subsets."""
    try:
        outer = tarfile.open(archive_path, "r:")  # the outer tar is not compressed: members are read in place
    except (OSError, tarfile.TarError) as e:
        raise UserError(f"{archive_path} is not a tar file ({e}); replace it (delete a downloaded one to download it "
                        f"again).")
    members = [m for m in outer.getmembers() if m.isfile()]
    if not any(m.name.endswith(".xz") for m in members):
        outer.close()
        raise UserError(f"{archive_path} is not laid out as {REPO_ID} subsets are (a tar of .xz files): it holds no "
                        f".xz files (it holds {', '.join(m.name for m in members[:3]) or 'nothing'}).")
    return outer, [m for m in members if m.name.endswith(".xz")]


def document_batches(archive_path, outer, xz_members):
    """Yields (keys, texts, compressed_bytes_read) in archive order: tar -> .xz -> tar -> .txt, all streamed, from
    an archive open_archive opened (closed when done)."""
    with outer:
        keys, texts, nbytes = [], [], 0
        for member in xz_members:
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
                        if len(texts) == DOCS_PER_BATCH:
                            yield keys, texts, nbytes
                            keys, texts, nbytes = [], [], 0
            except (lzma.LZMAError, tarfile.TarError, EOFError) as e:
                raise UserError(f"{archive_path} is not laid out as {REPO_ID} subsets are: {member.name} is not an "
                                f"xz-compressed tar ({e}); replace the archive (delete a downloaded one to download "
                                f"it again).")
            nbytes += member.size
        yield keys, texts, nbytes


def prefetch(iterator):
    """Yields iterator's items while a thread reads the next one: xz decompression overlaps tokenization."""
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(next, iterator, None)
        while (item := future.result()) is not None:
            future = pool.submit(next, iterator, None)
            yield item


class ShardWriter:
    """Cuts a token stream into STAGING + NAME_000.bin, ... of shard_tokens tokens; close() returns their names."""

    def __init__(self, out_dir, name, shard_tokens):
        self.out_dir, self.name, self.names = out_dir, name, []
        self.buf, self.n, self.tokens = np.empty(shard_tokens, np.uint16), 0, 0  # n: tokens in buf, tokens: in all

    def add(self, tokens):
        while len(tokens):
            take = min(len(self.buf) - self.n, len(tokens))
            self.buf[self.n:self.n + take] = tokens[:take]
            self.n, tokens, self.tokens = self.n + take, tokens[take:], self.tokens + take
            if self.n == len(self.buf):
                self.flush()

    def flush(self):
        self.names.append(f"{self.name}_{len(self.names):03d}.bin")
        write_shard(os.path.join(self.out_dir, STAGING + self.names[-1]), self.buf[:self.n])
        self.n = 0

    def close(self):
        if self.n or not self.names:
            self.flush()
        return self.names


def is_done(out_dir, subset, shard_tokens, val_fraction):
    """A subset is done when its record exists, was made with the same settings, and every shard it lists is whole."""
    info = read_json(os.path.join(out_dir, f"done_s{subset:02d}.json"))
    try:
        for name in info["train_shards"] + info["val_shards"]:
            shard_info(os.path.join(out_dir, name))
    except (TypeError, KeyError, UserError):  # TypeError: no record, or a damaged one
        return False
    settings = (info.get("revision"), info.get("shard_tokens"), info.get("val_fraction"))
    return settings == (REVISION, shard_tokens, val_fraction)


def prepare_subset(subset, archive_path, out_dir, shard_tokens=SHARD_TOKENS, val_fraction=VAL_FRACTION, num_threads=None):
    """Tokenises one downloaded subset archive into its shards and writes its done record; returns the record."""
    tag = f"s{subset:02d}"
    outer, xz_members = open_archive(archive_path)  # a bad archive changes nothing
    for path in glob.glob(os.path.join(glob.escape(out_dir), f"{STAGING}*_{tag}_*")):
        os.remove(path)  # an interrupted run's leftovers: the subset is redone from its start
    tok = GPT2Tokenizer()
    train, val = (ShardWriter(out_dir, f"{split}_{tag}", shard_tokens) for split in ("train", "val"))
    n_docs = n_val_docs = 0
    total = sum(m.size for m in xz_members)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"tokenizing subset {subset:02d}") as bar:
        for keys, texts, nbytes in prefetch(document_batches(archive_path, outer, xz_members)):
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
    # the subset is complete: its earlier record goes (first, so that no record lists missing shards), then its
    # earlier shards; the new shards get their final names (train_sNN_*, read by the loader), then the new record
    for pattern in (f"done_{tag}.json", f"train_{tag}_*", f"val_{tag}_*"):
        for path in glob.glob(os.path.join(glob.escape(out_dir), pattern)):
            os.remove(path)
    for name in train.close() + val.close():
        os.replace(os.path.join(out_dir, STAGING + name), os.path.join(out_dir, name))
    record = {"subset": subset, "file": subset_filename(subset), "repo": REPO_ID, "revision": REVISION,
              "shard_tokens": shard_tokens, "val_fraction": val_fraction, "documents": n_docs,
              "val_documents": n_val_docs, "train_tokens": train.tokens, "val_tokens": val.tokens,
              "train_shards": train.names, "val_shards": val.names}
    write_json(os.path.join(out_dir, f"done_{tag}.json"), record)
    return record


def write_meta(out_dir):
    """meta.json describes every finished subset in out_dir (the loader reads all shards in the folder)."""
    records = [r for r in map(read_json, sorted(glob.glob(os.path.join(glob.escape(out_dir), "done_s*.json")))) if r]
    meta = {**GPT2Tokenizer().meta(), "dataset": "openwebtext", "repo": REPO_ID, "revision": REVISION,
            "subsets": [r["subset"] for r in records], "train_tokens": sum(r["train_tokens"] for r in records),
            "val_tokens": sum(r["val_tokens"] for r in records),
            "val_fraction_of_documents": sorted({r["val_fraction"] for r in records})}
    write_json(os.path.join(out_dir, "meta.json"), meta)
    return meta


def prepare(subsets="", num_subsets=0, out_dir=HERE, cache_dir="", shard_tokens=SHARD_TOKENS,
            val_fraction=VAL_FRACTION, keep_archives=False, num_threads=0, archive_dir=""):
    """Downloads (or takes from archive_dir) and tokenises the chosen subsets not done yet; returns the meta dict."""
    chosen = parse_subsets(subsets, num_subsets)
    if not 0 < val_fraction < 1:
        raise UserError(f"--val_fraction must be between 0 and 1, not {val_fraction}.")
    if num_threads < 0:
        raise UserError(f"--num_threads must be at least 0 (0: one per core), not {num_threads}.")
    check_out_dir(out_dir, shard_tokens)
    check_alone(out_dir, "openwebtext", r"(train|val)_s\d\d_\d{3,}\.bin")
    todo = [subset for subset in chosen if not is_done(out_dir, subset, shard_tokens, val_fraction)]
    for subset in chosen:
        if subset not in todo:
            print(f"subset {subset:02d} is already done in {out_dir}; skipping it")
    local = lambda subset: os.path.join(archive_dir, os.path.basename(subset_filename(subset)))
    missing = [local(subset) for subset in todo if archive_dir and not os.path.isfile(local(subset))]
    if missing:  # said before minutes of tokenizing the first subset
        raise UserError(f"there is no {missing[0]}; put the subset archives in --archive_dir or leave it out to "
                        f"download them.")
    for subset in todo:
        archive = local(subset) if archive_dir else download(subset, cache_dir or os.path.join(out_dir, "cache"))
        record = prepare_subset(subset, archive, out_dir, shard_tokens, val_fraction, num_threads)
        write_meta(out_dir)
        print(f"subset {subset:02d}: {record['documents']:,} documents, {record['train_tokens']:,} train + "
              f"{record['val_tokens']:,} val tokens")
        if not (keep_archives or archive_dir):
            os.remove(archive)  # only our own download, never an archive the user pointed us to
    return write_meta(out_dir)


def main(argv):
    cfg, _ = parse_args(DEFAULTS, argv, prog="data/openwebtext/prepare.py", doc=__doc__, notes=[__file__])
    t0 = time.time()
    meta = prepare(**cfg)
    print(f"openwebtext: subsets {meta['subsets']}, {meta['train_tokens']:,} train + {meta['val_tokens']:,} val "
          f"tokens in {cfg['out_dir']} ({time.time() - t0:.0f}s)")


if __name__ == "__main__":
    run_cli(main)
