"""bench.py's JSON reports the model's own parameter counts and ratios against the baseline
measured in the same run. Tiny shapes, eager only, a few repeats: seconds, not minutes."""
import json
import statistics

import pytest
import torch

import bench
from configurator import UserError
from model import GPT, GPTConfig

TINY = ["--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=2", "--vocab_size=84",
        "--compile=False", "--device=cpu", "--threads=1", "--warmup=1"]


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
        # FLOPs per token: 6·N + 12·L·H·Q·T, counted here independently of bench and model.estimate_mfu
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


def test_user_mistakes_are_one_sentence_errors():
    for args, words in [(["--variants=gelu,nope"], "unknown ffn"), (["--compile=maybe"], "--compile"),
                        (["--n_head=3"], "divisible"), (["--profile=nope"], "--profile")]:
        with pytest.raises(UserError, match=words):
            bench.main(TINY + ["--repeats=1", "--json="] + args)


def test_auto_device_never_picks_mps_which_bench_does_not_measure(monkeypatch):
    import common
    monkeypatch.setattr(common, "mps_available", lambda: True)  # as on an Apple machine without CUDA
    cfg, _ = bench.parse_args(bench.DEFAULTS, TINY + ["--device=auto"])
    assert bench.resolve(cfg)[2] == "cpu"
    with pytest.raises(UserError, match="does not measure MPS"):
        bench.resolve(bench.parse_args(bench.DEFAULTS, TINY + ["--device=mps"])[0])


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
    # polynorm's recomputing backward shows up as its own autograd node
    assert any("PolyFunction" in e.key for e in averages[("polynorm", False)])


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


def probe_result(variant, mode, cache, seconds, hits=0, round=0):
    """One compile probe's record as compile_probe and run_probe write it."""
    return dict(variant=variant, mode=mode, cache=cache, round=round, wall_compile_s=seconds, step_s=0.5, graphs=2,
                compile_call_s=1.0 + round,
                fx_cache_hit=hits, fx_cache_miss=3 - hits, aot_cache_hit=min(hits, 2), aot_cache_miss=2 - min(hits, 2))


def test_compile_table_gives_medians_over_rounds_and_their_ratios():
    cold = {"regional": [10.0, 14.0, 11.0], "whole": [30.0, 20.0, 24.0]}  # medians 11 and 24
    warm = {"regional": [2.0, 1.0, 9.0], "whole": [3.0, 3.0, 3.0]}  # medians 2 and 3
    results = [probe_result("moa", mode, cache, s[mode][i], hits=3 if cache == "warm" else 0, round=i)
               for i in range(3) for cache, s in (("cold", cold), ("warm", warm)) for mode in ("regional", "whole")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in bench.compile_table(results).splitlines()]
    rows = {row[1]: row for row in cells[2:]}
    assert rows["regional"][2:6] == ["11.0 (10.0-14.0)", "2.0 (1.0-9.0)", f"{2 / 11:.2f}", f"{11 / 24:.2f}"]
    assert rows["whole"][2:6] == ["24.0 (20.0-30.0)", "3.0 (3.0-3.0)", f"{3 / 24:.2f}", "1.00"]
    assert rows["regional"][6:8] == ["2.0", "500.0"]  # import: median of 1, 2, 3 (cold) and 1, 2, 3 (warm)
    assert rows["regional"][9:12] == ["9/9", "6/6", "3"]  # FX and AOT hits summed over the 3 warm rounds


def test_a_cold_probe_that_finds_its_graphs_cached_is_refused(monkeypatch):
    # a cold compile time measured on a cache that already held the graphs would be a load time
    monkeypatch.setattr(bench, "in_fresh_process",
                        lambda *a: json.dumps(probe_result("gelu", "regional", "cold", 3.0, hits=3)))
    with pytest.raises(RuntimeError, match="did not compile from scratch"):
        bench.run_probe({}, "gelu", "regional", "/nonexistent", "cold")
    assert bench.run_probe({}, "gelu", "regional", "/nonexistent", "warm")["fx_cache_hit"] == 3
