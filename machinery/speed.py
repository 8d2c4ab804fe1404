"""
How fast a run trains: torch.compile (regional, with its on-disk cache) and the accelerator's peak FLOP/s that MFU is
measured against.
"""
import os
import re

import torch

from machinery.cli import UserError
from machinery.files import check_writable

# dense tensor-core peaks per GPU in FLOP/s, (half: bf16/fp16, single: float32, TF32 from the A100 on, plain FP32
# before), from NVIDIA's datasheets (half their "with sparsity" figures), matched as whole words of
# torch.cuda.get_device_name in this order: a model's variants before the model itself (whole words: the laptop
# "RTX A1000" is no A100). The V100 and T4 have no bfloat16: a run there is float16 (device.resolve_dtype).
PEAK_FLOPS = [('GH200', 989e12, 494.5e12), ('H200 NVL', 835e12, 417.5e12), ('H200', 989e12, 494.5e12),
              ('H100 NVL', 835e12, 417.5e12), ('H100 PCIe', 756e12, 378e12), ('H100', 989e12, 494.5e12),
              ('A100', 312e12, 156e12), ('V100S', 130e12, 16.4e12), ('V100-PCIE', 112e12, 14e12),
              ('V100', 125e12, 15.7e12), ('T4', 65e12, 8.1e12)]
# the user's choice, read at import: Inductor writes its own default (/tmp/torchinductor_USER) into the variable as soon
# as anything loads it (building AdamW does), and that must not pass for a choice
USER_CACHE_DIR = os.environ.get('TORCHINDUCTOR_CACHE_DIR')


def peak_flops(device_type, dtype, override):
    """The peak FLOP/s MFU is measured against: --peak_flops, else the current GPU's dense peak by its name, in the
    precision its matmuls run in (float32 runs them in TF32 where the GPU has it: device.use), else None."""
    if override > 0:
        return override
    if device_type != 'cuda':
        return None
    name = torch.cuda.get_device_name()
    if 'MIG' in name:  # a slice of the GPU named, with a fraction of its SMs: the whole GPU's peak would be wrong
        return None
    return next(((half if dtype != 'float32' else single) for key, half, single in PEAK_FLOPS
                 if re.search(rf'\b{key}\b', name)), None)


# ----------------------------------------------------------------------------------------------------------------------
# torch.compile


def compile_default(device_type):
    """--compile=auto: on for CUDA, where fused kernels pay for the compile within the first steps of a real run, on a
    GPU Triton compiles for (the current one; compute capability 7.0 and newer: on an older one, a P100 or GTX 10xx,
    Inductor stops the first step with GPUTooOldForTriton); off elsewhere (a CPU run finishes sooner eager unless it
    is long, and MPS support in Inductor is young)."""
    return device_type == 'cuda' and torch.cuda.get_device_capability() >= (7, 0)


def check_compile(device_type):
    """A UserError where torch.compile was asked for on a GPU Triton cannot compile for (compute capability below 7.0:
    compile_default): Inductor's own GPUTooOldForTriton is a traceback at the first step, after the set-up."""
    if device_type == 'cuda' and (capability := torch.cuda.get_device_capability()) < (7, 0):
        raise UserError(f"torch.compile cannot run on {torch.cuda.get_device_name()}: Triton, which builds its GPU "
                        f"kernels, needs compute capability 7.0 or more, and this GPU has {capability[0]}."
                        f"{capability[1]}; use --compile=False.")


def compile_cache_dir():
    """Where torch.compile keeps what it built, so that every later run tracing the same graph loads it instead of
    compiling it: $TORCHINDUCTOR_CACHE_DIR, else $XDG_CACHE_HOME (default ~/.cache)/nanoffn/torchinductor. Deleting it
    is safe."""
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return USER_CACHE_DIR or os.path.join(base, 'nanoffn', 'torchinductor')


def check_compile_cache():
    """compile_cache_dir(), or a UserError where Inductor could not write there (its own error is a traceback)."""
    path = compile_cache_dir()
    check_writable(path, create=True, advice="set TORCHINDUCTOR_CACHE_DIR or XDG_CACHE_HOME to a folder you can "
                                             "write to, or use --compile=False")
    return path


def compile_model(model, mode):
    """Compile a GPT for training; returns what to call in place of the model. regional: every Block compiled in place
    (PyTorch's "regional compilation"): the blocks share code and shapes, so one graph serves every layer, built once
    whatever the depth, and state_dict keys stay plain; the head (norm, output layer, cross-entropy) is a region too,
    so its vocabulary-sized logits are not copied to fp32 and read again eagerly. whole: the whole GPT as one graph,
    fused across blocks, at more compile time. dynamic=False: every batch has the same shape, so Dynamo specialises
    once."""
    os.environ['TORCHINDUCTOR_CACHE_DIR'] = check_compile_cache()  # read when Inductor first compiles
    if mode == 'whole':
        return torch.compile(model, dynamic=False)
    for block in model.transformer.h:
        block.compile(dynamic=False)
    model.head = torch.compile(model.head, dynamic=False)
    return model


def compile_seconds():
    """Seconds this process has spent compiling (tracing and building, or loading from the cache): Dynamo's count."""
    from torch._dynamo.utils import compilation_time_metrics
    return sum(sum(compilation_time_metrics.get(k, [])) for k in ('_compile.compile_inner', 'backward._backward_impl'))


def compile_stats():
    """What torch.compile did in this process: distinct graphs compiled, and hits and misses of the on-disk caches."""
    from torch._dynamo.utils import counters
    return {'graphs': counters['stats']['unique_graphs'],
            'fx_cache_hit': counters['inductor']['fxgraph_cache_hit'],
            'fx_cache_miss': counters['inductor']['fxgraph_cache_miss'],
            'aot_cache_hit': counters['aot_autograd']['autograd_cache_hit'],
            'aot_cache_miss': counters['aot_autograd']['autograd_cache_miss']}
