"""Tests of data/: offline tokenizers, the shard format, the OpenWebText pipeline on a synthetic archive with the
hub's nesting, the loader's determinism, and the Shakespeare prepare scripts run as a user runs them."""
import importlib.util
import io
import json
import lzma
import os
import random
import shutil
import socket
import subprocess
import sys
import tarfile
import types

import numpy as np
import pytest
import tiktoken

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from test_hostile import call as run  # noqa: E402  (a script's main, in this process: exit status, stderr)
from data import tokenizer as tokmod, write as data_write
from data.corpus import read_shakespeare
from data.loader import DataLoader, DatasetNotPrepared
from data.shards import HEADER_BYTES, ShardError, open_shard, shard_info, shard_paths
from data.write import write_dataset, write_shard
from data.tokenizer import CharTokenizer, EOT, get_tokenizer
from machinery.cli import RunStopped, UserError

EOT_TEXT = "<|endoftext|>"


def load_script(relpath):
    """Imports data/<name>/prepare.py as a module (the dataset folders are not packages)."""
    spec = importlib.util.spec_from_file_location(relpath.replace("/", "_")[:-3], os.path.join(REPO, relpath))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection (or to use tiktoken's downloading get_encoding) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(tiktoken, "get_encoding", refuse)
    tokmod.gpt2_encoding.cache_clear()  # build it here, under the ban
    yield
    tokmod.gpt2_encoding.cache_clear()


# ---------------------------------------------------------------------------------------------- tokenizers

def test_gpt2_tokenizer_works_offline_and_round_trips_the_corpus(no_network):
    tok = get_tokenizer({"tokenizer": "gpt2"})
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(" the\n") == [262, 198]
    assert tok.vocab_size == 50257 and tok.meta()["eot"] == EOT == 50256
    text = read_shakespeare()
    paragraph = text[text.index("To be, or not to be"):][:1500]
    ids = tok.encode(paragraph)
    assert 250 < len(ids) < 600 and max(ids) < EOT
    assert tok.decode(ids) == paragraph
    # special-token text inside a document is plain text: only prepare scripts put EOT ids in a dataset
    assert EOT not in tok.encode(f"a{EOT_TEXT}b") and tok.decode(tok.encode(EOT_TEXT)) == EOT_TEXT


def test_gpt2_batches_take_a_thread_per_core_this_process_may_use(monkeypatch):
    """A Slurm job or taskset of 2 cores on a 64-core machine: 2 tokenizer threads, not 64 beside the others' work;
    num_threads (openwebtext's --num_threads) when given."""
    tok = get_tokenizer({"tokenizer": "gpt2"})
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    asked = []
    monkeypatch.setattr(tok, "enc", types.SimpleNamespace(
        encode_ordinary_batch=lambda texts, num_threads: asked.append(num_threads) or [[] for _ in texts]))
    tok.encode_batch(["a", "b"])
    tok.encode_batch(["a", "b"], num_threads=3)
    monkeypatch.delattr(os, "sched_getaffinity")  # macOS: the machine's cores
    tok.encode_batch(["a"])
    assert asked == [2, 3, 64]


def test_gpt2_rank_file_is_hash_checked(tmp_path):
    bad = tmp_path / "gpt2.tiktoken"
    lines = open(tokmod.GPT2_RANKS, "rb").read().splitlines()
    lines[100], lines[101] = lines[101].split()[0] + b" 100", lines[100].split()[0] + b" 101"  # swap two ranks
    bad.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(UserError) as err:
        tokmod.gpt2_encoding(str(bad))
    assert str(bad) in str(err.value) and "sha256" in str(err.value) and tokmod.GPT2_SHA256 in str(err.value)
    with pytest.raises(UserError, match="missing"):
        tokmod.gpt2_encoding(str(tmp_path / "absent.tiktoken"))


def test_char_tokenizer_round_trips_from_its_meta_and_names_unknown_characters():
    tok = CharTokenizer.from_text("hello, world\n")
    meta = json.loads(json.dumps(tok.meta()))  # as saved in meta.json
    again = get_tokenizer(meta)
    assert again.vocab_size == 10 and again.decode(again.encode("world, hello\n")) == "world, hello\n"
    assert again.encode("dew") == [tok.stoi["d"], tok.stoi["e"], tok.stoi["w"]]
    with pytest.raises(UserError, match="'z' is not in"):
        again.encode("zoo")
    with pytest.raises(UserError, match="unknown tokenizer"):
        get_tokenizer({"tokenizer": "bpe"})


# -------------------------------------------------------------------------------------------- shard format

def test_shard_write_read_round_trip(tmp_path):
    path = str(tmp_path / "train_000.bin")
    tokens = np.array([0, 1, 50256, 65535, 7] * 3, dtype=np.int64)
    write_shard(path, tokens)
    assert os.listdir(tmp_path) == ["train_000.bin"]  # the temporary file was renamed
    assert os.path.getsize(path) == HEADER_BYTES + 2 * len(tokens)
    header = np.fromfile(path, dtype="<i4", count=256)
    assert list(header[:4]) == [20240520, 1, 15, 65536] and not header[4:].any()  # [3]: 1 + the largest id
    assert shard_info(path) == (15, 65536)
    back = np.array(open_shard(path))
    assert back.dtype == np.uint16 and back.tolist() == tokens.tolist()
    with pytest.raises(ValueError):
        write_shard(str(tmp_path / "x.bin"), [65536])


def test_truncated_or_foreign_shards_are_refused_with_one_clear_sentence(tmp_path):
    good = str(tmp_path / "good.bin")
    write_shard(good, np.arange(100))
    truncated = str(tmp_path / "truncated.bin")
    with open(good, "rb") as f, open(truncated, "wb") as g:
        g.write(f.read()[:-2])
    foreign = str(tmp_path / "foreign.bin")
    raw = bytearray(open(good, "rb").read())
    raw[:4] = np.array([12345], dtype="<i4").tobytes()
    open(foreign, "wb").write(bytes(raw))
    tiny = str(tmp_path / "tiny.bin")
    open(tiny, "wb").write(b"\x00" * 10)
    for path, words in [(truncated, "truncated"), (foreign, "magic number is 12345"), (tiny, "shorter than")]:
        with pytest.raises(ShardError) as err:
            shard_info(path)
        message = str(err.value)
        assert path in message and words in message and "\n" not in message
        assert isinstance(err.value, UserError)
    # the loader checks every shard when it starts
    os.makedirs(tmp_path / "d" / "broken")
    shutil.copy(truncated, tmp_path / "d" / "broken" / "train_000.bin")
    shutil.copy(good, tmp_path / "d" / "broken" / "val_000.bin")
    (tmp_path / "d" / "broken" / "meta.json").write_text('{"tokenizer": "gpt2", "vocab_size": 50257}')
    with pytest.raises(ShardError, match="train_000.bin is truncated"):
        DataLoader("broken", 8, 2, 0, data_dir=str(tmp_path / "d"))


# ------------------------------------------------------------------------------------ OpenWebText pipeline

WORDS = ["the", "cat", "sat", "on", "mat", "café", "naïve", "—", "🙂", "42", "Zürich", "’quoted’", "a,b", "new\nline"]


def make_subset_archive(path, subset, n_xz=3, docs_per_xz=8, seed=0):
    """A subset archive with the hub's nesting: a tar holding openwebtext/urlsf_subsetNN-J_data.xz files, each an
    xz-compressed tar of .txt documents. Returns [(key, raw_text)] in archive order."""
    rng = random.Random(seed * 100 + subset)
    docs = []
    with tarfile.open(path, "w") as outer:
        folder = tarfile.TarInfo("openwebtext")
        folder.type = tarfile.DIRTYPE
        outer.addfile(folder)
        for j in range(1, n_xz + 1):
            xz_name = f"openwebtext/urlsf_subset{subset:02d}-{j}_data.xz"
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as inner:
                for d in range(docs_per_xz):
                    paragraphs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))
                                  for _ in range(rng.randint(1, 4))]
                    text = "  \n" + rng.choice(["\n\n\n\n", "\n\n", "\n\n\n"]).join(paragraphs) + "\n\n\n"
                    if d == 3:
                        text = " \n\n \n"  # empty once cleaned: skipped
                    if d == 5:
                        text += f"literal {EOT_TEXT} in a page"
                    name = f"{subset:02d}{j:02d}{d:03d}-{rng.getrandbits(32):08x}.txt"
                    data = text.encode("utf-8")
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    inner.addfile(info, io.BytesIO(data))
                    docs.append((f"{xz_name}/{name}", text))
            xz = lzma.compress(buf.getvalue())
            info = tarfile.TarInfo(xz_name)
            info.size = len(xz)
            outer.addfile(info, io.BytesIO(xz))
    return docs


