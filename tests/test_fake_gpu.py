"""The CUDA branches of nanoFFN, run on this machine through a fake GPU (tests/fake_gpu.py): everything that happens
before a tensor is placed on a GPU (set-up, precision, compile, peak FLOPs, the memory check, a comparison's
placement and plan, bench.py's device, DDP's teardown), and the model's forward on fake CUDA tensors."""
import contextlib
import io
import json
import os
import sys
import types

import numpy as np
import pytest
import torch
import torch.distributed as dist

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import bench  # noqa: E402
import train  # noqa: E402
import compare  # noqa: E402
import configurator  # noqa: E402
from activations import VARIANTS, make_activations  # noqa: E402
from comparison import placement  # noqa: E402
from comparison.runs import meta_model  # noqa: E402
from data.write import write_shard  # noqa: E402
from machinery import device, distributed, run_log, speed  # noqa: E402
from machinery.cli import UserError  # noqa: E402
from machinery.distributed import Compute  # noqa: E402
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
    assert distributed.setup(name, 'auto') == Compute('cuda:0', 'bfloat16')
    assert devices_set == [0]
    assert torch.get_float32_matmul_precision() == 'high'  # TF32 for float32 matmuls
    assert speed.compile_default('cuda') and not speed.compile_default('cpu')


def test_a_named_gpu_of_several_is_the_one_set_up(fake_gpu):
    devices_set = fake_gpu(n=4)
    assert distributed.setup('cuda:3', 'float32') == Compute('cuda:3', 'float32')
    assert devices_set == [3] and torch.cuda.current_device() == 3
    with pytest.raises(UserError, match='4 CUDA GPU'):
        device.resolve_device('cuda:4')


def test_under_torchrun_each_rank_takes_its_local_gpu_and_joins_nccl(fake_gpu, monkeypatch):
    devices_set = fake_gpu(n=4)
    joined = []
    monkeypatch.setattr(dist, 'init_process_group', lambda **kw: joined.append(kw))
    for key, value in dict(RANK=6, LOCAL_RANK=2, WORLD_SIZE=8).items():
        monkeypatch.setenv(key, str(value))
    assert distributed.setup('cuda', 'auto') == Compute('cuda:2', 'bfloat16', ddp=True, rank=6, local_rank=2,
                                                        world_size=8)
    assert joined == [dict(backend='nccl', device_id=torch.device('cuda:2'))] and devices_set == [2]
    with pytest.raises(UserError, match=r'--device=cuda:1 under torchrun: each process takes the GPU of its'):
        distributed.setup('cuda:1', 'auto')  # refused, not silently replaced by cuda:2
    monkeypatch.setenv('LOCAL_RANK', '5')  # --nproc_per_node=8 on a machine of 4 GPUs
    with pytest.raises(UserError, match=r'^torchrun started more processes on this machine than its 4 CUDA GPU\(s\) '
                                        r'\(LOCAL_RANK 5\); pass --nproc_per_node=4 or less\.$'):
        distributed.setup('cuda', 'auto')
    assert len(joined) == 1


def test_under_torchrun_on_a_mac_auto_is_the_cpu_and_mps_is_refused(monkeypatch):
    """DDP off CUDA reduces over gloo, which takes CPU tensors only: on MPS tensors DDP's first collective fails with
    a traceback ("ProcessGroupGloo::allgather: invalid tensor type"). Alone, a process on a Mac still takes MPS."""
    monkeypatch.setattr(torch.backends.mps, 'is_available', lambda: True)
    joined = []
    monkeypatch.setattr(dist, 'init_process_group', lambda **kw: joined.append(kw))
    assert distributed.setup('auto', 'auto') == Compute('mps', 'float32')
    for key, value in dict(RANK=1, LOCAL_RANK=1, WORLD_SIZE=2).items():
        monkeypatch.setenv(key, str(value))
    assert distributed.setup('auto', 'auto') == Compute('cpu', 'float32', ddp=True, rank=1, local_rank=1,
                                                        world_size=2)
    assert joined == [dict(backend='gloo', device_id=None)]
    with pytest.raises(UserError, match=r"^--device=mps under torchrun: DDP's gloo backend cannot reduce MPS tensors"):
        distributed.setup('mps', 'auto')
    assert len(joined) == 1


