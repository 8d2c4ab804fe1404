"""
Placing a comparison's runs on the visible GPUs, or handing them to another scheduler, round by round (--plan until it
prints nothing, then --report):

    while python compare.py ... --plan > plan.txt && [ -s plan.txt ]; do   # the exact command of each run to do now
        xargs -d '\\n' -n 1 -P 4 sh -c < plan.txt       # or one Slurm array task per line, on a shared filesystem
    done
    python compare.py ... --report                     # the summary and pictures from the finished run directories

A comparison without a sweep is one round. A sweep's verdict (each variant at its best rate, on fresh seeds) waits
for the sweep's runs, and with --lr_extend each step beyond an edge of the rates for the steps before it
(compare.plan_rounds); every --plan that lists runs says how many rounds to expect at most.
"""
import os
import shlex
import sys

from configurator import memory_needs
from machinery.cli import UserError


def visible_gpus():
    """The GPUs this process may use, by the names a child's CUDA_VISIBLE_DEVICES must give them: the entries of our
    own CUDA_VISIBLE_DEVICES (indices, UUIDs or MIG ids) when it is set, else 0..n-1."""
    import torch
    n = torch.cuda.device_count()  # counts only the usable entries of CUDA_VISIBLE_DEVICES
    env = os.environ.get('CUDA_VISIBLE_DEVICES')
    names = [d.strip() for d in env.split(',')] if env is not None else [str(i) for i in range(n)]
    return names[:n]


# Runs on one GPU at the most. Not yet measured: without NVIDIA's MPS the kernels of several processes take turns on
# the GPU rather than run at once, so what sharing gains is the time each run's Python spends between its launches.
MAX_SHARE = 8
# a micro-step of fewer FLOPs than this (its kernels' sizes, whatever the accumulation) takes a few milliseconds of a
# current GPU's matmul peak: the Python that launches its kernels sets its pace, not the GPU
SHARE_BELOW_FLOPS = 1e12
CONTEXT_BYTES = 0.5 * 2**30  # an estimate of each process's CUDA context and cuBLAS/cuDNN workspaces (0.3-0.6 GiB)


def peak_memory(cfg, c):
    """An estimate of a run's peak memory in bytes, which a GPU's runs share: the lower bound (memory_needs) and the
    activations kept for backward: 34·d bytes a token and layer in 16-bit (Korthikanti et al. 2022, "Reducing
    Activation Recomputation in Large Transformer Models", with flash attention's memory), less its two 1-byte dropout
    masks, plus 4·d as the two norms' inputs are the fp32 residual stream under autocast: 36·d; in fp32, 64·d (32·d of
    16-bit values, doubled). At GPT-2 small's shape (bench.py, batch 16 x 1024, bf16) that is 9.98 GiB against a
    measured peak of 10.55 GiB (BENCHMARKS.md, GPU); other shapes are not measured."""
    activations = cfg['batch_size'] * cfg['block_size'] * c.n_layer * c.n_embd * (
        64 if cfg['dtype'] == 'float32' else 36)
    return sum(memory_needs(cfg, c)) + activations