def split_on_eot(tokens):
    """[EOT] d1 [EOT] d2 ... -> [d1, d2, ...]"""
    tokens = np.asarray(tokens).tolist()
    assert tokens[0] == EOT
    docs, cur = [], None
    for t in tokens:
        if t == EOT:
            if cur is not None:
                docs.append(cur)
            cur = []
        else:
            cur.append(t)
    return docs + [cur]


def read_split(out_dir, prefix):
    return np.concatenate([np.array(open_shard(p)) for p in sorted(shard_paths(str(out_dir), prefix.split("_")[0])) if
                           os.path.basename(p).startswith(prefix)])


@pytest.fixture
def owt(tmp_path, monkeypatch):
    """The openwebtext prepare module with download() replaced by copies of two local synthetic archives."""
    module = load_script("data/openwebtext/prepare.py")
    archives, expected = {}, {}
    for subset in (0, 1):
        archives[subset] = str(tmp_path / f"urlsf_subset{subset:02d}.tar")
        expected[subset] = make_subset_archive(archives[subset], subset)
    downloads = []

    def fake_download(subset, cache_dir):
        downloads.append(subset)
        return shutil.copy(archives[subset], archives[subset] + ".download")  # a download is deleted once used
    monkeypatch.setattr(module, "download", fake_download)
    module.test_downloads, module.test_expected = downloads, expected
    return module


OWT_ARGS = dict(subsets="0-1", shard_tokens=1000, val_fraction=0.25, num_threads=2)