@pytest.mark.parametrize('name, capability, auto', [
    ('Tesla V100-SXM2-32GB', (7, 0), 'float16'), ('Tesla T4', (7, 5), 'float16'),
    ('NVIDIA A100-SXM4-80GB', (8, 0), 'bfloat16'), ('NVIDIA GeForce RTX 3090', (8, 6), 'bfloat16'),
    ('NVIDIA L4', (8, 9), 'bfloat16'), ('NVIDIA H100 80GB HBM3', (9, 0), 'bfloat16'),
    ('NVIDIA B200', (10, 0), 'bfloat16'), ('NVIDIA GeForce RTX 5090', (12, 0), 'bfloat16')])
def test_dtype_auto_is_what_the_gpu_runs_natively(fake_gpu, name, capability, auto):
    """bfloat16 from compute capability 8.0; below, float16 with the loss scaler. The fake answers is_bf16_supported
    as torch does on the real card: True on every one with emulation, so asking with it would pick bf16 on a T4."""
    fake_gpu(name=name, capability=capability)
    assert torch.cuda.is_bf16_supported()  # with emulation, as torch answers on any CUDA GPU
    assert distributed.setup('cuda', 'auto').dtype == auto
    assert distributed.setup('cuda', 'float16').dtype == 'float16'
    if auto == 'float16':
        with pytest.raises(UserError, match=r'only emulates bfloat16, slowly; use --dtype=float16'):
            distributed.setup('cuda', 'bfloat16')
    else:
        assert distributed.setup('cuda', 'bfloat16').dtype == 'bfloat16'


@pytest.mark.parametrize('name, capability, compiled', [
    ('Tesla P100-PCIE-16GB', (6, 0), False), ('NVIDIA GeForce GTX 1080 Ti', (6, 1), False),
    ('Tesla V100-SXM2-32GB', (7, 0), True), ('Tesla T4', (7, 5), True), ('NVIDIA H100 80GB HBM3', (9, 0), True)])
def test_compile_auto_is_off_on_a_gpu_triton_cannot_compile_for(fake_gpu, name, capability, compiled):
    """Triton compiles for compute capability 7.0 and newer (torch.utils._triton.has_triton): on a P100 or a GTX 10xx,
    which torch's CUDA 12.6 builds still run, a compiled run stops at its first step with Inductor's
    GPUTooOldForTriton. --compile=auto trains those eager; the capability asked is the run's own GPU's."""
    fake_gpu(n=2, name=name, capability=[(9, 0), capability])
    distributed.setup('cuda:1', 'float32')
    assert speed.compile_default('cuda') is compiled


@pytest.mark.parametrize('script', ['train', 'bench'])
def test_compile_asked_for_on_a_gpu_triton_cannot_compile_for_is_refused_in_a_sentence(fake_gpu, script, tmp_path):
    """--compile=True, or bench.py's default of both, on a GPU below compute capability 7.0: refused before the
    set-up (bench.py: before its eager pass), not a GPUTooOldForTriton traceback at the first compiled step."""
    fake_gpu(name='Tesla P100-PCIE-16GB', capability=(6, 0))
    threads = torch.get_num_threads()
    try:
        with pytest.raises(UserError, match=r'^torch\.compile cannot run on Tesla P100-PCIE-16GB: Triton, which builds '
                                            r'its GPU kernels, needs compute capability 7\.0 or more, and this GPU has '
                                            r'6\.0; use --compile=False\.$'):
            if script == 'train':
                train.main(['--device=cuda', '--compile=True', '--dataset=nowhere', f'--out_dir={tmp_path / "run"}'])
            else:
                bench.setup(bench.parse_args(bench.DEFAULTS, ['--variants=gelu', '--dtype=float32', '--json='])[0])
    finally:
        torch.set_num_threads(threads)
    assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize('name', ['cuda:²', 'cuda:０', 'cuda:١', 'cuda:', 'cuda:-1', 'cuda:0x1'])
