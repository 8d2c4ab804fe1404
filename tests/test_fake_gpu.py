"""The CUDA branches of nanoFFN, run on this machine through a fake GPU (tests/fake_gpu.py): everything that happens
before a tensor is placed on a GPU (set-up, precision, compile, peak FLOPs, the memory check, a comparison's
placement and plan, bench.py's device, DDP's teardown), and the model's forward on fake CUDA tensors."""
import contextlib
import io
import json
import os
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import bench  # noqa: E402
import compare  # noqa: E402
import configurator  # noqa: E402
from activations import VARIANTS  # noqa: E402
from data.shards import write_shard  # noqa: E402
from machinery import device  # noqa: E402
from machinery.cli import UserError  # noqa: E402
from machinery.device import Compute  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

TINY = ['--seed=1337', '--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=4', '--max_iters=4',
        '--lr_decay_iters=4', '--warmup_iters=1', '--eval_interval=2', '--eval_iters=2', '--log_interval=1',
        '--variants=gelu,moa', '--lrs=']


@pytest.fixture(autouse=True)
def keep_matmul_precision():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


# ----------------------------------------------------------------------------------------------------------------------
# one process's set-up


@pytest.mark.parametrize('name', ['auto', 'cuda', 'cuda:0'])
def test_one_gpu_sets_up_on_its_first_device(fake_gpu, name):
    """torch.cuda.set_device takes an index or an indexed device, never 'cuda' alone: the set-up names the GPU."""
    devices_set = fake_gpu()
    assert device.setup(name, 'auto') == Compute('cuda:0', 'bfloat16')
    assert devices_set == [0]
    assert torch.get_float32_matmul_precision() == 'high'  # TF32 for float32 matmuls
    assert device.compile_default('cuda') and not device.compile_default('cpu')


def test_a_named_gpu_of_several_is_the_one_set_up(fake_gpu):
    devices_set = fake_gpu(n=4)
    assert device.setup('cuda:3', 'float32') == Compute('cuda:3', 'float32')
    assert devices_set == [3] and torch.cuda.current_device() == 3
    with pytest.raises(UserError, match='4 CUDA GPU'):
        device.resolve_device('cuda:4')


def test_under_torchrun_each_rank_takes_its_local_gpu_and_joins_nccl(fake_gpu, monkeypatch):
    devices_set = fake_gpu(n=4)
    joined = []
    monkeypatch.setattr(dist, 'init_process_group', lambda backend: joined.append(backend))
    for key, value in dict(RANK=6, LOCAL_RANK=2, WORLD_SIZE=8).items():
        monkeypatch.setenv(key, str(value))
    assert device.setup('cuda', 'auto') == Compute('cuda:2', 'bfloat16', ddp=True, rank=6, local_rank=2, world_size=8)
    assert joined == ['nccl'] and devices_set == [2]


def test_dtype_auto_is_bfloat16_where_the_gpu_has_it(fake_gpu):
    fake_gpu(name='Tesla V100-SXM2-32GB', capability=(7, 0))  # Volta: no bfloat16
    assert device.setup('cuda', 'auto').dtype == 'float32'
    with pytest.raises(UserError, match='does not support bfloat16'):
        device.setup('cuda', 'bfloat16')


@pytest.mark.parametrize('name, bf16, tf32', [
    ('NVIDIA H100 80GB HBM3', 989e12, 494.5e12),  # SXM
    ('NVIDIA H100 PCIe', 756e12, 378e12),
    ('NVIDIA H100 NVL', 835e12, 417.5e12),
    ('NVIDIA H200', 989e12, 494.5e12),
    ('NVIDIA H200 NVL', 835e12, 417.5e12),
    ('NVIDIA GH200 480GB', 989e12, 494.5e12),
    ('NVIDIA A100-SXM4-80GB', 312e12, 156e12),
    ('NVIDIA A100 80GB PCIe', 312e12, 156e12),
    ('NVIDIA GeForce RTX 4090', None, None),  # not in the table: no MFU unless --peak_flops
])
def test_peak_flops_are_the_gpu_models_own_in_the_runs_precision(fake_gpu, name, bf16, tf32):
    fake_gpu(name=name)
    device.setup('cuda', 'float32')
    assert device.peak_flops('cuda', 'bfloat16', 0) == bf16
    assert device.peak_flops('cuda', 'float16', 0) == bf16
    assert device.peak_flops('cuda', 'float32', 0) == tf32  # float32 matmuls run in TF32
    assert device.peak_flops('cuda', 'float32', 123e12) == 123e12
    assert device.peak_flops('cpu', 'float32', 0) is None