def all_files(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


def test_openwebtext_pipeline_end_to_end(owt, tmp_path):
    out = tmp_path / "owt"
    meta = owt.prepare(out_dir=str(out), **OWT_ARGS)
    assert owt.test_downloads == [0, 1]
    tok = get_tokenizer(meta)
    n_train = n_val = 0
    for subset in (0, 1):
        expected = [(key, owt.clean(raw)) for key, raw in owt.test_expected[subset] if owt.clean(raw)]
        assert len(expected) == 3 * 7  # one whitespace-only page per .xz is dropped
        want_val = [text for key, text in expected if owt.is_val(key, 0.25)]
        want_train = [text for key, text in expected if not owt.is_val(key, 0.25)]
        assert want_val and want_train
        # every shard has a valid header; train shards hold exactly shard_tokens tokens except the last
        train_paths = sorted(str(p) for p in out.glob(f"train_s{subset:02d}_*.bin"))
        sizes = [shard_info(p)[0] for p in train_paths]
        assert len(sizes) >= 3 and set(sizes[:-1]) == {1000} and 0 < sizes[-1] <= 1000
        assert [os.path.basename(p) for p in train_paths] == [f"train_s{subset:02d}_{k:03d}.bin" for k in range(len(sizes))]
        train = read_split(out, f"train_s{subset:02d}")
        val = read_split(out, f"val_s{subset:02d}")
        # documents come back exactly, cleaned, in archive order, each preceded by one EOT
        assert [tok.decode(d) for d in split_on_eot(train)] == want_train
        assert [tok.decode(d) for d in split_on_eot(val)] == want_val
        assert (train == EOT).sum() == len(want_train) and (val == EOT).sum() == len(want_val)
        assert all("\n\n\n" not in t and t == t.strip() for _, t in expected)
        n_train, n_val = n_train + len(train), n_val + len(val)
        record = json.load(open(out / f"done_s{subset:02d}.json"))
        assert record["documents"] == len(expected) and record["val_documents"] == len(want_val)
        assert record["revision"] == owt.REVISION and len(owt.REVISION) == 40
    saved = json.load(open(out / "meta.json"))
    assert saved["subsets"] == [0, 1] and saved["tokenizer"] == "gpt2"
    assert (saved["train_tokens"], saved["val_tokens"]) == (n_train, n_val)
    # done subsets are skipped: nothing is downloaded again and nothing changes
    before = all_files(out)
    owt.prepare(out_dir=str(out), **OWT_ARGS)
    assert owt.test_downloads == [0, 1] and all_files(out) == before
    # and the loader reads the result
    loader = DataLoader("owt", 16, 4, 0, data_dir=str(tmp_path))
    x, y = loader.next_batch()
    assert x.shape == (4, 16) and int(x.max()) <= EOT


def test_openwebtext_interrupted_run_resumes_to_identical_shards(owt, tmp_path, monkeypatch):
    clean = tmp_path / "clean"
    owt.prepare(out_dir=str(clean), **OWT_ARGS)
    interrupted = tmp_path / "interrupted"
    real_write = owt.write_shard
    written = []

    def write_then_fail(path, tokens):
        if written:
            raise KeyboardInterrupt  # as a Ctrl-C in the middle of subset 0
        real_write(path, tokens)
        written.append(os.path.basename(path))
    monkeypatch.setattr(owt, "write_shard", write_then_fail)
    with pytest.raises(KeyboardInterrupt):
        owt.prepare(out_dir=str(interrupted), **OWT_ARGS)
    # no half shard, no done record, no meta yet, and the finished shard is staged where the loader cannot see it
    assert sorted(os.listdir(interrupted)) == ["partial_train_s00_000.bin"]
    monkeypatch.setattr(owt, "write_shard", real_write)
    owt.prepare(out_dir=str(interrupted), **OWT_ARGS)
    assert all_files(interrupted) == all_files(clean)
    assert len([n for n in os.listdir(clean) if n.endswith(".bin")]) >= 8


def test_redoing_a_finished_openwebtext_subset_keeps_it_until_its_new_shards_are_whole(owt, tmp_path, monkeypatch):
    out = tmp_path / "owt"
    owt.prepare(out_dir=str(out), **{**OWT_ARGS, "subsets": "0"})
    before = all_files(out)
    redo = {**OWT_ARGS, "subsets": "0", "val_fraction": 0.5}  # other settings: the subset is not done
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "urlsf_subset00.tar").write_text("not a tar")
    with pytest.raises(UserError, match=r"subset00.tar is not a tar file .*; replace it \(delete a downloaded one"):
        owt.prepare(out_dir=str(out), archive_dir=str(tmp_path / "bad"), **redo)
    assert all_files(out) == before
    # stopped as the earlier shards go: the earlier record went first, so no record lists missing shards
    real_remove = os.remove

    def remove(path):
        if os.path.basename(path).startswith("train_s00_"):
            raise KeyboardInterrupt
        real_remove(path)
    monkeypatch.setattr(os, "remove", remove)
    with pytest.raises(KeyboardInterrupt):
        owt.prepare(out_dir=str(out), **redo)
    monkeypatch.setattr(os, "remove", real_remove)
    assert not (out / "done_s00.json").exists()
    owt.prepare(out_dir=str(out), **redo)
    record = json.load(open(out / "done_s00.json"))
    assert record["val_fraction"] == 0.5 and len(record["train_shards"]) < len([n for n in before if "train" in n])
    assert sorted(n for n in os.listdir(out) if n.endswith(".bin")) == record["train_shards"] + record["val_shards"]


def test_archive_dir_archives_are_all_checked_first_and_never_deleted(owt, tmp_path):
    out = tmp_path / "owt"
    (tmp_path / "only0").mkdir()
    shutil.copy(tmp_path / "urlsf_subset00.tar", tmp_path / "only0")
    with pytest.raises(UserError, match="there is no .*only0/urlsf_subset01.tar"):
        owt.prepare(out_dir=str(out), archive_dir=str(tmp_path / "only0"), **OWT_ARGS)
    assert os.listdir(out) == []  # subset 0 was not tokenised first
    owt.prepare(out_dir=str(out), archive_dir=str(tmp_path), cache_dir=str(tmp_path), **OWT_ARGS)  # inside the cache
    assert owt.test_downloads == [] and all(os.path.isfile(tmp_path / f"urlsf_subset0{s}.tar") for s in (0, 1))


def test_openwebtext_is_never_prepared_beside_another_dataset(owt, tmp_path):
    """The loader reads every shard of a folder: openwebtext's beside another dataset's would be read as one."""
    meta = {"tokenizer": "char", "vocab_size": 10, "dataset": "shakespeare_char"}
    write_dataset(str(tmp_path / "sc"), np.arange(20) % 10, np.arange(10), meta)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "train_000.bin").write_bytes(b"my file")
    for folder, words in (("sc", "holds the dataset shakespeare_char"), ("mine", "holds train_000.bin")):
        before = all_files(tmp_path / folder)
        with pytest.raises(UserError, match=f"{words}.* the loader would read with openwebtext's; prepare"):
            owt.prepare(out_dir=str(tmp_path / folder), **OWT_ARGS)
        assert all_files(tmp_path / folder) == before and owt.test_downloads == []


def test_openwebtext_says_clearly_what_is_wrong(owt, tmp_path, monkeypatch):
    with pytest.raises(UserError, match="there is no subset 21: .* has subsets 0-20"):
        owt.parse_subsets("0,21", None)
    with pytest.raises(UserError, match="cannot read the subset 'x'"):
        owt.parse_subsets("x", None)
    assert owt.parse_subsets("0-2,5", None) == [0, 1, 2, 5] and owt.parse_subsets(None, None) == [0, 1]
    # a tar of plain .txt files is not the hub layout
    flat = str(tmp_path / "flat.tar")
    with tarfile.open(flat, "w") as t:
        info = tarfile.TarInfo("a.txt")
        info.size = 5
        t.addfile(info, io.BytesIO(b"hello"))
    with pytest.raises(UserError, match=r"flat.tar is not laid out .* holds no \.xz files \(it holds a\.txt\)"):
        owt.prepare_subset(0, flat, str(tmp_path))
    # an .xz that is not an xz-compressed tar
    fake = str(tmp_path / "fake.tar")
    with tarfile.open(fake, "w") as t:
        info = tarfile.TarInfo("openwebtext/urlsf_subset00-1_data.xz")
        info.size = 9
        t.addfile(info, io.BytesIO(b"not an xz"))
    with pytest.raises(UserError, match="urlsf_subset00-1_data.xz is not an xz-compressed tar"):
        owt.prepare_subset(0, fake, str(tmp_path))
    # no network: the real download function fails with a sentence, not a traceback
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    real = load_script("data/openwebtext/prepare.py")
    with pytest.raises(UserError, match="could not download subsets/urlsf_subset03.tar from Skylion007/openwebtext"):
        real.download(3, str(tmp_path / "cache"))


