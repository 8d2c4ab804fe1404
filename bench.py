"""
Benchmark the FFN variants against each other on one model shape, in one process: time and memory per step, as
ratios to the baseline of each variant's kind measured in the same run.

    python bench.py                                           # every variant, eager and compiled, char-level shape
    python bench.py --variants=polynorm,moa --compile=True    # gelu (and swiglu for gated variants) come along
    python bench.py --profile=polynorm --compile=True         # torch.profiler: top ops by self CPU time vs gelu
    python bench.py --variants=gelu,swiglu --n_expert=8       # MoE models, each also against its dense twin
    python bench.py --device=cuda --dtype=bfloat16 --n_layer=12 --n_head=12 --n_embd=768 --block_size=1024 \\
        --vocab_size=50257 --batch_size=16                    # the ~124M dense model on a GPU

For each variant, eager and compiled, on the same GPT shape and batch: parameters; FLOPs per token (the model's own
count, which leaves out the activation's elementwise work, so variants with the same weights have the same FLOPs and
any difference in time is the activation's); the median and IQR of `repeats` timed steps (forward, backward, AdamW),
interleaved round-robin over the variants so that a burst of load hits every one alike; tokens/s; the bytes autograd
keeps for backward per token (through the compiled graph when compiled) and, on a GPU, the peak memory of a step;
and ratios to the baseline of the variant's kind (gelu or swiglu, always included) measured in the same run. With
--n_expert > 0 every variant is an MoE, timed against its dense twin (the same active weights). Prints a markdown
table; writes everything, raw step times included, to --json. The model keys are GPTConfig's, but ffn.
"""
import dataclasses
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone

import torch

import device as hw
from activations import VARIANTS, baseline_of
import configurator
from configurator import GPTConfig, UserError, check, check_variants, model_config, parse_args, run_cli
from model import GPT
from rundir import write_json

BENCH_DEFAULTS = dict(
    variants="all",  # comma-separated FFN variants, or 'all'; gelu / swiglu are added as baselines
    compile="both",  # True | False | both (eager, then compiled)
    device="auto",  # auto (cuda if available, else cpu) | cpu | cuda | cuda:N
    dtype="auto",  # auto (bfloat16 on a GPU that has it, else float32) | float32 | bfloat16
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
    threads=0,  # CPU threads for torch (0: torch's default); 1 keeps OpenMP threads from waiting on each other
)
# the model keys: every GPTConfig field but ffn, at a shape where the FFN's cost shows on a CPU: the char-level GPT
# of config/shakespeare_char.py widened to d=256, T=256 (vocab 84 is the bundled corpus's alphabet; padded to 128)
MODEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GPTConfig) if f.name != "ffn"}
MODEL_DEFAULTS.update(vocab_size=84, n_layer=4, n_head=4, n_embd=256, block_size=256)
DEFAULTS = {**BENCH_DEFAULTS, **MODEL_DEFAULTS}


def saved_bytes_for_backward(fn, *args):
    """Bytes of activations autograd keeps for backward while running fn(*args): every tensor saved by any op,
    counted once per storage, parameters excluded (they exist anyway). Measured with saved_tensors_hooks."""
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


def resolve(cfg):
    """Check the settings; return (variants incl. baselines in registry order, compile modes, device, dtype)."""
    names = list(VARIANTS)  # registry order: relu, gelu, …, moa, swiglu, …, moa_glu
    asked = names if cfg["variants"] == "all" else check_variants(cfg["variants"])
    wanted = set(asked) | {baseline_of(v) for v in asked}
    variants = [v for v in names if v in wanted]

    modes = {"true": [True], "false": [False], "both": [False, True]}.get(str(cfg["compile"]).lower())
    if modes is None:
        raise UserError(f"--compile expects True, False or both, got '{cfg['compile']}'.")

    # bench measures CPUs and CUDA GPUs only (not Apple's MPS), so here auto means cuda if available, else cpu
    if cfg["device"] == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        device = hw.resolve_device(cfg["device"])
    if device.split(":")[0] not in ("cpu", "cuda"):
        raise UserError(f"--device expects auto, cpu, cuda or cuda:N (bench.py does not measure MPS), got '{device}'.")
    dtype = hw.resolve_dtype(cfg["dtype"], device.split(":")[0])
    if dtype == "float16":  # would need a GradScaler: not worth it for a benchmark
        raise UserError("--dtype expects auto, float32 or bfloat16 (float16 is not benchmarked), got 'float16'.")

    for key in ("batch_size", "repeats", "profile_steps", "block_size", "n_layer", "n_head", "n_embd"):
        if cfg[key] < 1:
            raise UserError(f"--{key} must be at least 1, got {cfg[key]}.")
    if cfg["warmup"] < 1:  # the first step compiles and allocates: it must never be timed
        raise UserError(f"--warmup must be at least 1, got {cfg['warmup']}.")
    if cfg["compile_mode"] not in ("regional", "whole"):
        raise UserError(f"--compile_mode expects regional or whole, got '{cfg['compile_mode']}'.")
    if cfg["profile"]:
        check_variants(cfg["profile"])
    for v in variants:  # the model's and the activations' own checks (n_embd divisible by n_head, poly_order, ...)
        check({**configurator.DEFAULTS, **{k: cfg[k] for k in MODEL_DEFAULTS}, "ffn": v})
    return variants, modes, device, dtype


