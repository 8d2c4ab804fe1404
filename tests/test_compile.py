"""torch.compile in train.py: regional compilation compiles each distinct graph once (the block and the head, each for
training and for evaluation) and
never again within a run; a second process of the same variant is served from the shared on-disk caches; compiled
training follows eager training; checkpoints keep plain keys; --compile defaults to on for CUDA only.

A cold compile costs seconds on a 2-core CPU, so every run here has the same tiny shape (2 layers, d=32) and shares one
cache directory: only the first process compiles, the others load. Slow tier: python -m pytest -m slow."""
import json
import os
import sys

import pytest
import torch

from machinery.speed import compile_model
from model import GPT, GPTConfig

sys.path.insert(0, os.path.dirname(__file__))
from test_train import assert_ok, log, train  # noqa: E402

pytestmark = pytest.mark.slow
SHAPE = ['--n_layer=2', '--max_iters=7', '--eval_interval=3', '--log_interval=2', '--ffn=moa_glu']


def compile_line(p):
    """The `compile: {...}` line train.py prints at the end of a compiled run (speed.compile_stats)."""
    lines = [l for l in p.stdout.splitlines() if l.startswith('compile: ')]
    assert len(lines) == 1, p.stdout[-2000:]
    return json.loads(lines[0][len('compile: '):])


def assert_same_losses(out_a, out_b, tol=1e-4):
    """The same logged steps, and training and validation losses within tol at each (float32 reassociation)."""
    la, lb = log(out_a), log(out_b)
    assert [r['iter'] for r in la] == [r['iter'] for r in lb]
    for ra, rb in zip(la, lb):
        for key in ('loss', 'val_loss'):
            if key in rb:
                assert abs(ra[key] - rb[key]) < tol, (key, ra, rb)


@pytest.fixture(scope='module')
def cache_runs(shakespeare_char_dir, tmp_path_factory):
    """Two processes of the same variant (seeds 1 and 2, as a comparison starts them) on one fresh cache dir."""
    cache = str(tmp_path_factory.mktemp('compile_cache'))
    outs, stats = [], []
    for seed in (1, 2):
        out = str(tmp_path_factory.mktemp(f'compiled_seed{seed}'))
        p = train(shakespeare_char_dir, out, *SHAPE, '--compile=True', f'--seed={seed}',
                  extra_env={'TORCHINDUCTOR_CACHE_DIR': cache})
        assert_ok(p)
        outs.append(out)
        stats.append(compile_line(p))
    return cache, outs, stats


def test_second_process_is_served_from_the_cache(cache_runs):
    _, _, (first, second) = cache_runs
    # the block's and the head's training graphs (forward + backward: 2 compiled code modules each) and evaluation
    # graphs (no_grad: 1 each), all AOTAutograd cache entries: compiled, MoA-GLU is plain operations, no custom autograd
    # Function (a graph with one is skipped by that cache and traced again by every process)
    assert first['graphs'] == second['graphs'] == 4
    assert first['fx_cache_hit'] == 0 and first['fx_cache_miss'] == 6
    assert first['aot_cache_hit'] == 0 and first['aot_cache_miss'] == 4
    assert second['fx_cache_miss'] == 0 and second['fx_cache_hit'] == 6
    assert second['aot_cache_miss'] == 0 and second['aot_cache_hit'] == 4


# train.py's main in a fresh process, then Dynamo's own record of what it compiled (forward frames; a backward
# compiled lazily is an entry of its own)
COUNT = """
import json
import sys
from torch._dynamo.utils import counters, get_compilation_metrics
import train
from machinery import cli
try:
    cli.run_cli(train.main, sys.argv[2:])
except SystemExit as e:
    assert e.code in (0, None), e.code
frames = [[m.co_name, m.co_filename, m.recompile_reason] for m in get_compilation_metrics() if m.is_forward]
print('counted: ' + json.dumps({'graphs': counters['stats']['unique_graphs'], 'frames': frames}))
"""


def test_one_compile_per_graph_and_no_recompiles(cache_runs, shakespeare_char_dir, tmp_path):
    """Over a run with 4 evaluations (iterations 0, 3, 6, 7), a last log window of one step, a learning rate that
    changes every step and learned() on every evaluation line: Dynamo compiles the Block once for training and once
    for evaluation (the second layer reuses the first's graph), and nothing else."""
    cache, _, _ = cache_runs
    out = str(tmp_path / 'run')
    p = train(shakespeare_char_dir, out, *SHAPE, '--compile=True',
              launcher=[sys.executable, '-c', COUNT], extra_env={'TORCHINDUCTOR_CACHE_DIR': cache})
    assert_ok(p)
    counted = json.loads(next(l for l in p.stdout.splitlines() if l.startswith('counted: '))[len('counted: '):])
    assert counted['graphs'] == 4
    frames = counted['frames']
    names = [(name, os.path.basename(path)) for name, path, _ in frames]
    assert names == [('forward', 'model.py'), ('head', 'model.py')] * 2
    # the first two are evaluation at iteration 0 (no_grad), the next two training
    assert frames[0][2] is frames[1][2] is None and all('grad_mode' in f[2] for f in frames[2:])
    records = log(out)
    evals = [r for r in records if 'val_loss' in r]
    assert [r['iter'] for r in evals] == [0, 3, 6, 7]
    assert all(len(r['act']['layers']) == 2 for r in evals)  # learned() ran on every evaluation line
    assert len({r['lr'] for r in records}) == len(records)


