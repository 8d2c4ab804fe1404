"""
Benchmark the FFN variants against each other on one model shape, in one process: time and memory per step, as
ratios to the baseline of each variant's kind measured in the same run.

    python bench.py                                           # every variant, eager and compiled, char-level shape
    python bench.py --variants=polynorm,moa --compile=True    # gelu (and swiglu for gated variants) come along
    python bench.py --profile=polynorm --compile=True         # torch.profiler: top ops by self CPU time vs gelu
    python bench.py --variants=gelu,swiglu --n_expert=8       # MoE models, each also against its dense twin
    python bench.py --device=cuda --dtype=bfloat16 --n_layer=12 --n_head=12 --n_embd=768 --block_size=1024 \\
        --vocab_size=50257 --batch_size=16                    # the ~124M dense model on a GPU

Per variant and compile mode, on one GPT shape and batch: parameters; FLOPs per token (the model's count, without the
activation's elementwise work: at equal weights a time difference is the activation's); median and IQR of `repeats`
steps (forward, backward, AdamW) timed round-robin, so that a burst of load hits all variants alike; tokens/s; bytes
kept for backward per token (through the compiled graph when compiled); on a GPU a step's peak memory; ratios to the
kind's baseline (gelu or swiglu, always included). --n_expert > 0 makes every variant an MoE, also timed against its
dense twin (the same active weights). Prints a markdown table; --json gets it all, raw step times too.
"""
from machinery.cli import quiet_interrupt  # first of all: a Ctrl-C while torch imports ends as quietly as one later
quiet_interrupt(__name__)
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone

import torch

import configurator
from activations import VARIANTS, baseline_of
from comparison.runs import check_variants
from configurator import check, model_config
from machinery import device, speed
from machinery.cli import UserError, parse_args, run_cli
from machinery.files import check_writable, write_json
from model import GPT

BENCH_DEFAULTS = dict(
    variants="all",  # comma-separated FFN variants, or 'all'; gelu / swiglu are added as baselines
    compile="both",  # True | False | both (eager, then compiled)
    device="auto",  # auto (cuda if available, else cpu) | cpu | cuda | cuda:N
    dtype="auto",  # auto (train.py's; float16 below compute capability 8.0 is refused) | float32 | bfloat16
    batch_size=8,
    warmup=3,  # untimed steps per variant first (the first of them compiles)
    repeats=30,  # timed steps per variant, interleaved round-robin across the variants
    optimizer=True,  # include the AdamW step in the timed step (as a training iteration does)
    json="out-bench/bench.json",  # where to write the results ('' for nowhere)
    profile="",  # a variant: instead of the benchmark, profile it and its baseline with torch.profiler
    profile_steps=5,  # profiled steps per model
    profile_rows=15,  # rows of the profiler's table
    seed=1337,
    compile_mode="regional",  # regional (every Block) | whole (the GPT): what --compile=True compiles
    threads=0,  # torch's CPU threads, as train.py's (0: OMP_NUM_THREADS where set, else half the cores)
    peak_flops=0.0,  # FLOP/s for MFU; 0 = from the GPU's name (speed.PEAK_FLOPS), else no MFU
)
# the model keys: GPTConfig's but ffn, at a shape where the FFN's cost shows on a CPU: the char-level GPT of
# config/shakespeare_char.py widened to d=256, T=256 (vocab 84 is the bundled corpus's alphabet; padded to 128)
MODEL_DEFAULTS = {k: configurator.DEFAULTS[k] for k in configurator.keys_that("model") if k != "ffn"}
MODEL_DEFAULTS.update(vocab_size=84, n_layer=4, n_head=4, n_embd=256, block_size=256)
DEFAULTS = {**BENCH_DEFAULTS, **MODEL_DEFAULTS}


def saved_bytes_for_backward(fn, *args):
    """(bytes autograd saves for backward in fn(*args), each storage once, Module args' parameters excluded; output)."""
    params = {p.untyped_storage().data_ptr() for a in args if isinstance(a, torch.nn.Module) for p in a.parameters()}
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return sum(storages.values()), out