def test_the_memory_check_reads_the_gpus_total_then_what_is_free(fake_gpu, shakespeare_char_dir):
    """A run that cannot fit even an empty GPU is refused with its settings; once set up on its GPU, a run is checked
    against what other processes left free there."""
    fake_gpu(total_gib=16, free_gib=0.5)
    cfg = {**configurator.DEFAULTS, 'device': 'cuda', 'data_dir': shakespeare_char_dir, 'n_layer': 12, 'n_head': 12,
           'n_embd': 768, 'block_size': 1024, 'batch_size': 16}  # ~85M weights and 16 x 1024 fp32 logits
    configurator.check(cfg)  # fits 16 GiB
    config = configurator.model_config({**cfg, 'vocab_size': 65})
    with pytest.raises(UserError, match=r'the GPU cuda:0 has 0\.537 GB free'):
        configurator.check_memory(cfg, config, where='cuda:0')
    with pytest.raises(UserError, match=r'the GPU cuda:0 has 17\.2 GB, so lower n_layer'):
        configurator.check({**cfg, 'n_layer': 200})


# ----------------------------------------------------------------------------------------------------------------------
# a comparison's placement, its plan, bench.py


class FakeRun:
    """Stands in for a train.py subprocess: records its command and GPUs, and exits at the first poll."""

    def __init__(self, cmd, env, started):
        self.cmd, self.gpus, self.returncode = cmd, env.get('CUDA_VISIBLE_DEVICES'), None
        started.append(self)

    def poll(self):
        self.returncode = 0
        return 0


def place(argv, monkeypatch, data_dir, tmp_path):
    """compare.py's training step on these arguments, its runs started as FakeRuns: (the runs, stderr)."""
    started = []
    monkeypatch.setattr(compare.subprocess, 'Popen', lambda cmd, env, **kw: FakeRun(cmd, env, started))
    monkeypatch.setattr(compare.time, 'sleep', lambda s: None)
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(16)), raising=False)
    cfg = compare.settings([*TINY, f'--data_dir={data_dir}', f'--out_dir={tmp_path}', *argv])
    comp = compare.check_comparison(cfg)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        compare.train_missing(cfg, comp, compare.grid_runs(cfg, comp))
    return started, err.getvalue()


def test_a_tiny_comparison_shares_one_gpu_and_says_so(fake_gpu, monkeypatch, shakespeare_char_dir, tmp_path):
    fake_gpu(n=1)
    started, err = place(['--seeds=4', '--device=cuda'], monkeypatch, shakespeare_char_dir, tmp_path)
    assert [r.gpus for r in started] == ['0'] * 8
    assert '8 to train, 8 at a time on GPU 0, up to 8 per GPU: a step of' in err and 'too small to fill a GPU' in err


def test_runs_of_a_large_model_take_a_gpu_each_on_eight(fake_gpu, monkeypatch, shakespeare_char_dir, tmp_path):
    fake_gpu(n=8)
    started, err = place(['--seeds=4', '--device=auto', '--n_layer=12', '--n_head=12', '--n_embd=768',
                          '--block_size=1024', '--batch_size=16'], monkeypatch, shakespeare_char_dir, tmp_path)
    assert sorted(r.gpus for r in started) == [str(g) for g in range(8)]
    assert '8 at a time on GPUs 0,1,2,3,4,5,6,7)' in err


def test_a_gpu_named_on_the_command_line_takes_every_run(fake_gpu, monkeypatch, shakespeare_char_dir, tmp_path):
    fake_gpu(n=2)
    started, err = place(['--seeds=2', '--device=cuda:1'], monkeypatch, shakespeare_char_dir, tmp_path)
    assert [r.gpus for r in started] == [None] * 4  # no placement: each run sets up on cuda:1 itself
    assert all('--device=cuda:1' in r.cmd for r in started) and 'at a time on GPU 1' in err


def test_ddp_runs_get_gpus_of_their_own_through_torchrun(fake_gpu, monkeypatch, shakespeare_char_dir, tmp_path):
    fake_gpu(n=8)
    started, err = place(['--seeds=2', '--device=cuda', '--nproc_per_run=4'], monkeypatch, shakespeare_char_dir,
                         tmp_path)
    assert [r.gpus for r in started][:2] == ['0,1,2,3', '4,5,6,7'] and '2 at a time' in err
    assert all(r.cmd[1:4] == ['-m', 'torch.distributed.run', '--standalone'] and '--nproc_per_node=4' in r.cmd
               for r in started)