# ------------------------------------------------------------------------------------------------- loader

T = 8  # block_size of the synthetic loader tests


def make_dataset(root, name, train_lengths, val_lengths):
    """Shard i of a split holds 1000*i + 0, 1, 2, ...: a window is contiguous in one shard iff its tokens step by 1."""
    folder = os.path.join(root, name)
    os.makedirs(folder)
    for split, lengths, base in (("train", train_lengths, 0), ("val", val_lengths, 10_000)):
        for i, n in enumerate(lengths):
            write_shard(os.path.join(folder, f"{split}_{i:03d}.bin"), base + 1000 * i + np.arange(n))
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump({"tokenizer": "gpt2", "vocab_size": 50257}, f)
    return str(root)


@pytest.fixture
def synthetic(tmp_path):
    # shard 1 holds exactly one window of T+1 tokens, shard 2 is too short for any
    return make_dataset(tmp_path, "toy", [50, T + 1, 5, 120], [40, 30])


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_split_too_short_for_one_window_is_told_what_to_change(tmp_path, split):
    lengths = {"train": [50], "val": [40], split: [T]}  # T tokens: an input without its last target
    root = make_dataset(tmp_path, "tiny", lengths["train"], lengths["val"])
    with pytest.raises(UserError, match=f"^no {split} shard of dataset tiny holds block_size \\+ 1 = {T + 1} tokens; "
                       f"use a smaller block_size, or prepare it from more text.$"):
        DataLoader("tiny", T, 4, 1, data_dir=root)


def batches(loader, n):
    return [loader.next_batch() for _ in range(n)]


def same(a, b):
    return all((xa == xb).all() and (ya == yb).all() for (xa, ya), (xb, yb) in zip(a, b)) and len(a) == len(b)


def test_loader_same_seed_same_batches(synthetic):
    a, b, c = (DataLoader("toy", T, 4, seed, data_dir=synthetic) for seed in (7, 7, 8))
    ba, bb, bc = batches(a, 20), batches(b, 20), batches(c, 20)
    assert same(ba, bb) and a.batch_hash == b.batch_hash
    assert not same(ba, bc) and a.batch_hash != c.batch_hash
    x, y = ba[0]
    assert x.dtype == y.dtype and str(x.dtype) == "torch.int64" and x.shape == y.shape == (4, T)
    assert (x[:, 1:] == y[:, :-1]).all()


def test_loader_windows_never_cross_a_shard_end(synthetic):
    loader = DataLoader("toy", T, 16, 0, data_dir=synthetic)
    lengths = [50, T + 1, 5, 120]
    seen_shards, last_tokens = set(), set()
    for x, y in batches(loader, 60):
        w = np.concatenate([x.numpy(), y.numpy()[:, -1:]], axis=1)  # the T+1 tokens of each window
        assert (np.diff(w, axis=1) == 1).all()  # contiguous, so inside one shard
        shard, start = w[:, 0] // 1000, w[:, 0] % 1000
        assert (start + T + 1 <= np.array(lengths)[shard]).all()
        seen_shards.update(shard.tolist())
        last_tokens.update(w[:, -1].tolist())
    assert seen_shards == {0, 1, 3}  # shard 2 is shorter than a window
    assert {49, 1000 + T, 3119} <= last_tokens  # the last window of each shard is reachable


def test_validation_windows_are_shared_by_every_run(synthetic):
    a = DataLoader("toy", T, 4, 1, data_dir=synthetic)
    b = DataLoader("toy", T, 4, 999, rank=1, world_size=2, data_dir=synthetic)
    batches(a, 3)  # training draws do not move the validation windows
    va, vb = a.val_batches(5), b.val_batches(5)
    assert same(va, vb)
    assert same(DataLoader("toy", T, 4, 2, data_dir=synthetic).val_batches(2), va[:2])
    for x, y in va:
        w = np.concatenate([x.numpy(), y.numpy()[:, -1:]], axis=1)
        assert (w >= 10_000).all() and (np.diff(w, axis=1) == 1).all()  # from val shards, inside one shard
    assert not same(va[:1], va[1:2])


def test_ddp_ranks_split_the_single_process_stream(synthetic):
    single = batches(DataLoader("toy", T, 4, 5, data_dir=synthetic), 8)
    rank0 = batches(DataLoader("toy", T, 4, 5, rank=0, world_size=2, data_dir=synthetic), 4)
    rank1 = batches(DataLoader("toy", T, 4, 5, rank=1, world_size=2, data_dir=synthetic), 4)
    assert same(rank0, single[0::2]) and same(rank1, single[1::2])


def test_loader_resumes_exactly_and_refuses_another_stream(synthetic):
    """The loader's own load_state_dict proves the position it is given: the run's tokens say how many micro-batches
    were drawn, and those, drawn again, hash to the saved batch_hash; any other stream is refused."""
    a = DataLoader("toy", T, 4, 3, data_dir=synthetic)
    batches(a, 7)
    state = json.loads(json.dumps(a.state_dict()))  # survives a checkpoint
    tokens = 7 * 4 * T
    b = DataLoader("toy", T, 4, 3, data_dir=synthetic)
    b.load_state_dict(state, tokens)
    assert same(batches(a, 5), batches(b, 5)) and a.batch_hash == b.batch_hash
    others = [({}, tokens + 4 * T), ({"step": 6}, tokens), ({"step": 2**62}, tokens), ({"world_size": 2}, tokens),
              ({"batch_size": 2}, tokens)]
    for change, at in others:
        with pytest.raises(ValueError):
            DataLoader("toy", T, 4, 3, data_dir=synthetic).load_state_dict({**state, **change}, at)
    with pytest.raises(UserError, match="toy's shards are not those this run trained on"):  # same stream, other data
        DataLoader("toy", T, 4, 3, data_dir=synthetic).load_state_dict({**state, "batch_hash": "ab" * 32}, tokens)
    halves = [DataLoader("toy", T, 4, 3, rank=r, world_size=2, data_dir=synthetic) for r in (0, 1)]
    for h in halves:
        batches(h, 3)
    with pytest.raises(UserError, match="over 4 processes; resume with a number of processes that divides 6, such as "
                                        "2"):  # 3 x 2 micro-batches
        DataLoader("toy", T, 4, 3, rank=0, world_size=4, data_dir=synthetic).load_state_dict(
            halves[0].state_dict(), 6 * 4 * T)