def bare_variants(text, key):
    """The variants named in a comma-separated setting, each by its bare name: bench measures every variant at the one
    set of model settings given (--moa_gate=softmax), not a comparison's variant with settings of its own."""
    labels = check_variants(text)
    if own := [v for v in labels if v not in VARIANTS]:
        raise UserError(f"--{key}: bench.py measures every variant at the same model settings; name "
                        f"{own[0].partition(':')[0]} alone and give its settings as --key=value, not '{own[0]}'.")
    return labels


def setup(cfg):
    """Check the settings and make the process-wide ones every measurement runs under; return (variants and their
    baselines in registry order, compile modes, device, dtype)."""
    asked = list(VARIANTS) if cfg["variants"] == "all" else bare_variants(cfg["variants"], "variants")
    wanted = set(asked) | {baseline_of(v) for v in asked}
    variants = [v for v in VARIANTS if v in wanted]
    modes = {"true": [True], "false": [False], "both": [False, True]}.get(str(cfg["compile"]).lower())
    if modes is None:
        raise UserError(f"--compile expects True, False or both, got '{cfg['compile']}'.")
    # bench measures CPUs and CUDA GPUs, not Apple's MPS
    if cfg["device"] == "mps":
        raise UserError("--device expects auto, cpu, cuda or cuda:N (bench.py does not measure MPS), got 'mps'.")
    # warmup: the first step compiles and allocates, never timed; vocab_size: bench has no dataset to take one from
    for key in ("repeats", "profile_steps", "warmup", "vocab_size"):
        if cfg[key] < 1:
            raise UserError(f"--{key} must be at least 1, got {cfg[key]}.")
    if cfg["profile"]:
        named = bare_variants(cfg["profile"], "profile")
        if len(named) > 1:
            raise UserError(f"--profile takes one variant, got '{cfg['profile']}'.")
        cfg["profile"] = named[0]  # as the list reads it: --profile=gelu, names gelu
    if cfg["n_expert"] and cfg["expert_hidden"]:  # the ratio to the twin would compare other FFN widths
        raise UserError("--expert_hidden sets the experts' width apart from the dense model's, so an MoE has no dense "
                        "twin of its active weights to be measured against; leave it at 0 (the dense width / top_k), "
                        "or change both with --ffn_mult.")
    # train.py's checks of the keys bench shares: the model's and each activation's, batch_size, threads...
    shared = {**configurator.DEFAULTS,
              **{k: cfg[k] for k in (*MODEL_DEFAULTS, "batch_size", "compile_mode", "threads", "peak_flops")}}
    for v in variants:
        check({**shared, "ffn": v})
    device.set_threads(cfg["threads"])  # before compiling: Inductor's C++ kernels take their OpenMP thread count then
    dev, dtype = device.use(cfg["device"], cfg["dtype"], mps=False)  # train.py's device; auto never picks MPS
    if dtype == "float16":  # float16 trains with a loss scaler, which bench's step leaves out
        raise UserError(f"bench.py measures float32 and bfloat16, not float16 (--dtype={cfg['dtype']} on "
                        f"{dev}); pass --dtype=float32.")
    if True in modes:  # before the eager pass: a GPU Triton cannot compile for or a cache Inductor cannot write to
        speed.check_compile(dev.split(":")[0])  # would end the command after it
        speed.check_compile_cache()
    if cfg["json"] and not cfg["profile"]:  # the report goes there: say so before the work, after the settings
        if os.path.isdir(cfg["json"]):
            raise UserError(f"--json={cfg['json']} is a folder; give the report a file name, e.g. "
                            f"--json={os.path.join(cfg['json'], 'bench.json')}.")
        check_writable(os.path.dirname(cfg["json"]) or ".", create=True)
    # every variant recompiles the same GPT.forward frame: past Dynamo's limit (8) it would silently run eager
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"  # torch < 2.7
    setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 4 * len(variants)))
    return variants, modes, dev, dtype