def test_a_gpu_config_plans_on_a_machine_with_or_without_gpus(fake_gpu, tmp_path, capsys):
    """--plan lists the runs of a GPU comparison for another machine: the same lines whether this one has GPUs."""
    folder = tmp_path / 'data' / 'openwebtext'  # a stand-in for the prepared dataset, on a shared filesystem
    folder.mkdir(parents=True)
    for split in ('train', 'val'):
        write_shard(str(folder / f'{split}_000.bin'), np.arange(4096) % 50257)
    (folder / 'meta.json').write_text(json.dumps({'tokenizer': 'gpt2', 'vocab_size': 50257}))
    argv = [os.path.join(REPO, 'config', 'compare_owt_dense.py'), '--plan', f'--out_dir={tmp_path / "plan"}',
            f'--data_dir={tmp_path / "data"}', '--lrs=', '--seeds=1']
    compare.main(argv)
    without = capsys.readouterr()
    fake_gpu(n=8)
    compare.main(argv)
    with_gpus = capsys.readouterr()
    lines = without.out.splitlines()
    assert lines == with_gpus.out.splitlines() and len(lines) == 8  # its 8 variants, one seed
    assert all('--device=cuda ' in line and '--dataset=openwebtext' in line for line in lines)


def test_bench_sets_up_the_first_gpu_with_bfloat16(fake_gpu):
    fake_gpu(n=2)
    cfg, _ = bench.parse_args(bench.DEFAULTS, ['--variants=gelu'])
    threads = torch.get_num_threads()
    try:
        assert bench.setup(cfg)[2:] == ('cuda:0', 'bfloat16')
    finally:
        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------------------------------------------
# DDP's teardown


@pytest.mark.parametrize('failed', [False, True])
def test_ddp_teardown_waits_for_the_other_ranks_only_after_a_clean_end(monkeypatch, failed):
    """After a failure the other ranks may be waiting in a collective this rank never joins: a barrier would hang
    until NCCL's watchdog fires, so this rank leaves the group at once (torchrun then stops the others)."""
    calls = []
    monkeypatch.setattr(dist, 'barrier', lambda: calls.append('barrier'))
    monkeypatch.setattr(dist, 'destroy_process_group', lambda: calls.append('destroy'))
    device.teardown(Compute('cuda:0', 'bfloat16', ddp=True, world_size=2), failed)
    assert calls == (['destroy'] if failed else ['barrier', 'destroy'])


# ----------------------------------------------------------------------------------------------------------------------
# the model on fake CUDA tensors


class MetaIndexing(torch.overrides.TorchFunctionMode):
    """Python indexing of a CUDA tensor asks for CUDA's device guard; on a build without CUDA there is none. A forward
    on fake tensors needs shapes, dtypes and devices, not values: index a meta twin, answer an empty CUDA tensor."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__getitem__ and args[0].device.type == 'cuda':
            meta = lambda v: (torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device='meta')
                              if isinstance(v, torch.Tensor) else v)
            t, index = args
            out = meta(t)[tuple(map(meta, index)) if isinstance(index, tuple) else meta(index)]
            return torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=t.device)
        return func(*args, **(kwargs or {}))


@pytest.mark.skipif(not hasattr(torch._C, '_cuda_getCurrentRawStream'), reason=(
    "needs a CUDA build of torch (a GPU is not needed): a CPU-only build has no CUDA device guard for fake tensors"))
@pytest.mark.parametrize('n_expert', [0, 4])
@pytest.mark.parametrize('variant', list(VARIANTS))
def test_every_variant_runs_forward_on_cuda_under_bf16_autocast(variant, n_expert, fake_gpu):
    """torch's FakeTensorMode computes shapes, dtypes and devices without a GPU, and raises where an operation mixes
    devices (a tensor made on the CPU in forward, say). Forward only: backward needs a real device context."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with torch.device('meta'):
        gpt = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=16, vocab_size=65, ffn=variant,
                            n_expert=n_expert))
    with FakeTensorMode(allow_non_fake_inputs=True):
        gpt.to_empty(device='cuda')
        x = torch.zeros(2, 16, dtype=torch.long, device='cuda')
        fake_gpu()  # now, inside the mode: autocast asks whether CUDA is available
        with MetaIndexing(), torch.no_grad(), torch.autocast('cuda', dtype=torch.bfloat16):
            logits, loss, parts = gpt(x, x)
    assert logits.device.type == 'cuda' and logits.dtype == torch.bfloat16  # matmuls in bf16
    assert loss.device.type == 'cuda' and loss.dtype == torch.float32 and parts['aux'].dtype == torch.float32