def test_compiled_training_follows_eager(cache_runs, shakespeare_char_dir, tmp_path):
    """Seed 1 trained compiled and eager: the same losses at every logged step, to float32 reassociation error."""
    _, (compiled, _), _ = cache_runs
    eager = str(tmp_path / 'eager')
    assert_ok(train(shakespeare_char_dir, eager, *SHAPE, '--compile=False', '--seed=1'))
    assert_same_losses(compiled, eager)
    ckpt = torch.load(os.path.join(compiled, 'ckpt.pt'), weights_only=True)
    assert set(ckpt['model']) == set(GPT(GPTConfig(**ckpt['model_args'])).state_dict())  # plain keys
    assert ckpt['compiled'] is True


def test_ddp_with_regional_compile_matches_one_process(cache_runs, shakespeare_char_dir, tmp_path):
    """torchrun with 2 processes, blocks compiled in place and then wrapped in DDP, against eager training in one
    process with 2 accumulation steps (the same batches): the same losses up to float32 reassociation. Both ranks
    load the graphs the runs above compiled."""
    cache, _, _ = cache_runs
    ddp_out, one_out = str(tmp_path / 'ddp'), str(tmp_path / 'one')
    torchrun = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
    p = train(shakespeare_char_dir, ddp_out, *SHAPE, '--compile=True', '--seed=1', launcher=torchrun,
              extra_env={'TORCHINDUCTOR_CACHE_DIR': cache})
    assert_ok(p)
    assert compile_line(p)['graphs'] == 4  # rank 0's process: block and head, training and evaluation; none for DDP
    assert_ok(train(shakespeare_char_dir, one_out, *SHAPE, '--compile=False', '--seed=1',
                    '--gradient_accumulation_steps=2'))
    assert_same_losses(ddp_out, one_out)


def test_regional_compilation_leaves_the_plain_models_keys_as_a_checkpoint_holds_them():
    """Regional compilation compiles each block in place, so the plain model a checkpoint saves keeps the keys a plain
    GPT loads (a block wrapped by torch.compile would carry '_orig_mod.')."""
    model = GPT(GPTConfig(vocab_size=84, n_layer=2, n_head=2, n_embd=32, block_size=32))
    plain = set(model.state_dict())
    assert compile_model(model, 'regional') is model  # compiled lazily: nothing is compiled here
    assert set(model.state_dict()) == plain


def test_unknown_compile_mode_is_a_user_error(shakespeare_char_dir, tmp_path):
    p = train(shakespeare_char_dir, str(tmp_path / 'x'), '--compile_mode=layers')
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and 'Traceback' not in p.stderr and len(lines) == 1, p.stderr
    assert all(w in lines[0] for w in ('--compile_mode', 'regional', 'whole')), lines[0]
    assert not os.path.exists(tmp_path / 'x')


def test_step_time_leaves_compiling_out(cache_runs):
    """The cold run's first step compiles for seconds, while 7 steps of a 2-layer, d=32 model take a fraction of one:
    had compiling been counted as step time (ms), the train time would be seconds."""
    _, (cold, _), (printed, _) = cache_runs
    train_time, prev = 0.0, 0
    for r in log(cold):
        train_time += r.get('ms', 0.0) / 1000.0 * (r['iter'] - prev)
        prev = r['iter']
    assert printed['fx_cache_miss'] > 0 and train_time < 1.0, train_time


def test_compile_default_is_on_for_cuda_only(shakespeare_char_dir, tmp_path, fake_gpu):
    from machinery import speed
    fake_gpu()  # an H100: the default asks the GPU's compute capability (Triton's floor, 7.0: tests/test_fake_gpu.py)
    assert speed.compile_default('cuda') is True
    assert speed.compile_default('cpu') is False and speed.compile_default('mps') is False
    p = train(shakespeare_char_dir, str(tmp_path / 'run'), '--compile=auto', '--max_iters=2', '--eval_interval=2')
    assert_ok(p)
    assert 'compile False' in next(l for l in p.stdout.splitlines() if l.startswith('device '))