def test_a_gpu_index_of_other_than_ascii_digits_is_refused_in_a_sentence(fake_gpu, capsys, name):
    """'²' and '０' pass str.isdigit(); int('²') raises and torch.device refuses 'cuda:０' later, with tracebacks."""
    import train
    from machinery.cli import run_cli
    fake_gpu(n=2)
    with pytest.raises(SystemExit) as e:
        run_cli(train.main, [f'--device={name}', '--max_iters=0'])
    err = capsys.readouterr().err
    assert e.value.code == 2 and 'Traceback' not in err
    assert f"--device expects auto, cpu, cuda, cuda:N or mps, got '{name}'." in err and err.count('\n') == 1


def test_sample_takes_the_dtype_of_the_gpu_it_names_and_its_threads(fake_gpu, monkeypatch, capsys):
    """On a machine with an H100 as cuda:0 and a T4 as cuda:1, --device=cuda:1 samples in float16, not in the bfloat16
    of the current GPU; --threads sets torch's threads and the start-up line says so."""
    import sample
    fake_gpu(n=2, capability=[(9, 0), (7, 5)])
    set_up = []
    monkeypatch.setattr(sample, 'load_checkpoint', lambda *a: {'meta': {}})
    monkeypatch.setattr(sample.device, 'use', lambda *a, real=device.use: set_up.append(real(*a)) or set_up[-1])
    monkeypatch.setattr(sample, 'checkpoint_model', lambda *a: 1 / 0)  # stop before a tensor goes to the fake GPU
    threads = torch.get_num_threads()
    try:
        with pytest.raises(ZeroDivisionError):
            sample.main(['--device=cuda:1', '--threads=1'])
        assert set_up == [('cuda:1', 'float16')] and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_cpu_threads_are_half_the_cores_unless_told(monkeypatch):
    """A thread per core, torch's default, stalls beside any other busy process (BENCHMARKS.md, CPU threads)."""
    threads = torch.get_num_threads()
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    try:
        assert device.set_threads(0) == '2 CPU thread(s) of 4 cores (half the cores, the default; --threads sets it)'
        assert torch.get_num_threads() == 2
        assert device.set_threads(3) == '3 CPU thread(s) of 4 cores (--threads)' and torch.get_num_threads() == 3
        monkeypatch.setenv('OMP_NUM_THREADS', '1')  # as torchrun and compare.py set it
        assert device.set_threads(0) == '1 CPU thread(s) of 4 cores (OMP_NUM_THREADS)'
        monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0}, raising=False)
        monkeypatch.setenv('OMP_NUM_THREADS', '')
        assert device.set_threads(0).startswith('1 CPU thread(s) of 1 cores (half')
    finally:
        torch.set_num_threads(threads)


def test_cores_are_the_machines_where_there_is_no_affinity_as_on_macos(monkeypatch):
    """macOS has no os.sched_getaffinity: the cores are os.cpu_count()'s, or 1 where it cannot tell."""
    monkeypatch.delattr(os, 'sched_getaffinity', raising=False)
    monkeypatch.setattr(os, 'cpu_count', lambda: 10)
    assert device.usable_cores() == 10
    monkeypatch.setattr(os, 'cpu_count', lambda: None)
    assert device.usable_cores() == 1