def set_threads(cfg):
    # before anything is compiled: Inductor's C++ kernels take their OpenMP thread count at compile time
    if cfg["threads"] > 0:
        torch.set_num_threads(cfg["threads"])


class Bench:
    """One model per (variant, mode), all built from the same seed and fed the same batch."""

    def __init__(self, variant, compiled, cfg, device, dtype, dense_twin=False):
        model_args = {k: cfg[k] for k in MODEL_DEFAULTS}
        if dense_twin:  # the dense model with the MoE's active FFN weights (expert width = dense width / top_k)
            model_args["n_expert"] = 0
        self.moe = model_args["n_expert"] > 0
        self.key = (variant, self.moe)
        torch.manual_seed(cfg["seed"])
        self.model = GPT(model_config({**model_args, "ffn": variant})).to(device).train()
        self.variant, self.compiled, self.device = variant, compiled, device
        device_type = device.split(":")[0]
        self.opt = self.model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device_type) if cfg["optimizer"] else None
        # compile_model uses dynamic=False: the variants' shapes differ (gated FFNs are narrower), and Dynamo's
        # automatic dynamic shapes would otherwise recompile a later variant with symbolic sizes: slower kernels
        self.forward = hw.compile_model(self.model, cfg["compile_mode"]) if compiled else self.model
        self.ctx = hw.autocast(device_type, dtype)
        self.times = []

    def step(self, x, y):
        with self.ctx:
            _, loss = self.forward(x, y)
        loss.backward()
        if self.opt is not None:
            self.opt.step()
        self.model.zero_grad(set_to_none=True)

    def saved_bytes(self, x, y):
        """Bytes autograd keeps for backward from one forward (through the compiled graph if compiled)."""
        def fwd(model, x, y):
            with self.ctx:
                return self.forward(x, y)[1]

        nbytes, loss = saved_bytes_for_backward(fwd, self.model, x, y)
        loss.backward()  # frees the graph (and, compiled, builds the backward graph: part of the warm-up)
        self.model.zero_grad(set_to_none=True)
        return nbytes


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def timed_step(b, x, y):
    sync(b.device)
    t0 = time.perf_counter()
    b.step(x, y)
    sync(b.device)
    return time.perf_counter() - t0


def cuda_step_peak(b, x, y):
    """Peak CUDA memory of one training step above what was allocated before it (activations, gradients,
    temporaries), so that the other variants' resident weights do not count."""
    sync(b.device)
    before = torch.cuda.memory_allocated(b.device)
    torch.cuda.reset_peak_memory_stats(b.device)
    b.step(x, y)
    sync(b.device)
    return torch.cuda.max_memory_allocated(b.device) - before


def make_batch(cfg, device):
    g = torch.Generator().manual_seed(cfg["seed"])
    shape = (cfg["batch_size"], cfg["block_size"])
    x = torch.randint(0, cfg["vocab_size"], shape, generator=g)
    y = torch.randint(0, cfg["vocab_size"], shape, generator=g)
    return x.to(device), y.to(device)


def quartiles(times):
    q1, q2, q3 = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else times * 3
    return q1, q2, q3