class Bench:
    """One model per (variant, mode), all built from the same seed and fed the same batch."""

    def __init__(self, variant, compiled, cfg, dev, dtype, dense_twin=False):
        # a dense twin: the dense model with the MoE's active FFN weights (expert width = dense width / top_k)
        model_args = {k: cfg[k] for k in MODEL_DEFAULTS} | ({"n_expert": 0} if dense_twin else {})
        self.variant, self.device, self.moe = variant, dev, model_args["n_expert"] > 0
        torch.manual_seed(cfg["seed"])
        self.model = GPT(model_config({**model_args, "ffn": variant})).to(dev).train()
        device_type = dev.split(":")[0]
        self.opt = self.model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device_type) if cfg["optimizer"] else None
        # compile_model's dynamic=False: gated variants are narrower, and symbolic sizes would make slower kernels
        self.forward = speed.compile_model(self.model, cfg["compile_mode"]) if compiled else self.model
        self.ctx = device.autocast(device_type, dtype)
        self.times, self.saved, self.peak = [], None, None  # saved, peak: measured by warm_up

    def loss(self, x, y):
        with self.ctx:
            return self.forward(x, y)[1]

    def step(self, x, y):
        self.loss(x, y).backward()
        if self.opt is not None:
            self.opt.step()
        self.model.zero_grad(set_to_none=True)

    def sync(self):
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)

    def timed_step(self, x, y):
        self.sync()
        t0 = time.perf_counter()
        self.step(x, y)
        self.sync()
        return time.perf_counter() - t0

    def warm_up(self, x, y, steps):
        """Untimed: the first forward (compiling, if compiled) counts the bytes kept for backward; on a GPU a last step
        measures the peak memory above what was allocated before it, so that other variants' weights do not count."""
        self.saved, loss = saved_bytes_for_backward(lambda _: self.loss(x, y), self.model)
        loss.backward()  # frees the graph (compiled: builds the backward graph)
        self.model.zero_grad(set_to_none=True)
        for _ in range(steps):
            self.step(x, y)
        if self.device.startswith("cuda"):
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.timed_step(x, y)
            self.peak = torch.cuda.max_memory_allocated(self.device) - before


def make_batch(cfg, dev):
    g = torch.Generator().manual_seed(cfg["seed"])
    shape = (cfg["batch_size"], cfg["block_size"])
    return [torch.randint(0, cfg["vocab_size"], shape, generator=g).to(dev) for _ in range(2)]  # x, y


def run_mode(variants, compiled, cfg, dev, dtype):
    """Measure every variant in one mode (eager or compiled): one result dict per variant."""
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()  # the previous mode's models are gone: hand back their memory
    x, y = make_batch(cfg, dev)
    benches = [Bench(v, compiled, cfg, dev, dtype) for v in variants]
    if cfg["n_expert"]:  # an MoE run also times each variant's dense twin, interleaved, for the MoE/dense ratio
        benches += [Bench(v, compiled, cfg, dev, dtype, dense_twin=True) for v in variants]
    mode = "compiled" if compiled else "eager"
    for b in benches:
        t0 = time.perf_counter()
        b.warm_up(x, y, cfg["warmup"])
        print(f"{mode:8s} {b.variant:13s}{' MoE' if b.moe else ''} ready in {time.perf_counter() - t0:.1f}s",
              file=sys.stderr)
    # round-robin: round r starts at variant r mod n, so no variant always runs right after the same neighbour
    for r in range(cfg["repeats"]):
        k = r % len(benches)
        for b in benches[k:] + benches[:k]:
            b.times.append(b.timed_step(x, y))
    tokens = cfg["batch_size"] * cfg["block_size"]
    peak = speed.peak_flops(dev.split(":")[0], dtype, cfg["peak_flops"])
    results = []
    for b in benches:
        q1, med, q3 = statistics.quantiles(b.times, n=4, method="inclusive") if len(b.times) > 1 else b.times * 3
        flops = b.model.flops_per_token()  # the count model.estimate_mfu uses
        results.append(dict(
            variant=b.variant, moe=b.moe, kind=VARIANTS[b.variant].kind, compile=compiled,
            baseline=baseline_of(b.variant), params=b.model.param_report(), flops_per_token=flops,
            step_time_s=dict(median=med, q25=q1, q75=q3, iqr=q3 - q1, n=len(b.times), times=b.times),
            tokens_per_s=tokens / med, flops_per_s=flops * tokens / med, mfu=flops * tokens / med / peak if peak else None,
            saved_bytes_per_token=b.saved / tokens, cuda_step_peak_bytes=b.peak))
    return results