@pytest.mark.parametrize('name, half, single', [
    ('NVIDIA H100 80GB HBM3', 989e12, 494.5e12),  # SXM
    ('NVIDIA H100 PCIe', 756e12, 378e12),
    ('NVIDIA H100 NVL', 835e12, 417.5e12),
    ('NVIDIA H200', 989e12, 494.5e12),
    ('NVIDIA H200 NVL', 835e12, 417.5e12),
    ('NVIDIA GH200 480GB', 989e12, 494.5e12),
    ('NVIDIA A100-SXM4-80GB', 312e12, 156e12),
    ('NVIDIA A100 80GB PCIe', 312e12, 156e12),
    ('Tesla V100-SXM2-16GB', 125e12, 15.7e12),  # no TF32 before the A100: float32 is plain FP32
    ('Tesla V100-PCIE-32GB', 112e12, 14e12),
    ('Tesla V100S-PCIE-32GB', 130e12, 16.4e12),
    ('Tesla T4', 65e12, 8.1e12),
    ('NVIDIA GeForce RTX 4090', None, None),  # not in the table: no MFU unless --peak_flops
    ('NVIDIA RTX A1000 Laptop GPU', None, None),  # no A100, though its name holds the letters
])
def test_peak_flops_are_the_gpu_models_own_in_the_runs_precision(fake_gpu, name, half, single):
    fake_gpu(name=name)
    distributed.setup('cuda', 'float32')
    assert speed.peak_flops('cuda', 'bfloat16', 0) == half
    assert speed.peak_flops('cuda', 'float16', 0) == half
    assert speed.peak_flops('cuda', 'float32', 0) == single  # float32 matmuls run in TF32 where the GPU has it
    assert speed.peak_flops('cuda', 'float32', 123e12) == 123e12
    assert speed.peak_flops('cpu', 'float32', 0) is None


def test_a_mig_slice_has_no_mfu_rather_than_the_whole_gpus(fake_gpu):
    """A MIG slice has a fraction of the GPU's SMs: against the whole H100's peak its MFU would read up to 7x low."""
    fake_gpu(name='NVIDIA H100 80GB HBM3 MIG 1g.10gb', total_gib=10)
    distributed.setup('cuda', 'auto')
    assert speed.peak_flops('cuda', 'bfloat16', 0) is None
    assert speed.peak_flops('cuda', 'bfloat16', 120e12) == 120e12  # --peak_flops, the user's figure for the slice


def test_the_run_records_what_it_ran_on(fake_gpu, monkeypatch):
    fake_gpu(name='NVIDIA L4', capability=(8, 9))
    monkeypatch.setattr(torch.version, 'cuda', '12.8')
    monkeypatch.setattr(torch.backends.cudnn, 'version', lambda: 91002)
    env = run_log.environment(distributed.setup('cuda', 'auto'))
    assert env['device'] == 'NVIDIA L4' and env['cuda'] == '12.8' and env['cudnn'] == 91002
    assert env['torch'] == torch.__version__ and env['torch_commit'] == torch.version.git_version[:12]
    assert run_log.environment(Compute('cpu', 'float32'))['cudnn'] is None


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


def test_a_run_is_refused_where_other_processes_left_too_little_free_on_its_gpu(fake_gpu, monkeypatch,
                                                                                 shakespeare_char_dir, tmp_path):
    """train.py's own check of what is free on the GPU it set up on, before its model is built there (no validation
    windows here: a tensor cannot be placed on the fake GPU)."""
    fake_gpu(total_gib=16, free_gib=0.0001)
    opened = train.open_loader

    def without_windows(*args, **kwargs):
        loader = opened(*args, **kwargs)
        loader.val_batches = lambda n: []
        return loader

    monkeypatch.setattr(train, 'open_loader', without_windows)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(UserError, match=r'the GPU cuda:0 has 0\.000107 GB free, so lower'):
            train.main([*TINY[:10], f'--data_dir={shakespeare_char_dir}', f'--out_dir={tmp_path / "run"}',
                        '--device=cuda', '--threads=1'])
    finally:
        torch.set_num_threads(threads)
    assert not (tmp_path / 'run').exists()  # refused before the run directory is opened