def test_missing_dataset_names_the_prepare_command(tmp_path):
    with pytest.raises(DatasetNotPrepared) as err:
        DataLoader("shakespeare_char", 8, 2, 0, data_dir=str(tmp_path))
    message = str(err.value)
    assert isinstance(err.value, UserError)
    assert message.startswith(f"dataset shakespeare_char is not prepared in {tmp_path}")
    assert "run `python data/shakespeare_char/prepare.py" in message and "\n" not in message


def test_a_misspelt_dataset_is_pointed_to_the_one_meant(tmp_path):
    """A typo of a known dataset (or of a folder in data_dir) is not taken for a text of the user's own to prepare."""
    (tmp_path / "my_corpus").mkdir()
    (tmp_path / "notes.txt").write_text("a file, no dataset")
    for typo, meant in (("shakespear", "shakespeare"), ("my_corpos", "my_corpus"), ("novels", None),
                        ("openwebtext", None), ("notes.tx", None)):  # itself not prepared yet, a file: no hint
        with pytest.raises(DatasetNotPrepared) as err:
            DataLoader(typo, 8, 2, 0, data_dir=str(tmp_path))
        assert str(err.value).endswith(f"first (or did you mean --dataset={meant}?)." if meant else "first.")


# --------------------------------------------------------------------------------- Shakespeare, as users run it

