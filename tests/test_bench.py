"""bench.py's JSON reports the model's own parameter counts and ratios against the baseline
measured in the same run. Tiny shapes, eager only, a few repeats: seconds, not minutes."""
import json
import statistics

import pytest
import torch

import bench
from machinery.cli import UserError
from model import GPT, GPTConfig

TINY = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=2", "--vocab_size=84",
        "--compile=False", "--device=cpu", "--threads=1", "--warmup=1", "--json="]  # no report in the repository


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    threads = torch.get_num_threads()
    try:
        bench.main(TINY + ["--variants=polynorm,moa_glu", "--repeats=5", f"--json={path}"])
    finally:
        torch.set_num_threads(threads)  # bench sets the thread count for the whole process
    return json.loads(path.read_text())


def test_baselines_come_along_and_every_variant_is_timed_alike(report):
    rows = {r["variant"]: r for r in report["results"]}
    assert list(rows) == ["gelu", "polynorm", "swiglu", "moa_glu"]  # registry order, baselines added
    assert {v: r["baseline"] for v, r in rows.items()} == {"gelu": "gelu", "polynorm": "gelu",
                                                            "swiglu": "swiglu", "moa_glu": "swiglu"}
    for r in rows.values():
        assert r["compile"] is False
        assert r["step_time_s"]["n"] == len(r["step_time_s"]["times"]) == 5
        assert r["tokens_per_s"] == pytest.approx(report["tokens_per_step"] / r["step_time_s"]["median"])