# ----------------------------------------------------------------------------------------------------------------------
# a comparison's placement, its plan, bench.py


class FakeRun:
    """Stands in for a train.py subprocess: records its command and GPUs, and exits at the first poll."""

    def __init__(self, cmd, env, started):
        self.cmd, self.gpus, self.env, self.returncode = cmd, env.get('CUDA_VISIBLE_DEVICES'), env, None
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
    started, err = place(['--seeds=4', '--device=cuda', '--threads=0'], monkeypatch, shakespeare_char_dir, tmp_path)
    assert [r.gpus for r in started] == ['0'] * 8
    assert ('8 to train, 8 at a time on GPU 0, up to 8 per GPU, 2 CPU thread(s) each: a micro-step of' in err
            and 'too small to fill a GPU' in err and 'with its CUDA context' in err)
    # 16 cores shared by 8 runs: 2 threads each, and as many Inductor compile workers, not one per core each
    assert all(r.env['OMP_NUM_THREADS'] == r.env['TORCHINDUCTOR_COMPILE_THREADS'] == '2' for r in started)


def test_sharing_a_gpu_tests_a_micro_steps_flops_and_counts_each_runs_cuda_context(fake_gpu, monkeypatch,
                                                                                  shakespeare_char_dir):
    """A micro-step sets the kernels' sizes: accumulation makes a step longer, not the GPU fuller. Each process holds
    its own CUDA context beside its model."""
    from comparison import placement
    data_dir = shakespeare_char_dir
    fake_gpu(n=1, total_gib=10)
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(16)), raising=False)
    cfg = {**compare.DEFAULTS, 'device': 'cuda', 'jobs': 0}
    need = 0.5 * 2**30  # with its context each needs 1 GiB: 9 of the 10 GiB hold 9, MAX_SHARE allows 8
    assert placement.resolve_jobs(cfg, 99, 1e11, need)[1] == 8
    assert placement.resolve_jobs(cfg, 99, 1e11, 1.5 * 2**30)[1] == 4  # 2 GiB each: 4, where 1.5 GiB alone fits 6
    cfg = compare.settings([*TINY, '--gradient_accumulation_steps=1000', f'--data_dir={data_dir}', '--device=cuda'])
    runs = compare.grid_runs(cfg, compare.check_comparison(cfg))
    per_micro_step = max(meta_model(r.settings, data_dir).flops_per_token() * 4 * 32 for r in runs)
    assert compare.run_size(cfg, runs)[0] == per_micro_step  # batch 4 x 32 tokens, whatever the accumulation


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
    cfg, _ = bench.parse_args(bench.DEFAULTS, ['--variants=gelu', '--json='])
    threads = torch.get_num_threads()
    try:
        assert bench.setup(cfg)[2:] == ('cuda:0', 'bfloat16')
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize('dtype', ['auto', 'float16'])
def test_bench_refuses_float16_also_where_auto_chooses_it(fake_gpu, dtype):
    """On a T4, dtype=auto is float16, which needs the loss scaler bench's step leaves out: refused as plainly as
    --dtype=float16."""
    fake_gpu(name='Tesla T4', capability=(7, 5))
    cfg, _ = bench.parse_args(bench.DEFAULTS, ['--variants=gelu', f'--dtype={dtype}', '--json='])
    threads = torch.get_num_threads()
    try:
        with pytest.raises(UserError, match=rf"not float16 \(--dtype={dtype} on cuda:0\); pass --dtype=float32\."):
            bench.setup(cfg)
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
    distributed.teardown(Compute('cuda:0', 'bfloat16', ddp=True, world_size=2), failed)
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


# ----------------------------------------------------------------------------------------------------------------------
# what a run ran on, and its sums where float64 is missing


