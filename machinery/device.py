"""
Where a command computes, in one place: its device, precision and TF32 (use), and its CPU threads (set_threads). A
training process among torchrun's is distributed.py; how fast a run trains (torch.compile, MFU's peak FLOP/s) is
speed.py.
"""
import os
from contextlib import nullcontext

import torch

from machinery.cli import UserError

DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}


def resolve_device(name, mps=True):
    """'auto' picks cuda, then mps (unless mps=False), then cpu; an explicit choice must exist on this machine. A GPU
    is always named with its index: 'cuda' is cuda:0, the first GPU this process sees."""
    if name == 'auto':
        name = 'cuda' if torch.cuda.is_available() else 'mps' if mps and torch.backends.mps.is_available() else 'cpu'
    kind, colon, index = name.partition(':')
    # isascii: '²' and '０' pass isdigit() but name no GPU
    if kind not in ('cpu', 'cuda', 'mps') or (colon and not (kind == 'cuda' and index.isascii() and index.isdigit())):
        raise UserError(f"--device expects auto, cpu, cuda, cuda:N or mps, got '{name}'.")
    if kind == 'cuda' and not torch.cuda.is_available():
        raise UserError("--device=cuda but no CUDA GPU is available here; use --device=cpu (or auto).")
    if index and int(index) >= (n := torch.cuda.device_count()):
        raise UserError(f"--device={name} but this machine has {n} CUDA GPU(s), cuda:0 to cuda:{n - 1}; choose one.")
    if kind == 'mps' and not torch.backends.mps.is_available():
        raise UserError("--device=mps but MPS is not available here; use --device=cpu (or auto).")
    return 'cuda:0' if name == 'cuda' else name


def usable_cores():
    """The CPU cores this process may use (a Slurm job's or taskset's, not the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1


def set_threads(threads):
    """Set torch's CPU threads: --threads, else OMP_NUM_THREADS where set (torchrun and compare.py set it), else half
    the cores. torch's own default, a thread per core, spins in OpenMP's wait and runs many times slower beside any
    other busy process (a browser, a second run): BENCHMARKS.md, "CPU threads". Returns what was chosen, in words."""
    cores, why = usable_cores(), '--threads'
    if threads < 0:
        raise UserError(f"--threads must not be negative, got {threads}.")
    if not threads:
        env = os.environ.get('OMP_NUM_THREADS', '')
        threads, why = (int(env), 'OMP_NUM_THREADS') if env.isascii() and env.isdigit() and int(env) > 0 else (
            max(1, cores // 2), 'half the cores, the default; --threads sets it')
    if threads > 4 * cores:  # more only waits on itself, and torch crashes on a count past an int
        raise UserError(f"{why.split(',')[0]}={threads} asks for more threads than 4 per core of this machine's "
                        f"{cores}; give at most {4 * cores}.")
    torch.set_num_threads(threads)
    return f"{threads} CPU thread(s) of {cores} cores ({why})"


def memory_bytes(name, free=False):
    """The memory a run on device `name` (as resolve_device gives it) can have: a CUDA GPU's total, or with free=True
    what is free on it now (asking makes the process hold a CUDA context on it); else this machine's physical memory,
    which MPS shares."""
    if name.startswith('cuda'):
        return torch.cuda.mem_get_info(name)[0] if free else torch.cuda.get_device_properties(name).total_memory
    return os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')


def resolve_dtype(name, device_type):
    """'auto' is bfloat16 on a CUDA GPU that runs it natively (compute capability 8.0 and newer), float16 (with the
    loss scaler) on an older one, float32 elsewhere. Asked of the current GPU without emulation: torch's default
    answer is True on a T4 or V100 too, which only emulate bfloat16, slowly."""
    native = device_type == 'cuda' and torch.cuda.is_bf16_supported(including_emulation=False)
    if name == 'auto':
        return 'float32' if device_type != 'cuda' else 'bfloat16' if native else 'float16'
    if name not in DTYPES:
        raise UserError(f"--dtype expects auto, float32, bfloat16 or float16, got '{name}'.")
    if name == 'bfloat16' and device_type == 'cuda' and not native:
        raise UserError("this GPU (compute capability below 8.0) only emulates bfloat16, slowly; use --dtype=float16 "
                        "(train.py scales the loss) or float32.")
    return name


def use(name, dtype, mps=True):
    """The device a process computes on (resolve_device; mps=False: auto never picks MPS) and its dtype for it
    (resolve_dtype). A GPU is made the current one first, so that RNG state, bf16 support and the peak-FLOPs lookup
    refer to it."""
    name = resolve_device(name, mps)
    if name.startswith('cuda'):
        torch.cuda.set_device(torch.device(name))
        torch.set_float32_matmul_precision('high')  # TF32 matmuls for float32 work
    return name, resolve_dtype(dtype, name.split(':')[0])


def autocast(device_type, dtype):
    """Mixed precision for bfloat16/float16 (matmuls in the low precision, reductions in fp32); nothing for float32."""
    return nullcontext() if dtype == 'float32' else torch.autocast(device_type=device_type, dtype=DTYPES[dtype])
