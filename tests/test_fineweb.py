"""data/fineweb10B/prepare.py against a local stand-in for the Hugging Face hub: download() is replaced by a function
that copies synthetic shards (headers written here by hand, as the shard format specifies) from a temporary folder,
as hf_hub_download(local_dir=...) would. The real download is not reachable from the test machines."""
import importlib.util
import os
import shutil
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from data.loader import DataLoader, DatasetNotPrepared, PREPARE_COMMANDS  # noqa: E402
from machinery.cli import UserError, run_cli  # noqa: E402

TOKENS = {"fineweb_val_000000.bin": 300, "fineweb_train_000001.bin": 500, "fineweb_train_000002.bin": 400,
          "fineweb_train_000003.bin": 200}


def shard_bytes(first, n):
    """A shard as the format defines it: int32 header [20240520, 1, n, 0 x 253], then n uint16 tokens."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = 20240520, 1, n
    return header.tobytes() + (first + np.arange(n)).astype("<u2").tobytes()


@pytest.fixture
def fineweb(tmp_path, monkeypatch):
    """The prepare module with its download() served from tmp_path/hub; module.downloads lists the files fetched."""
    spec = importlib.util.spec_from_file_location("fineweb10B_prepare", os.path.join(REPO, "data/fineweb10B/prepare.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    hub = tmp_path / "hub"
    hub.mkdir()
    for i, (name, n) in enumerate(TOKENS.items()):  # shard i holds 1000*i, 1000*i + 1, ...: windows are checkable
        (hub / name).write_bytes(shard_bytes(1000 * i, n))
    module.hub, module.downloads = hub, []

    def stand_in(filename, cache_dir):
        module.downloads.append(filename)
        os.makedirs(cache_dir, exist_ok=True)
        return shutil.copy(hub / filename, os.path.join(cache_dir, filename))
    monkeypatch.setattr(module, "download", stand_in)
    return module


def test_shards_land_whole_the_loader_reads_them_and_reruns_download_nothing_twice(fineweb, tmp_path):
    out = tmp_path / "data" / "fineweb10B"
    meta = fineweb.prepare(shards=2, out_dir=str(out))
    assert fineweb.downloads == ["fineweb_val_000000.bin", "fineweb_train_000001.bin", "fineweb_train_000002.bin"]
    for hub_name, name in [("fineweb_val_000000.bin", "val_000000.bin"), ("fineweb_train_000001.bin", "train_000001.bin"),
                           ("fineweb_train_000002.bin", "train_000002.bin")]:
        assert (out / name).read_bytes() == (fineweb.hub / hub_name).read_bytes()
    assert meta["tokenizer"] == "gpt2" and meta["vocab_size"] == 50257
    assert (meta["train_tokens"], meta["val_tokens"], meta["train_shards"]) == (500 + 400, 300, 2)

    loader = DataLoader("fineweb10B", 16, 8, seed=0, data_dir=str(tmp_path / "data"))
    assert loader.meta == meta
    x, y = loader.next_batch()
    for row in np.concatenate([x.numpy(), y.numpy()[:, -1:]], axis=1):  # a window is 17 consecutive tokens of a shard
        assert (np.diff(row) == 1).all() and row[0] // 1000 in (1, 2)  # train shards are shards 1 and 2
    xv, _ = loader.val_batches(1)[0]
    assert (xv.numpy() // 1000 == 0).all()  # validation windows come from the validation shard only

    fineweb.downloads.clear()
    fineweb.prepare(shards=2, out_dir=str(out))
    assert fineweb.downloads == []  # everything is in place: nothing is fetched again
    meta = fineweb.prepare(shards=3, out_dir=str(out))
    assert fineweb.downloads == ["fineweb_train_000003.bin"]  # only the missing shard
    assert meta["train_tokens"] == 500 + 400 + 200
    fetched = fineweb.download
    fineweb.download = lambda filename, cache_dir: sys.exit(1)  # a download cut short (no network, a Ctrl-C)
    with pytest.raises(SystemExit):
        fineweb.prepare(shards=4, out_dir=str(out))
    assert DataLoader("fineweb10B", 16, 8, seed=0, data_dir=str(tmp_path / "data")).meta == meta  # still prepared
    (fineweb.hub / "fineweb_train_000004.bin").write_bytes(shard_bytes(4000, 100))
    fineweb.download = lambda filename, cache_dir: (
        fetched(filename, cache_dir) if filename.endswith("4.bin") else sys.exit(1))  # shard 4 lands, not shard 5
    with pytest.raises(SystemExit):
        fineweb.prepare(shards=5, out_dir=str(out))
    assert (out / "train_000004.bin").exists() and not (out / "meta.json").exists()  # none that counts 3 of 4 shards


@pytest.mark.parametrize("damage", ["truncated", "wrong magic"])
def test_a_corrupt_shard_is_refused_by_name_in_one_line(fineweb, tmp_path, capsys, damage):
    bad = fineweb.hub / "fineweb_train_000002.bin"
    data = bad.read_bytes()
    bad.write_bytes(data[:-10] if damage == "truncated" else b"\0\0\0\0" + data[4:])
    out = tmp_path / "fw"
    with pytest.raises(SystemExit) as exit_info:
        run_cli(fineweb.main, ["--shards=2", f"--out_dir={out}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if not line.startswith("downloading ")]  # progress lines aside
    assert len(errors) == 1 and errors[0].startswith("error: ") and "Traceback" not in err
    assert "fineweb_train_000002.bin is corrupt" in errors[0] and "rerun" in errors[0]
    # the good shards stay, the corrupt one is neither kept nor in place, and without meta.json the dataset is not
    # complete for the loader
    assert sorted(os.listdir(out)) == ["cache", "train_000001.bin", "val_000000.bin"]
    assert not os.path.exists(out / "cache" / "fineweb_train_000002.bin")
    with pytest.raises(DatasetNotPrepared, match="python data/fineweb10B/prepare.py"):
        DataLoader("fineweb10B", 16, 8, seed=0, data_dir=str(tmp_path))

    bad.write_bytes(data)  # the hub serves it whole again: a rerun fetches only that shard
    fineweb.downloads.clear()
    run_cli(fineweb.main, ["--shards=2", f"--out_dir={out}"])
    assert fineweb.downloads == ["fineweb_train_000002.bin"]
    assert (out / "train_000002.bin").read_bytes() == data


def test_bad_shard_count_and_no_network_are_one_sentence(fineweb, tmp_path, monkeypatch):
    with pytest.raises(UserError, match="--shards must be between 1 and 103"):
        fineweb.prepare(shards=104, out_dir=str(tmp_path / "fw"))
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    real = importlib.util.module_from_spec(importlib.util.spec_from_file_location(
        "fineweb10B_real", os.path.join(REPO, "data/fineweb10B/prepare.py")))
    real.__spec__.loader.exec_module(real)
    with pytest.raises(UserError, match="could not download fineweb_val_000000.bin from the Hugging Face dataset "
                                        "kjj0/fineweb10B-gpt2"):
        real.download("fineweb_val_000000.bin", str(tmp_path / "cache"))


@pytest.mark.parametrize("arg, words", [("--shards=abc", "--shards expects an int, got 'abc'"),
                                        ("--shards=1.5", "--shards expects an int, got '1.5'"),
                                        ("--bogus=1", "unknown config key 'bogus'"),
                                        ("--shards=0", "--shards must be between 1 and 103")])
def test_command_line_mistakes_are_one_line_with_exit_status_2(fineweb, tmp_path, capsys, arg, words):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(fineweb.main, [arg, f"--out_dir={tmp_path / 'fw'}"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and words in err
    assert fineweb.downloads == [] and not (tmp_path / "fw").exists()


def test_fineweb_is_never_prepared_beside_another_dataset(fineweb, tmp_path):
    """The loader reads every shard of a folder: FineWeb's beside another dataset's would be read as one."""
    out = tmp_path / "text"
    out.mkdir()
    (out / "train_000.bin").write_bytes(b"another dataset's shard")
    (out / "meta.json").write_text('{"dataset": "text", "vocab_size": 84}')
    with pytest.raises(UserError, match="holds the dataset text, whose shards the loader would read with fineweb10B's"):
        fineweb.prepare(shards=1, out_dir=str(out))
    assert sorted(os.listdir(out)) == ["meta.json", "train_000.bin"] and fineweb.downloads == []


def test_help_lists_the_keys(fineweb, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(fineweb.main, ["--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "usage: python data/fineweb10B/prepare.py" in out
    assert all(f"--{key}" in out for key in ("shards", "out_dir", "cache_dir"))


def test_a_cache_on_another_filesystem_is_copied_whole(fineweb, tmp_path, monkeypatch):
    real_replace = os.replace

    def cross_device(src, dst):
        if os.path.basename(os.path.dirname(src)) == "cache":  # the download folder
            raise OSError(18, "Invalid cross-device link")
        real_replace(src, dst)
    monkeypatch.setattr(fineweb.os, "replace", cross_device)
    out = tmp_path / "fw"
    fineweb.prepare(shards=1, out_dir=str(out), cache_dir=str(tmp_path / "cache"))
    assert (out / "train_000001.bin").read_bytes() == (fineweb.hub / "fineweb_train_000001.bin").read_bytes()
    assert sorted(os.listdir(out)) == ["meta.json", "train_000001.bin", "val_000000.bin"]
    assert os.listdir(tmp_path / "cache") == []


def test_config_reads_the_dataset_and_has_the_budget_its_header_states():
    from machinery import cli
    import configurator
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        cfg, _ = cli.parse_args(configurator.DEFAULTS, ["config/fineweb10B.py"], types=configurator.TYPES)
    finally:
        os.chdir(cwd)
    configurator.check(cfg)
    assert cfg["dataset"] == "fineweb10B" and cfg["dataset"] in PREPARE_COMMANDS
    tokens_per_iter = cfg["batch_size"] * cfg["block_size"] * cfg["gradient_accumulation_steps"]
    assert tokens_per_iter == 524_288 and round(tokens_per_iter * cfg["max_iters"] / 1e9, 1) == 10.0