OFFLINE_RUN = """
import runpy, socket, sys
def refuse(*args, **kwargs):
    raise OSError("network access attempted")
socket.socket.connect = socket.getaddrinfo = refuse
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_offline(script, *args):
    return subprocess.run([sys.executable, "-c", OFFLINE_RUN, script, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("name, tokens, vocab", [("shakespeare_char", 5_057_321, 84), ("shakespeare", 1_566_041, 50257)])
def test_shakespeare_prepare_scripts_run_offline(tmp_path, name, tokens, vocab):
    out = tmp_path / name
    result = run_offline(f"data/{name}/prepare.py", f"--out_dir={out}")
    assert result.returncode == 0, result.stderr
    meta = json.load(open(out / "meta.json"))
    assert meta["vocab_size"] == vocab and meta["train_tokens"] + meta["val_tokens"] == tokens
    assert sorted(os.listdir(out)) == [".prepare.lock", "meta.json", "train_000.bin", "val_000.bin"]
    tok = get_tokenizer(meta)
    train, val = (np.array(open_shard(str(out / f"{split}_000.bin"))) for split in ("train", "val"))
    text = read_shakespeare()
    val_text = tok.decode(val)
    assert tok.decode(train) + val_text == text  # nothing lost or changed
    assert val_text.startswith("THE HISTORY OF TROILUS AND CRESSIDA\n") and 0.09 < len(val_text) / len(text) < 0.11
    x, y = DataLoader(name, 32, 2, 0, data_dir=str(tmp_path)).next_batch()
    assert tok.decode(x[0].tolist()) in text


def test_prepared_shakespeare_char_fixture_feeds_the_loader(shakespeare_char_dir):
    loader = DataLoader("shakespeare_char", 64, 3, 0, data_dir=shakespeare_char_dir)
    assert loader.meta["vocab_size"] == 84 and loader.meta["tokenizer"] == "char"
    tok = get_tokenizer(loader.meta)
    x, y = loader.val_batches(1)[0]
    assert all(tok.decode(row.tolist()) in read_shakespeare() for row in x)


def test_text_prepare_turns_local_files_into_a_dataset(tmp_path):
    text_prepare = load_script("data/text/prepare.py")
    (tmp_path / "in" / "sub").mkdir(parents=True)
    (tmp_path / "in" / "b.txt").write_text("Second file, café.\n", encoding="utf-8")
    (tmp_path / "in" / "sub" / "a.txt").write_text("First file.\n" * 20, encoding="utf-8")
    (tmp_path / "in" / "notes.md").write_text("not text", encoding="utf-8")
    os.symlink("user@host.1234:1700000000", tmp_path / "in" / ".#b.txt")  # an editor's lock: a dangling link
    meta = text_prepare.prepare([str(tmp_path / "in")], "gpt2", out_dir=str(tmp_path / "mine"), val_fraction=0.2)
    tok = get_tokenizer(meta)
    stream = np.concatenate([open_shard(str(tmp_path / "mine" / f)) for f in ("train_000.bin", "val_000.bin")])
    assert meta["files"] == 2 and [tok.decode(d) for d in split_on_eot(stream)] == ["Second file, café.\n", "First file.\n" * 20]
    assert meta["val_tokens"] == round(0.2 * len(stream))
    meta = text_prepare.prepare(str(tmp_path / "in" / "b.txt"), "char", out_dir=str(tmp_path / "c"), val_fraction=0.2)
    assert meta["vocab_size"] == len(set("Second file, café.\n"))
    twice = [str(tmp_path / "in"), os.path.relpath(tmp_path / "in" / "b.txt"), str(tmp_path / "in" / "." / "b.txt")]
    assert text_prepare.prepare(twice, "char", out_dir=str(tmp_path / "once"))["files"] == 2  # a file counts once
    (tmp_path / "five.txt").write_text("hello world, tiny.", encoding="utf-8")  # 5 gpt2 tokens and the separator
    meta = text_prepare.prepare(str(tmp_path / "five.txt"), "gpt2", out_dir=str(tmp_path / "five"))
    assert (meta["train_tokens"], meta["val_tokens"]) == (4, 2)  # val holds a window of 2 tokens at least
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(UserError, match="latin1.txt' is not UTF-8 text"):
        text_prepare.prepare(str(tmp_path / "latin1.txt"), "gpt2", out_dir=str(tmp_path / "x"))


def test_prepare_mistakes_are_one_sentence_and_keep_what_was_written(tmp_path):
    meta = {"dataset": "x", "tokenizer": "char", "vocab_size": 10}
    write_dataset(str(tmp_path / "ds"), np.arange(10) % 10, np.arange(5), meta, shard_tokens=4)
    before = all_files(tmp_path / "ds")
    for bad in (0, -3):
        with pytest.raises(UserError, match="--shard_tokens must be between 1 and 2147483647"):
            write_dataset(str(tmp_path / "ds"), np.arange(10), np.arange(5), meta, shard_tokens=bad)
    assert all_files(tmp_path / "ds") == before  # the earlier shards are still there
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(UserError, match="cannot create the folder .*file/ds \\(Not a directory\\)"):
        write_dataset(str(tmp_path / "file" / "ds"), np.arange(10), np.arange(5), meta)


def test_prepare_never_replaces_files_no_preparation_wrote_and_clears_what_a_kill_left(tmp_path, monkeypatch):
    """A folder of the user's (shards, a meta.json of its own) is refused and kept; a preparation whose swap a kill
    cut short (its staged meta.json is there, no meta.json in place) is its own: prepared again, nothing of it stays."""
    meta = {"dataset": "ds", "tokenizer": "char", "vocab_size": 10}
    mine = tmp_path / "mine"
    mine.mkdir()
    for name, data in (("train_results.bin", b"1"), ("val_scores.bin", b"2"), ("meta.json", b'{"mine": 1}')):
        (mine / name).write_bytes(data)
    before = all_files(mine)
    with pytest.raises(UserError, match=r"holds train_results.bin, val_scores.bin, meta.json but no meta.json of a "
                                        r"prepared dataset, so preparing there would replace them"):
        write_dataset(str(mine), np.arange(10), np.arange(5), meta)
    assert all_files(mine) == before
    ds = tmp_path / "ds"
    write_dataset(str(ds), np.arange(20) % 10, np.arange(10), meta, shard_tokens=4)
    os.rename(ds / "meta.json", ds / "partial_meta.json")  # killed in the swap: new shards in, meta.json not yet
    (ds / "partial_train_000.bin").write_bytes(b"half")
    (ds / ".partial_train_001.bin.tmp999999999").write_bytes(b"half")  # a dead process's temporary file
    (ds / "partial_notes.txt").write_text("the user's")  # not a name a preparation stages: kept
    (ds / "partial_runs").mkdir()
    full_disk(monkeypatch)
    with pytest.raises(RunStopped):  # a preparation that fails leaves the folder marked as a preparation's
        write_dataset(str(ds), np.arange(12) % 10, np.arange(6), meta, shard_tokens=4)
    monkeypatch.undo()
    write_dataset(str(ds), np.arange(12) % 10, np.arange(6), meta, shard_tokens=4)
    assert sorted(os.listdir(ds)) == [".prepare.lock", "meta.json", "partial_notes.txt", "partial_runs",
                                      "train_000.bin", "train_001.bin", "train_002.bin", "val_000.bin", "val_001.bin"]


def test_a_second_preparation_of_a_folder_waits_for_the_first(tmp_path):
    import fcntl
    import threading
    meta = {"dataset": "ds", "tokenizer": "char", "vocab_size": 10}
    ds = tmp_path / "ds"
    write_dataset(str(ds), np.arange(20) % 10, np.arange(10), meta)
    with open(ds / ".prepare.lock", "a") as lock:  # as a preparation in progress holds it
        fcntl.flock(lock, fcntl.LOCK_EX)
        second = threading.Thread(target=write_dataset, args=(str(ds), np.arange(8), np.arange(4), meta))
        second.start()
        second.join(1.0)
        assert second.is_alive() and json.loads((ds / "meta.json").read_text())["train_tokens"] == 20
    second.join(60)
    assert json.loads((ds / "meta.json").read_text())["train_tokens"] == 8


def test_a_dataset_prepared_again_under_a_reading_run_stops_it_in_a_sentence(tmp_path):
    """Its shards are read afresh at each batch: another file under the same name (other windows, another size) stops
    the run, never a traceback deep in numpy nor batches of other data."""
    meta = {"dataset": "ds", "tokenizer": "char", "vocab_size": 10}
    write_dataset(str(tmp_path / "ds"), np.arange(200) % 10, np.arange(50) % 10, meta)
    loader = DataLoader("ds", 8, 2, 0, data_dir=str(tmp_path))
    loader.next_batch()
    write_dataset(str(tmp_path / "ds"), np.arange(200) % 10, np.arange(50) % 10, meta)  # the same data: files kept
    loader.next_batch()
    write_dataset(str(tmp_path / "ds"), np.arange(100) % 10, np.arange(50) % 10, meta)
    with pytest.raises(RunStopped, match=r"train_000.bin was replaced while this command read it \(its dataset was "
                                         r"prepared again\)"):
        loader.next_batch()


def test_a_failed_meta_write_leaves_the_earlier_dataset_whole(tmp_path, monkeypatch):
    meta = {"dataset": "ds", "tokenizer": "char", "vocab_size": 10}
    write_dataset(str(tmp_path / "ds"), np.arange(20) % 10, np.arange(10), meta, shard_tokens=4)
    before = all_files(tmp_path / "ds")

    def full_disk(path, obj):
        raise RunStopped(f"could not write {path} (No space left on device)")
    monkeypatch.setattr(data_write, "write_json", full_disk)
    with pytest.raises(RunStopped):
        write_dataset(str(tmp_path / "ds"), np.arange(30) % 5, np.arange(9), {**meta, "vocab_size": 5}, shard_tokens=4)
    assert all_files(tmp_path / "ds") == before
    # stopped as the files are swapped, the dataset reads as not prepared, never as new shards with the old meta.json
    monkeypatch.undo()

    remove = os.remove

    def interrupted(path):
        if os.path.basename(path) == "train_001.bin":  # an old shard, after meta.json went
            raise KeyboardInterrupt
        remove(path)
    monkeypatch.setattr(data_write.os, "remove", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_dataset(str(tmp_path / "ds"), np.arange(30) % 5, np.arange(9), {**meta, "vocab_size": 5}, shard_tokens=4)
    with pytest.raises(DatasetNotPrepared):
        DataLoader("ds", 2, 1, 0, data_dir=str(tmp_path))


def test_text_prepare_keeps_a_name_inside_data(tmp_path, monkeypatch):
    text_prepare = load_script("data/text/prepare.py")
    monkeypatch.setattr(text_prepare, "DATA", str(tmp_path / "data"))
    (tmp_path / "in.txt").write_text("some text to tokenize " * 10)
    for name in ("", ".", "..", "a/b", "../x"):
        with pytest.raises(UserError, match="is not a plain folder name"):
            text_prepare.prepare(str(tmp_path / "in.txt"), "char", name=name)
    assert sorted(os.listdir(tmp_path)) == ["in.txt"]
    assert text_prepare.prepare(str(tmp_path / "in.txt"), "char", name="mine")["dataset"] == "mine"


# ------------------------------------------------------------------------- command lines, run in this process



def assert_one_line(code, err, status, words):
    assert code == status and "Traceback" not in err, err
    assert len(err.splitlines()) == 1 and words in err, err
    assert err.startswith("error: " if status == 2 else "stopped: "), err


@pytest.fixture
def scripts(monkeypatch):
    """Every prepare script as a module; a download attempt fails the test."""
    modules = {name: load_script(f"data/{name}/prepare.py") for name in ("shakespeare_char", "text", "openwebtext",
                                                                          "fineweb10B")}
    for name in ("openwebtext", "fineweb10B"):
        monkeypatch.setattr(modules[name], "download", lambda *a: pytest.fail("downloaded"))
    return modules


@pytest.mark.parametrize("name, args, words", [
    ("openwebtext", ["--num_subsets=two"], "--num_subsets expects an int, got 'two'"),
    ("openwebtext", ["--val_fraction=abc"], "--val_fraction expects a float"),
    ("openwebtext", ["--keep_archives=maybe"], "--keep_archives expects a bool"),
    ("openwebtext", ["--subsets=0-2", "--num_subsets=3"], "either --subsets or --num_subsets"),
    ("openwebtext", ["--subsets=30"], "there is no subset 30"),
    ("openwebtext", ["--val_fraction=2"], "--val_fraction must be between 0 and 1"),
    ("openwebtext", ["--num_threads=-1"], "--num_threads must be at least 0"),
    ("openwebtext", ["--subsets=0,5-3"], "a range goes from low to high"),
    ("openwebtext", ["--shard_tokens=0"], "--shard_tokens must be between 1 and 2147483647"),
    ("openwebtext", ["--shard_tokens=1000000000000"], "--shard_tokens must be between 1 and 2147483647"),
    ("openwebtext", ["--subset=1"], "unknown config key 'subset' (did you mean 'subsets'"),
    ("text", ["--val_fraction=abc"], "--val_fraction expects a float"),
    ("text", ["--shard_tokens=1.5"], "--shard_tokens expects an int"),
    ("text", ["--input=a.txt", "--tokenizer=bpe"], "unknown tokenizer 'bpe'"),
    ("text", [], "no input given"),
    ("text", ["--input=/nonexistent/notes.txt"], "/nonexistent/notes.txt is neither a file nor a folder"),
    ("shakespeare_char", ["--shard_tokens=x"], "--shard_tokens expects an int"),
    ("shakespeare_char", ["--out-dir"], "cannot read argument '--out-dir'"),
])
def test_command_line_mistakes_are_one_line_with_exit_status_2(scripts, tmp_path, capsys, name, args, words):
    out = tmp_path / "out"
    code, err = run(scripts[name].main, args + [f"--out_dir={out}"], capsys)
    assert_one_line(code, err, 2, words)
    assert not out.exists()  # refused before any work


def test_a_path_split_off_by_a_space_is_refused_not_run_as_a_config_file(scripts, tmp_path, capsys):
    """--input=a.txt, notes.txt: the shell makes notes.txt an argument of its own, which is no config file."""
    marker, notes = tmp_path / "ran", tmp_path / "notes.txt"
    notes.write_text(f"open({str(marker)!r}, 'w').close()\n")
    code, err = run(scripts["text"].main, [f"--input={tmp_path / 'a.txt'},", str(notes), f"--out_dir={tmp_path / 'o'}"],
                    capsys)
    assert_one_line(code, err, 2, f"cannot read argument '{notes}': a config file is a FILE.py")
    assert not marker.exists() and not (tmp_path / "o").exists()


def test_your_text_never_takes_the_name_of_a_dataset_nanoffn_prepares(scripts, tmp_path, capsys, monkeypatch):
    """--name=shakespeare_char (or an --out_dir there) would replace the bundled corpus every default run and the tuned
    rates stand on."""
    monkeypatch.setattr(scripts["text"], "DATA", str(tmp_path))  # a data/ of the test's own
    (tmp_path / "shakespeare_char").mkdir()
    (tmp_path / "shakespeare_char" / "prepare.py").write_text("")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "in.txt").write_text("some text to tokenize " * 10)
    code, err = run(scripts["text"].main, ["--input=~/in.txt", "--name=shakespeare_char", "--tokenizer=char"], capsys)
    own = tmp_path / "shakespeare_char" / "prepare.py"
    assert_one_line(code, err, 2, "--name=shakespeare_char holds prepare.py: it is a folder of code, or of the dataset "
                                  "its prepare.py writes; choose another --name.")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "loader.py").write_text("")  # data/ itself, say
    for folder in (own.parent, tmp_path / "code"):
        code, err = run(scripts["text"].main, ["--input=~/in.txt", f"--out_dir={folder}", "--tokenizer=char"], capsys)
        assert_one_line(code, err, 2, f"--out_dir={folder} holds {os.listdir(folder)[0]}: it is a folder of code")
    assert os.listdir(tmp_path / "shakespeare_char") == ["prepare.py"] and os.listdir(tmp_path / "code") == ["loader.py"]
    downloaded = tmp_path / "elsewhere" / "fineweb10B"  # a dataset of other shards, prepared where no prepare.py is
    downloaded.mkdir(parents=True)
    for name in ("train_000001.bin", "val_000000.bin"):
        (downloaded / name).write_bytes(b"shard")
    (downloaded / "meta.json").write_text(json.dumps({"dataset": "fineweb10B", "train_tokens": 1}))
    code, err = run(scripts["text"].main, ["--input=~/in.txt", f"--out_dir={downloaded}", "--tokenizer=char"], capsys)
    assert_one_line(code, err, 2, f"{downloaded} holds train_000001.bin, val_000000.bin, shards of another preparation "
                                  f"(a download's), which this one would delete; choose another folder.")
    assert sorted(os.listdir(downloaded)) == ["meta.json", "train_000001.bin", "val_000000.bin"]
    code, err = run(scripts["text"].main, ["--input=~/in.txt", "--name=mine", "--tokenizer=char"], capsys)
    assert code == 0 and (tmp_path / "mine" / "meta.json").exists()  # ~ is the user's home, as in a shell
    os.symlink(tmp_path / "mine", tmp_path / "current")  # the same folder by another name prepares again
    code, err = run(scripts["text"].main, ["--input=~/in.txt", "--out_dir=~/current", "--tokenizer=char"], capsys)
    assert code == 0 and json.load(open(tmp_path / "mine" / "meta.json"))["dataset"] == "current"
    (tmp_path / "short.txt").write_text("a")
    code, err = run(scripts["text"].main, ["--input=~/short.txt", "--name=short", "--tokenizer=char"], capsys)
    assert_one_line(code, err, 2, "the text is only 1 token(s) long")
    assert not (tmp_path / "short").exists()  # a mistake in the input leaves no folder behind


def read_only_folders(tmp_path):
    """(an existing folder that takes no new file, a folder that cannot be created). Root ignores file permissions,
    but nobody may add entries to /sys."""
    if os.geteuid() == 0:
        return "/sys", "/sys/nanoffn-test/out"
    folder = tmp_path / "read-only"
    folder.mkdir()
    (folder / "train_000.bin").write_bytes(b"earlier")
    folder.chmod(0o555)
    return str(folder), str(folder / "out")


@pytest.mark.parametrize("name", ["shakespeare_char", "text", "openwebtext", "fineweb10B"])
def test_an_out_dir_that_cannot_take_files_is_one_line_before_any_work(scripts, tmp_path, capsys, name):
    args = [f"--input={tmp_path / 'in.txt'}"] if name == "text" else []
    (tmp_path / "in.txt").write_text("some text to tokenize " * 10)
    (tmp_path / "file").write_text("keep me")
    read_only, uncreatable = read_only_folders(tmp_path)
    before = sorted(os.listdir(read_only))
    try:
        for out_dir, words in [(tmp_path / "file", "is a file, not a folder"),
                               (tmp_path / "file" / "sub", "cannot create the folder"),
                               (read_only, f"cannot write in {read_only}"), (uncreatable, "cannot create the folder")]:
            code, err = run(scripts[name].main, args + [f"--out_dir={out_dir}"], capsys)
            assert_one_line(code, err, 2, words)
        assert (tmp_path / "file").read_text() == "keep me" and sorted(os.listdir(read_only)) == before
    finally:
        if read_only != "/sys":
            os.chmod(read_only, 0o755)  # so pytest can remove it


def full_disk(monkeypatch):
    """Every shard write fails part-way with ENOSPC, inside files.write_file (whose cleanup is what is tested)."""
    real = data_write.write_file

    def write_file(path, write, binary=False):
        def fail(f):
            f.write(b"\0" * 100)
            raise OSError(28, "No space left on device")
        real(path, fail, binary)
    monkeypatch.setattr(data_write, "write_file", write_file)


def test_a_failed_shard_write_stops_with_exit_3_and_leaves_the_earlier_dataset_whole(tmp_path, capsys, monkeypatch):
    text = load_script("data/text/prepare.py")
    (tmp_path / "in.txt").write_text("To be, or not to be: that is the question.\n" * 20)
    args = [f"--input={tmp_path / 'in.txt'}", "--tokenizer=char", f"--out_dir={tmp_path / 'ds'}", "--shard_tokens=300"]
    assert run(text.main, args, capsys)[0] == 0
    before = all_files(tmp_path / "ds")
    assert len([n for n in before if n.endswith(".bin")]) == 4
    (tmp_path / "in.txt").write_text("Something else entirely.\n" * 30)
    full_disk(monkeypatch)
    with pytest.raises(RunStopped, match="could not write .*train_000.bin \\(No space left on device\\)"):
        write_shard(str(tmp_path / "ds" / "train_000.bin"), np.arange(10))
    code, err = run(text.main, args, capsys)
    assert_one_line(code, err, 3, "(No space left on device); what was there before is unchanged")
    assert all_files(tmp_path / "ds") == before  # byte-identical, and no temporary or staged file left


def test_a_failed_openwebtext_shard_write_keeps_the_finished_subsets(owt, tmp_path, monkeypatch):
    out = tmp_path / "owt"
    owt.prepare(out_dir=str(out), **{**OWT_ARGS, "subsets": "0"})
    before = all_files(out)
    full_disk(monkeypatch)
    with pytest.raises(RunStopped, match="partial_train_s01_000.bin \\(No space left on device\\)"):
        owt.prepare(out_dir=str(out), **OWT_ARGS)
    assert all_files(out) == before


def test_a_command_that_waited_for_another_ones_preparation_reads_it(tmp_path, monkeypatch):
    """Two commands started at once on a fresh clone: one prepares the bundled corpus while the other waits for the
    folder's lock, then reads what was prepared instead of preparing it again over the first one's files (two at once
    used to leave shards without meta.json, or meta.json without the val shards)."""
    from data import loader
    prepare = load_script("data/shakespeare_char/prepare.py").prepare
    flock = loader.fcntl.flock

    def another_prepares_meanwhile(f, op):
        if op == loader.fcntl.LOCK_EX and f.name.endswith(".shakespeare_char.lock"):  # the loader's, not a prepare's
            prepare(str(tmp_path / "shakespeare_char"))
        flock(f, op)
    monkeypatch.setattr(loader.fcntl, "flock", another_prepares_meanwhile)
    monkeypatch.setattr(loader.subprocess, "run", lambda *a, **kw: pytest.fail("prepared a second time"))
    got = loader.open_loader("shakespeare_char", 8, 2, 1337, data_dir=str(tmp_path))
    assert got.meta["vocab_size"] == 84