def run_mode(variants, compiled, cfg, device, dtype, log=print):
    """Measure every variant in one mode (eager or compiled); returns one result dict per variant."""
    x, y = make_batch(cfg, device)
    benches = [Bench(v, compiled, cfg, device, dtype) for v in variants]
    if cfg["n_expert"]:  # an MoE run also times each variant's dense twin, interleaved, for the MoE/dense ratio
        benches += [Bench(v, compiled, cfg, device, dtype, dense_twin=True) for v in variants]
    mode = "compiled" if compiled else "eager"

    saved, peak = {}, {}
    for b in benches:
        t0 = time.perf_counter()
        saved[b.key] = b.saved_bytes(x, y)  # the first forward: compiles, if compiled
        for _ in range(cfg["warmup"]):
            b.step(x, y)
        if device.startswith("cuda"):
            peak[b.key] = cuda_step_peak(b, x, y)
        log(f"{mode:8s} {b.variant:13s}{' MoE' if b.moe else ''} ready in {time.perf_counter() - t0:.1f}s")

    # round-robin: round r starts at variant r mod n, so no variant always runs right after the same neighbour
    n = len(benches)
    for r in range(cfg["repeats"]):
        for i in range(n):
            b = benches[(r + i) % n]
            b.times.append(timed_step(b, x, y))

    tokens = cfg["batch_size"] * cfg["block_size"]
    results = []
    for b in benches:
        q1, med, q3 = quartiles(b.times)
        report = b.model.param_report()
        flops_per_token = b.model.flops_per_token()  # the count model.estimate_mfu uses
        results.append(dict(
            variant=b.variant, moe=b.moe, kind=VARIANTS[b.variant].kind, compile=compiled,
            baseline=baseline_of(b.variant),
            params=report,
            flops_per_token=flops_per_token,
            step_time_s=dict(median=med, q25=q1, q75=q3, iqr=q3 - q1, n=len(b.times), times=b.times),
            tokens_per_s=tokens / med,
            flops_per_s=flops_per_token * tokens / med,
            saved_bytes_per_token=saved[b.key] / tokens,
            cuda_step_peak_bytes=peak.get(b.key),
        ))
    del benches
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return results


def add_ratios(results):
    """Each result's ratios to its baseline measured in the same run and mode (baseline/baseline = 1)."""
    base = {(r["variant"], r["compile"], r["moe"]): r for r in results}
    for r in results:
        b = base[(r["baseline"], r["compile"], r["moe"])]
        r["ratios"] = dict(
            step_time=r["step_time_s"]["median"] / b["step_time_s"]["median"],
            saved_bytes=r["saved_bytes_per_token"] / b["saved_bytes_per_token"],
            cuda_step_peak=(r["cuda_step_peak_bytes"] / b["cuda_step_peak_bytes"]
                            if r["cuda_step_peak_bytes"] is not None else None),
            params_total=r["params"]["total"] / b["params"]["total"],
        )
        twin = base.get((r["variant"], r["compile"], False))
        if r["moe"] and twin is not None:  # MoE against the dense model with the same active parameters
            r["ratios"]["moe_vs_dense_step_time"] = r["step_time_s"]["median"] / twin["step_time_s"]["median"]


def markdown_table(results):
    cuda = any(r["cuda_step_peak_bytes"] is not None for r in results)
    head = ["variant", "compiled", "params", "FFN", "extras", "MFLOP/tok", "step ms (median)", "IQR ms", "tok/s",
            "saved KiB/tok", "vs", "× time", "× saved"] + (["peak MiB", "× peak"] if cuda else [])
    moe = any(r["moe"] for r in results)
    head += ["MoE/dense × time"] if moe else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        p, t, q = r["params"], r["step_time_s"], r["ratios"]
        row = [r["variant"], "yes" if r["compile"] else "no", f"{p['total'] / 1e6:.3f}M", f"{p['ffn'] / 1e6:.3f}M",
               f"{p['extras']:,}", f"{r['flops_per_token'] / 1e6:.1f}", f"{t['median'] * 1e3:.1f}",
               f"{t['iqr'] * 1e3:.1f}", f"{r['tokens_per_s']:,.0f}", f"{r['saved_bytes_per_token'] / 1024:.1f}",
               r["baseline"], f"{q['step_time']:.3f}", f"{q['saved_bytes']:.3f}"]
        if cuda:
            row += [f"{r['cuda_step_peak_bytes'] / 2**20:.0f}", f"{q['cuda_step_peak']:.3f}"]
        if moe:
            row[0] += " (MoE)" if r["moe"] else " (dense)"
            row += [f"{q['moe_vs_dense_step_time']:.3f}" if "moe_vs_dense_step_time" in q else ""]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def machine(device):
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(device)
    else:  # platform.processor() is often empty on Linux: read the CPU's model name where there is one
        name = platform.processor() or platform.machine()
        if os.path.exists("/proc/cpuinfo"):
            with open("/proc/cpuinfo") as f:
                name = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), name)
    return dict(device=device, device_name=name, cpu_count=os.cpu_count(), torch_threads=torch.get_num_threads(),
                torch=torch.__version__, python=platform.python_version(), platform=platform.platform())