def test_json_parameters_are_the_models_own(report):
    for r in report["results"]:
        model = GPT(GPTConfig(**report["model"], ffn=r["variant"]))
        own = model.param_report()
        assert r["params"]["total"] == sum(p.numel() for p in model.parameters()) == own["total"]
        assert (r["params"]["ffn"], r["params"]["extras"]) == (own["ffn"], own["extras"])
        # FLOPs per token: 6·N + 12·L·H·Q·T, counted here independently of bench and the model
        cfg = model.config
        n = own["active"] - (model.transformer.wpe.weight.numel() if model.transformer.wpe is not None else 0)
        expect = 6 * n + 12 * cfg.n_layer * cfg.n_head * (cfg.n_embd // cfg.n_head) * cfg.block_size
        assert r["flops_per_token"] == pytest.approx(expect)
    extras = {r["variant"]: r["params"]["extras"] for r in report["results"]}
    assert extras["gelu"] == extras["swiglu"] == 0 and extras["polynorm"] == 4  # a_0..a_3, one layer


def test_ratios_are_against_the_baseline_of_the_same_run(report):
    rows = {(r["variant"], r["compile"]): r for r in report["results"]}
    for r in report["results"]:
        base = rows[(r["baseline"], r["compile"])]
        # recompute the medians from the raw times in the JSON, then the ratios from those medians
        median = statistics.median(r["step_time_s"]["times"])
        assert r["step_time_s"]["median"] == pytest.approx(median)
        assert r["ratios"]["step_time"] == pytest.approx(median / statistics.median(base["step_time_s"]["times"]))
        assert r["ratios"]["saved_bytes"] == pytest.approx(r["saved_bytes_per_token"] / base["saved_bytes_per_token"])
        assert r["step_time_s"]["q25"] <= median <= r["step_time_s"]["q75"]
        assert r["saved_bytes_per_token"] > 0 and r["cuda_step_peak_bytes"] is None  # no GPU here
    assert rows[("gelu", False)]["ratios"]["step_time"] == 1.0


def test_user_mistakes_are_one_sentence_errors(tmp_path):
    for args, words in [(["--variants=gelu,nope"], "unknown ffn"), (["--compile=maybe"], "--compile"),
                        (["--n_head=3"], "divisible"), (["--profile=nope"], "unknown ffn"),
                        (["--variants=moa:moa_gate=softmax"], "name moa alone and give its settings as --key=value"),
                        (["--profile=la:act_dict=gelu+relu"], "name la alone"),
                        (["--profile=gelu,polynorm"], "--profile takes one variant"),
                        (["--vocab_size=0"], "--vocab_size must be at least 1"),
                        (["--threads=-1"], "--threads must not be negative"),
                        (["--peak_flops=-1"], "--peak_flops must be a finite number >= 0"),
                        (["--json=/proc/nope/bench.json"], "cannot create the folder"),
                        (["--n_expert=2", "--expert_hidden=8"], "no dense twin of its active weights"),
                        ([f"--json={tmp_path}"], "is a folder")]:  # before the work
        with pytest.raises(UserError, match=words):
            bench.main(TINY + ["--repeats=1"] + args)
    with pytest.raises(UserError, match="unknown ffn"):  # a mistake leaves no folder for the report behind
        bench.main(TINY + ["--variants=nope", f"--json={tmp_path / 'new' / 'bench.json'}"])
    assert not (tmp_path / "new").exists()


def test_a_compile_cache_inductor_cannot_write_is_said_before_any_measurement(tmp_path, monkeypatch):
    """Inductor's own failure to make its cache folder was a traceback, after the eager pass's measurements."""
    (tmp_path / "afile").write_text("")
    monkeypatch.setattr(bench.speed, "USER_CACHE_DIR", str(tmp_path / "afile" / "cache"))
    monkeypatch.setattr(bench, "run_mode", lambda *a: pytest.fail("measured before the check"))
    with pytest.raises(UserError, match="set TORCHINDUCTOR_CACHE_DIR or XDG_CACHE_HOME to a folder you can write to"):
        bench.main(TINY + ["--compile=both", "--repeats=1", f"--json={tmp_path / 'out' / 'bench.json'}"])
    assert not (tmp_path / "out").exists()


def test_auto_device_never_picks_mps_which_bench_does_not_measure(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)  # as on an Apple machine without CUDA
    cfg, _ = bench.parse_args(bench.DEFAULTS, TINY + ["--device=auto"])
    threads = torch.get_num_threads()
    try:
        assert bench.setup(cfg)[2] == "cpu"
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(UserError, match="does not measure MPS"):
        bench.setup(bench.parse_args(bench.DEFAULTS, TINY + ["--device=mps"])[0])


def test_bench_sets_up_the_hardware_through_train_pys_device_use(monkeypatch):
    """train.py's device and dtype, and its threads: --threads=0 is half the cores, as a run's, not torch's one per
    core."""
    calls, use = [], bench.device.use
    monkeypatch.setattr(bench.device, "use", lambda *a, **kw: calls.append((a, kw)) or use(*a, **kw))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(bench.device, "usable_cores", lambda: 8)
    threads = torch.get_num_threads()
    try:
        got = bench.setup(bench.parse_args(bench.DEFAULTS, TINY + ["--dtype=float32", "--threads=0"])[0])
        assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(threads)
    assert calls == [(("cpu", "float32"), {"mps": False})] and got[2:] == ("cpu", "float32")


def test_profile_shows_the_variant_against_its_baseline(capsys):
    threads = torch.get_num_threads()
    try:
        cfg, _ = bench.parse_args(bench.DEFAULTS, TINY + ["--profile=polynorm", "--profile_steps=1", "--profile_rows=5"])
        averages = bench.profile(cfg)
    finally:
        torch.set_num_threads(threads)
    assert set(averages) == {("gelu", False), ("polynorm", False)}
    out = capsys.readouterr().out
    assert "### gelu (eager)" in out and "### polynorm (eager)" in out and "Self CPU" in out
    # polynorm's formula runs twice a step, its backward recomputing it: one rsqrt per power (3) each time, 1 layer
    rsqrt = {v: sum(e.count for e in averages[(v, False)] if e.key == "aten::rsqrt") for v in ("gelu", "polynorm")}
    assert rsqrt["polynorm"] - rsqrt["gelu"] == 2 * 3


def test_a_profile_written_as_a_list_profiles_its_one_variant():
    """--profile=polynorm, (a list's trailing comma, which the check reads past) is polynorm: it was a KeyError."""
    threads = torch.get_num_threads()
    try:
        cfg, _ = bench.parse_args(bench.DEFAULTS, TINY + ["--profile=polynorm,"])
        bench.setup(cfg)
    finally:
        torch.set_num_threads(threads)
    assert cfg["profile"] == "polynorm"


def test_moe_rows_are_timed_against_their_dense_twin(tmp_path):
    path = tmp_path / "moe.json"
    threads = torch.get_num_threads()
    try:
        bench.main(TINY + ["--variants=gelu", "--n_expert=4", "--top_k=2", "--repeats=3", f"--json={path}"])
    finally:
        torch.set_num_threads(threads)
    rows = {(r["variant"], r["moe"]): r for r in json.loads(path.read_text())["results"]}
    moe, dense = rows[("gelu", True)], rows[("gelu", False)]
    assert moe["params"]["active"] == pytest.approx(dense["params"]["total"], rel=0.02)  # same active weights...
    assert moe["params"]["total"] > 1.5 * dense["params"]["total"]  # ...of a larger model
    assert moe["ratios"]["moe_vs_dense_step_time"] == pytest.approx(
        statistics.median(moe["step_time_s"]["times"]) / statistics.median(dense["step_time_s"]["times"]))
    assert "moe_vs_dense_step_time" not in dense["ratios"]