def add_ratios(results):
    """Each result's ratios to its baseline measured in the same run and mode (baseline/baseline = 1)."""
    rows = {(r["variant"], r["compile"], r["moe"]): r for r in results}
    for r in results:
        b = rows[(r["baseline"], r["compile"], r["moe"])]
        peak = r["cuda_step_peak_bytes"]
        r["ratios"] = dict(
            step_time=r["step_time_s"]["median"] / b["step_time_s"]["median"],
            saved_bytes=r["saved_bytes_per_token"] / b["saved_bytes_per_token"],
            cuda_step_peak=None if peak is None else peak / b["cuda_step_peak_bytes"],
            params_total=r["params"]["total"] / b["params"]["total"])
        if r["moe"]:  # against its dense twin (run_mode times one for every MoE): the same active parameters
            twin = rows[(r["variant"], r["compile"], False)]
            r["ratios"]["moe_vs_dense_step_time"] = r["step_time_s"]["median"] / twin["step_time_s"]["median"]


def markdown_table(results):
    cuda = any(r["cuda_step_peak_bytes"] is not None for r in results)
    moe = any(r["moe"] for r in results)
    rows = []
    for r in results:
        p, t, q = r["params"], r["step_time_s"], r["ratios"]
        row = {"variant": r["variant"] + ((" (MoE)" if r["moe"] else " (dense)") if moe else ""),
               "compiled": "yes" if r["compile"] else "no", "params": f"{p['total'] / 1e6:.3f}M",
               "FFN": f"{p['ffn'] / 1e6:.3f}M", "extras": f"{p['extras']:,}",
               "MFLOP/tok": f"{r['flops_per_token'] / 1e6:.1f}", "step ms (median)": f"{t['median'] * 1e3:.1f}",
               "IQR ms": f"{t['iqr'] * 1e3:.1f}", "tok/s": f"{r['tokens_per_s']:,.0f}",
               "saved KiB/tok": f"{r['saved_bytes_per_token'] / 1024:.1f}", "vs": r["baseline"],
               "× time": f"{q['step_time']:.3f}", "× saved": f"{q['saved_bytes']:.3f}"}
        if cuda:
            row |= {"peak MiB": f"{r['cuda_step_peak_bytes'] / 2**20:.0f}", "× peak": f"{q['cuda_step_peak']:.3f}",
                    "MFU": f"{r['mfu']:.1%}" if r["mfu"] is not None else "–"}
        if moe:
            row["MoE/dense × time"] = f"{q['moe_vs_dense_step_time']:.3f}" if r["moe"] else ""
        rows.append(row)
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    return "\n".join(lines + ["| " + " | ".join(row.values()) + " |" for row in rows])


def machine(dev):
    if dev.startswith("cuda"):
        name = torch.cuda.get_device_name(dev)
    else:  # platform.processor() is often empty on Linux: read the CPU's model name where there is one
        name = platform.processor() or platform.machine()
        if os.path.exists("/proc/cpuinfo"):
            with open("/proc/cpuinfo") as f:
                name = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), name)
    return dict(device=dev, device_name=name, cpu_count=os.cpu_count(), torch_threads=torch.get_num_threads(),
                torch=torch.__version__, python=platform.python_version(), platform=platform.platform())