def benchmark(cfg, log=print):
    """Run the benchmark for a resolved config dict; returns the JSON-able report."""
    variants, modes, device, dtype = resolve(cfg)
    set_threads(cfg)
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    # 15 variants run the same GPT.forward code with different modules: every one is a recompile of that frame,
    # and past Dynamo's default limit of 8 it would silently fall back to eager
    # (the option is named cache_size_limit before torch 2.7)
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 4 * len(variants)))
    load_before = os.getloadavg()
    t0 = time.time()
    results = []
    for compiled in modes:
        results += run_mode(variants, compiled, cfg, device, dtype, log)
    add_ratios(results)
    return dict(
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command="python bench.py " + " ".join(cfg.get("_argv", [])),
        machine=machine(device),
        load_average=dict(start=load_before, end=os.getloadavg()),  # other processes on the machine add noise
        wall_s=time.time() - t0,
        settings={k: cfg[k] for k in BENCH_DEFAULTS} | dict(device=device, dtype=dtype),
        model={k: cfg[k] for k in MODEL_DEFAULTS},
        tokens_per_step=cfg["batch_size"] * cfg["block_size"],
        results=results,
    )


def profile(cfg, log=print):
    """What one variant's step spends its time on, next to its baseline's: torch.profiler's top ops by self CPU time
    (and self CUDA time on a GPU), in each compile mode asked for. Returns {(variant, compiled): key_averages}."""
    from torch.profiler import ProfilerActivity

    _, modes, device, dtype = resolve(cfg)
    set_threads(cfg)
    variant = cfg["profile"]
    pair = [baseline_of(variant), variant] if baseline_of(variant) != variant else [variant]
    # name every Inductor C++ kernel in the trace; otherwise a compiled graph shows as one opaque call
    torch._inductor.config.cpp.enable_kernel_profile = True
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    x, y = make_batch(cfg, device)
    averages = {}
    for compiled in modes:
        for v in pair:
            b = Bench(v, compiled, cfg, device, dtype)
            for _ in range(cfg["warmup"] + 1):
                b.step(x, y)
            with torch.profiler.profile(activities=activities) as prof:
                for _ in range(cfg["profile_steps"]):
                    b.step(x, y)
                sync(device)
            avg = prof.key_averages()
            averages[(v, compiled)] = avg
            total = sum(e.self_cpu_time_total for e in avg) / cfg["profile_steps"] / 1e3
            log(f"\n### {v} ({'compiled' if compiled else 'eager'}): self CPU time {total:.1f} ms per step "
                f"(mean of {cfg['profile_steps']} profiled steps)")
            log(avg.table(sort_by="self_cpu_time_total", row_limit=cfg["profile_rows"], max_name_column_width=60))
            if device.startswith("cuda"):
                log(avg.table(sort_by="self_cuda_time_total", row_limit=cfg["profile_rows"], max_name_column_width=60))
    return averages


def main(argv):
    cfg, _ = parse_args(DEFAULTS, argv, prog="bench.py", doc=__doc__.split("\n\n")[1])
    cfg["_argv"] = list(argv)
    if cfg["profile"]:
        profile(cfg)
        return
    report = benchmark(cfg, log=lambda s: print(s, file=sys.stderr))
    m = report["machine"]
    print(f"\n{m['device_name']} ({m['device']}, {m['cpu_count']} CPUs, {m['torch_threads']} torch threads), "
          f"torch {m['torch']}, {report['settings']['dtype']}, batch {cfg['batch_size']}×{cfg['block_size']} tokens, "
          f"{cfg['repeats']} interleaved repeats after {cfg['warmup']} warm-up steps, load average "
          f"{report['load_average']['start'][0]:.2f} → {report['load_average']['end'][0]:.2f}\n")
    print(markdown_table(report["results"]))
    write_report(cfg, report)


def write_report(cfg, report):
    if cfg["json"]:
        os.makedirs(os.path.dirname(cfg["json"]) or ".", exist_ok=True)
        write_json(cfg["json"], report)
        print(f"\nwrote {cfg['json']}", file=sys.stderr)


if __name__ == "__main__":
    run_cli(main)