def resolve_jobs(cfg, n_runs, step_flops, need_bytes):
    """Where n_runs runs of a comparison train and how many at a time: (GPUs to place them on by CUDA_VISIBLE_DEVICES,
    runs at a time, each run's CPU threads (0: the environment's), a line saying so). On GPUs, --jobs or one run per
    nproc_per_run GPUs, and several per GPU for one-process runs whose micro-step (step_flops) is too small to fill it
    and whose memory estimate (need_bytes, and a CUDA context each) fits, up to MAX_SHARE, each with its share of the
    CPU cores; --device=cuda:N runs them all on that GPU (each run's own set-up, no placement). On a CPU, --jobs or
    one run per --threads cores per process (tiny models train fastest so), else 1."""
    import torch
    from machinery.device import usable_cores
    device, nproc, threads = cfg['device'], cfg['nproc_per_run'], cfg['threads']
    gpus = visible_gpus() if device in ('auto', 'cuda') else []
    n_gpus = len(gpus) or int(device.startswith('cuda:'))
    cores = usable_cores()
    if not n_gpus:
        jobs = cfg['jobs'] or (max(1, cores // (threads * nproc)) if threads else 1)
        return [], jobs, threads, f"{min(jobs, n_runs)} at a time"
    if nproc > n_gpus:
        raise UserError(f"--nproc_per_run={nproc} needs {nproc} GPUs per run but {n_gpus} are visible; lower it.")
    where = f"GPU{'s' * (n_gpus > 1)} {','.join(gpus) or device.partition(':')[2]}"
    if cfg['jobs']:
        return gpus, cfg['jobs'], threads, f"{min(cfg['jobs'], n_runs)} at a time on {where} (--jobs)"
    total = torch.cuda.get_device_properties(int(device.partition(':')[2] or 0)).total_memory
    per_gpu = min(MAX_SHARE, max(1, cores // n_gpus), int(0.9 * total // (need_bytes + CONTEXT_BYTES)))
    if nproc > 1 or step_flops >= SHARE_BELOW_FLOPS or per_gpu < 2:
        return gpus, n_gpus // nproc, threads, f"{min(n_gpus // nproc, n_runs)} at a time on {where}"
    threads = threads or max(1, cores // (per_gpu * n_gpus))  # so that the runs beside each other share the cores
    return gpus, per_gpu * n_gpus, threads, (
        f"{min(per_gpu * n_gpus, n_runs)} at a time on {where}, up to {per_gpu} per GPU, {threads} CPU thread(s) each: "
        f"a micro-step of {step_flops:.2g} FLOPs is too small to fill a GPU, and each run needs about "
        f"{(need_bytes + CONTEXT_BYTES) / 2**30:.2g} GiB of its {total / 2**30:.0f} GiB (an estimate, with its CUDA "
        f"context); --jobs sets the number")


def slots(jobs, gpus, nproc):
    """The GPUs of each of `jobs` runs at a time: groups of nproc GPUs (one per DDP process) dealt round robin, so 8
    runs on 4 GPUs are 2 per GPU; None per slot when there are no GPUs to place on."""
    if not gpus:
        return [None] * jobs
    groups = [gpus[i:i + nproc] for i in range(0, len(gpus) - nproc + 1, nproc)]
    return [groups[s % len(groups)] for s in range(jobs)]


def gpu_env(gpus):
    """CUDA_VISIBLE_DEVICES naming exactly a run's GPUs (which it then sees as cuda:0, cuda:1, ...)."""
    return {} if gpus is None else {'CUDA_VISIBLE_DEVICES': ','.join(gpus)}


def thread_env(threads):
    """The thread count of a run's OpenMP and MKL pools and of Inductor's compile workers, which would otherwise start
    one per core in every run (0: the environment's own)."""
    keys = ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'TORCHINDUCTOR_COMPILE_THREADS')
    return {k: str(threads) for k in keys} if threads else {}


def print_plan(commands, n_runs, threads, rounds):
    """--plan: the command of every run still to do now (runs.command_line), each on a line of stdout; what to do next
    on stderr. rounds: how many rounds of runs the comparison's --plan lists at most."""
    prefix = ''.join(f"{k}={v} " for k, v in thread_env(threads).items())
    for command in commands:
        print(prefix + shlex.join(command))
    run_them = "; run these lines anywhere that sees this filesystem, then the same command"
    print(f"compare: {len(commands)} of {n_runs} runs to do" + (
        ", all finished: --report instead of --plan builds the summary" if not commands else
        f"{run_them} with --report instead of --plan builds the summary" if rounds == 1 else
        f"{run_them} again until it prints nothing (its runs come in at most {rounds} rounds, each listed once those "
        f"before it are done), then with --report instead of --plan it builds the summary"), file=sys.stderr)