class MpsWithoutFloat64(torch.overrides.TorchFunctionMode):
    """A stand-in for MPS, which has no float64: tensors asked for on 'mps' are made on the CPU, and a float64 result
    raises as MPS does, unless it comes from tensors brought to the host (.cpu(), and what is computed from them)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = {k: 'cpu' if k == 'device' and str(v) == 'mps' else v for k, v in (kwargs or {}).items()}
        out = func(*args, **kwargs)
        inputs = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        host = func is torch.Tensor.cpu or bool(inputs) and all(getattr(t, 'on_host', False) for t in inputs)
        if isinstance(out, torch.Tensor):
            if out.dtype == torch.float64 and not host:
                raise TypeError("Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support "
                                "float64")
            out.on_host = host or getattr(out, 'on_host', False)
        return out


def test_evaluation_sums_without_float64_on_mps():
    import train
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=65))
    batches = [(torch.randint(65, (2, 16)), torch.randint(65, (2, 16))) for _ in range(4)]
    on_cpu = train.evaluate(gpt, batches, contextlib.nullcontext(), Compute('cpu', 'float32'))
    with MpsWithoutFloat64():
        on_mps = train.evaluate(gpt, batches, contextlib.nullcontext(), Compute('mps', 'float32'))
    assert on_mps[0] == pytest.approx(on_cpu[0], rel=1e-6) and on_mps[1] == pytest.approx(on_cpu[1], rel=1e-6)


def test_a_training_step_moves_its_batch_to_the_models_device_on_mps_too():
    """--device=auto picks MPS on a Mac: the loader's CPU batch must reach the model there, as on CUDA. The meta
    device stands in for MPS: neither the CPU nor CUDA, and a batch left on the CPU fails against it as on MPS."""
    with torch.device('meta'):
        gpt = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=65))
    batch = torch.randint(65, (2, 16)), torch.randint(65, (2, 16))
    r = types.SimpleNamespace(hw=Compute('meta', 'float32'), model=gpt, accumulation=1, cfg={'grad_clip': 1.0},
                              autocast=contextlib.nullcontext(), loader=types.SimpleNamespace(next_batch=lambda: batch),
                              optimizer=torch.optim.AdamW(gpt.parameters()), scaler=torch.amp.GradScaler(enabled=False),
                              iter_num=0, tokens=0, tokens_per_iter=32)
    got = train.step(r, 1e-3)
    assert got.device.type == 'meta' and got.shape == (5,) and r.iter_num == 1


def test_a_runs_pictures_are_computed_without_float64_on_mps():
    """inspect_run.py --device=auto on a Mac: the curves and MoA's gates reach float64 only on the host."""
    from comparison import acts
    torch.manual_seed(0)
    config = GPTConfig(n_embd=16, n_head=2, ffn='moa')
    act, init = make_activations(config)[0], make_activations(config)[0]
    h, x = torch.randn(6, 64), torch.randn(6, 16)
    with torch.no_grad():  # as inspect runs them
        want = acts.branch_report(act, init, h, x, 20), acts.gate_report(act.token_gates(x), act.names)
        with MpsWithoutFloat64():
            got = acts.branch_report(act, init, h, x, 20), acts.gate_report(act.token_gates(x), act.names)
    assert got == want