def benchmark(cfg, argv):
    """The benchmark of a parsed config (from the command line argv): the JSON-able report."""
    variants, modes, dev, dtype = setup(cfg)
    load_before = os.getloadavg()
    t0 = time.time()
    results = [r for compiled in modes for r in run_mode(variants, compiled, cfg, dev, dtype)]
    add_ratios(results)
    return dict(
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command="python bench.py " + " ".join(argv), machine=machine(dev),
        load_average=dict(start=load_before, end=os.getloadavg()),  # other processes on the machine add noise
        wall_s=time.time() - t0, settings={k: cfg[k] for k in BENCH_DEFAULTS} | dict(device=dev, dtype=dtype),
        model={k: cfg[k] for k in MODEL_DEFAULTS}, tokens_per_step=cfg["batch_size"] * cfg["block_size"],
        results=results)


def profile(cfg):
    """What one variant's step spends its time on, next to its baseline's: torch.profiler's top ops by self CPU time
    (and self CUDA time on a GPU), in each compile mode asked for. Returns {(variant, compiled): key_averages}."""
    _, modes, dev, dtype = setup(cfg)
    pair = list(dict.fromkeys([baseline_of(cfg["profile"]), cfg["profile"]]))  # baseline first; once if equal
    # name every Inductor C++ kernel in the trace; otherwise a compiled graph shows as one opaque call
    torch._inductor.config.cpp.enable_kernel_profile = True
    cuda = dev.startswith("cuda")
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    x, y = make_batch(cfg, dev)
    averages = {}
    for compiled in modes:
        for v in pair:
            b = Bench(v, compiled, cfg, dev, dtype)
            b.warm_up(x, y, cfg["warmup"])
            with torch.profiler.profile(activities=activities) as prof:
                for _ in range(cfg["profile_steps"]):
                    b.step(x, y)
                b.sync()
            avg = averages[(v, compiled)] = prof.key_averages()
            total = sum(e.self_cpu_time_total for e in avg) / cfg["profile_steps"] / 1e3
            print(f"\n### {v} ({'compiled' if compiled else 'eager'}): self CPU time {total:.1f} ms per step "
                  f"(mean of {cfg['profile_steps']} profiled steps)")
            for key in ["self_cpu_time_total"] + (["self_cuda_time_total"] if cuda else []):
                print(avg.table(sort_by=key, row_limit=cfg["profile_rows"], max_name_column_width=60))
    return averages


def main(argv):
    cfg, _ = parse_args(DEFAULTS, argv, prog="bench.py", doc=__doc__.split("\n\n", 1)[1],  # examples, columns
                        notes=[sys.modules[GPT.__module__].__file__, __file__])  # GPTConfig's, then its own
    if cfg["profile"]:
        profile(cfg)
        return
    report = benchmark(cfg, argv)
    m = report["machine"]
    print(f"\n{m['device_name']} ({m['device']}, {m['cpu_count']} CPUs, {m['torch_threads']} torch threads), "
          f"torch {m['torch']}, {report['settings']['dtype']}, batch {cfg['batch_size']}×{cfg['block_size']} tokens, "
          f"{cfg['repeats']} interleaved repeats after {cfg['warmup']} warm-up steps, load average "
          f"{report['load_average']['start'][0]:.2f} → {report['load_average']['end'][0]:.2f}\n")
    print(markdown_table(report["results"]))
    print("\n× time, × saved (× peak on a GPU): the variant's over its baseline's (vs), measured in this run; "
          "MoE/dense × time: an MoE's over its dense twin's; params counts every weight, MFLOP/tok (and MFU) an MoE's "
          "active ones.")
    if cfg["json"]:
        write_json(cfg["json"], report)
        print(f"\nwrote {cfg['json']}", file=sys.stderr)


if __name__ == "__main__":
    run_cli(main)