def test_each_try_and_each_summary_names_what_it_ran_on(shakespeare_char_dir, tmp_path, capsys):
    """The first log line of every try of a run (a resume may run elsewhere) and the comparison's summary; the
    start-up lines of train.py and sample.py say the threads chosen."""
    import sample
    import train
    from machinery.run_log import read_log_lines
    out = tmp_path / 'run'
    args = [*TINY[:10], f'--data_dir={shakespeare_char_dir}', f'--out_dir={out}', '--device=cpu', '--compile=False']
    threads = torch.get_num_threads()
    try:
        train.main([*args, '--max_iters=2', '--eval_interval=2'])
        train.main([*args, '--max_iters=4', '--eval_interval=2', '--init_from=resume', '--threads=1'])
        assert 'device cpu, dtype float32, 1 CPU thread(s) of' in capsys.readouterr().out
        sample.main([f'--out_dir={out}', '--device=cpu', '--max_new_tokens=2', '--threads=1'])
        assert 'on cpu, float32, 1 CPU thread(s) of' in capsys.readouterr().err
        compare.main([*TINY, f'--data_dir={shakespeare_char_dir}', f'--out_dir={tmp_path / "cmp"}', '--device=cpu',
                      '--max_iters=2', '--eval_interval=2', '--seeds=1'])
    finally:
        torch.set_num_threads(threads)
    records, _ = read_log_lines(str(out / 'log.jsonl'))
    assert [r['iter'] for r in records if 'env' in r] == [0, 4]  # the first line of each try
    env = records[0]['env']
    assert env['torch'] == torch.__version__ and env['device'].startswith('cpu') and env['cuda'] == torch.version.cuda
    summary = json.loads((tmp_path / 'cmp' / 'summary.json').read_text())
    assert summary['ran_on'] == [env]  # both runs, one machine
    md = (tmp_path / 'cmp' / 'summary.md').read_text()
    assert f"Ran on: torch {torch.__version__}, torch_commit" in md and f"code {env['code']}" in md
    assert '(code: a fingerprint of activations.py and model.py, comments and docstrings aside)' in md


def test_the_memory_estimate_is_within_15_percent_of_the_measured_peak_at_gpt2_small():
    """placement.peak_memory's estimate against the one measured peak (BENCHMARKS.md, GPU: bench.py at GPT-2
    small's shape, batch 16 x 1024, bf16, regional compile, 10,800 MiB on an H200): the arithmetic, pinned."""
    import configurator
    cfg = {**configurator.DEFAULTS, 'n_layer': 12, 'n_head': 12, 'n_embd': 768, 'block_size': 1024, 'batch_size': 16,
           'vocab_size': 50257, 'dtype': 'bfloat16', 'eval_iters': 20}
    config = configurator.model_config(cfg)
    (model, batch), peak = configurator.memory_needs(cfg, config), placement.peak_memory(cfg, config)
    tokens, L, d = 16 * 1024, 12, 768
    assert model == 16 * 123_568_128 + 4 * L * 1024 * 64  # 16 bytes a parameter, and RoPE's fp32 tables
    assert batch == tokens * (4 * 50_304 + 16 * 20)  # fp32 logits over the padded vocabulary, the validation windows
    assert peak == model + batch + tokens * L * 36 * d  # and 36·d bytes of activations a token and layer in bf16
    measured = 10_800 * 2**20
    assert model + batch < measured  # the lower bound stays one
    assert abs(peak - measured) <= 0.15 * measured, peak / measured


@pytest.mark.parametrize('device_type', ['cuda', 'mps'])
def test_a_checkpoint_keeps_and_puts_back_the_gpus_own_rng(device_type, monkeypatch):
    """Dropout on a GPU draws from the GPU's generator: a resume puts its state back, as the CPU's."""
    gpu = {'state': torch.tensor([1, 2, 3], dtype=torch.uint8)}
    monkeypatch.setattr(getattr(torch, device_type), 'get_rng_state', lambda: gpu['state'].clone())
    monkeypatch.setattr(getattr(torch, device_type), 'set_rng_state', lambda s: gpu.update(state=s))
    saved = train.rng_state(device_type)
    gpu['state'] = torch.tensor([9], dtype=torch.uint8)  # the generator moves on
    train.set_rng_state(saved, device_type)
    assert gpu['state'].tolist() == [1, 2, 3]
    train.set_rng_state(train.rng_state('cpu'), device_type)  # a checkpoint without one leaves it as it is
    assert gpu['state'].tolist() == [1, 2, 3]
