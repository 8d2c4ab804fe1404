"""torch.compile in train.py: regional compilation compiles each distinct graph once (training, and evaluation where
the run compiles it) and never again within a run; a second process of the same variant is served from the shared
on-disk caches; compiled training follows eager training; checkpoints keep plain keys.

A cold compile costs tens of seconds on a 2-core CPU, so every run here has the same tiny shape (2 layers, d=32) and
shares one cache directory: only the first process compiles, the others load."""
import json
import os
import subprocess
import sys

import pytest
import torch

from common import model_state
from model import GPT, GPTConfig

sys.path.insert(0, os.path.dirname(__file__))
from test_train import ROOT, assert_ok, log, train  # noqa: E402

SHAPE = ['--n_layer=2', '--max_iters=7', '--eval_interval=3', '--log_interval=2', '--ffn=moa_glu']


def compile_line(p):
    """The `compile: {...}` line train.py prints at the end of a compiled run (common.compile_stats)."""
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
    # the block's training graph (forward + backward): 1 graph, 2 compiled code modules; evaluation runs eager (these
    # runs evaluate 4 x 2 batches, under train.CPU_COMPILE_EVAL_BATCHES). The graph is an AOTAutograd cache entry:
    # compiled, MoA-GLU is plain operations, no custom autograd Function (a graph with one is skipped by that cache
    # and traced again by every process), and its CPU policy of what backward keeps carries the key that cache asks
    # of such a policy (activations.py)
    assert first['graphs'] == second['graphs'] == 1
    assert first['fx_cache_hit'] == 0 and first['fx_cache_miss'] == 2
    assert first['aot_cache_hit'] == 0 and first['aot_cache_miss'] == 1
    assert second['fx_cache_miss'] == 0 and second['fx_cache_hit'] == 2
    assert second['aot_cache_miss'] == 0 and second['aot_cache_hit'] == 1


# train.py's main in a fresh process, then Dynamo's own record of what it compiled (forward frames; a backward
# compiled lazily is an entry of its own)
COUNT = """
import json, sys
import configurator, train
from torch._dynamo.utils import counters, get_compilation_metrics
try:
    configurator.run_cli(train.main, sys.argv[2:])
except SystemExit as e:
    assert e.code in (0, None), e.code
frames = [[m.co_name, m.co_filename, m.recompile_reason] for m in get_compilation_metrics() if m.is_forward]
print('counted: ' + json.dumps({'graphs': counters['stats']['unique_graphs'], 'frames': frames}))
"""


def test_one_compile_per_graph_and_no_recompiles(cache_runs, shakespeare_char_dir, tmp_path):
    """Over a run with 4 evaluations (iterations 0, 3, 6, 7) of 250 batches, enough for a CPU run to compile its
    evaluation (train.CPU_COMPILE_EVAL_BATCHES), a last log window of one step, a learning rate that changes every
    step and learned() on every evaluation line: Dynamo compiles the Block once for training and once for evaluation
    (the second layer reuses the first's graph), and nothing else."""
    cache, _, _ = cache_runs
    out = str(tmp_path / 'run')
    from train import CPU_COMPILE_EVAL_BATCHES
    assert 4 * 250 >= CPU_COMPILE_EVAL_BATCHES
    p = train(shakespeare_char_dir, out, *SHAPE, '--compile=True', '--eval_iters=250',
              launcher=[sys.executable, '-c', COUNT], extra_env={'TORCHINDUCTOR_CACHE_DIR': cache})
    assert_ok(p)
    counted = json.loads(next(l for l in p.stdout.splitlines() if l.startswith('counted: '))[len('counted: '):])
    assert counted['graphs'] == 2
    frames = counted['frames']
    assert [(name, os.path.basename(path)) for name, path, _ in frames] == [('forward', 'model.py')] * 2
    assert frames[0][2] is None and 'grad_mode' in frames[1][2]  # evaluation: no_grad, a graph of its own
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
    assert compile_line(p)['graphs'] == 1  # rank 0's process: no graph of its own for DDP, evaluation eager
    assert_ok(train(shakespeare_char_dir, one_out, *SHAPE, '--compile=False', '--seed=1',
                    '--gradient_accumulation_steps=2'))
    assert_same_losses(ddp_out, one_out)


def test_model_state_strips_compiled_prefixes_inside_blocks():
    """A block compiled as a wrapper (torch.compile(block)) and a wrapped model ('_orig_mod.', 'module.') both load
    into a plain GPT."""
    model = GPT(GPTConfig(vocab_size=84, n_layer=2, n_head=2, n_embd=32, block_size=32))
    plain = set(model.state_dict())
    model.transformer.h[1] = torch.compile(model.transformer.h[1])  # compiled lazily: nothing is compiled here
    wrapped = torch.compile(model).state_dict()
    assert any('h.1._orig_mod.' in k for k in wrapped) and all(k.startswith('_orig_mod.') for k in wrapped)
    assert set(model_state(wrapped)) == plain


# compile_model on a CPU model, then on a model on the meta device (what a CUDA model is to this check: no CPU kernel)
ISA_CHECK = """
import sys, threading, torch
from common import compile_model
from model import GPT, GPTConfig
from torch._inductor.cpu_vec_isa import pick_vec_isa, valid_vec_isa_list
config = GPTConfig(vocab_size=84, n_layer=2, n_head=2, n_embd=32, block_size=32)
assert valid_vec_isa_list.cache_info().currsize == 0
imported_by_check = []  # modules loaded on the check's thread (the audit event fires when a module is loaded)
sys.addaudithook(lambda event, args: event == 'import' and threading.current_thread().name ==
                 'inductor-cpu-isa-check' and imported_by_check.append(args[0]))
compile_model(GPT(config), 'regional')
[thread] = [t for t in threading.enumerate() if t.name == 'inductor-cpu-isa-check']
thread.join()
assert imported_by_check == [], imported_by_check
checked = valid_vec_isa_list.cache_info()
picked = pick_vec_isa()
with torch.device('meta'):
    compile_model(GPT(config), 'regional')
print(checked.currsize, checked.hits, valid_vec_isa_list.cache_info().hits, bool(picked),
      sum(t.name == 'inductor-cpu-isa-check' for t in threading.enumerate()))
"""


def test_compiling_for_a_cpu_checks_the_vector_isa_before_the_first_kernel(tmp_path):
    """Compiling a CPU model starts Inductor's once-per-process check of the vector instruction sets its compiler can
    build on a thread: when Inductor then picks one for its first kernel, it takes the thread's cached answer
    (a cache hit) instead of checking again. The thread imports no module that compile_model had not imported before
    starting it (two threads importing at once can see half-initialised modules). A model that is not on the CPU
    starts no check."""
    p = subprocess.run([sys.executable, '-c', ISA_CHECK], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, 'TORCHINDUCTOR_CACHE_DIR': str(tmp_path)})
    assert p.returncode == 0, p.stderr[-2000:]
    size, hits_before, hits_after, vectorised, threads_after_meta = map(eval, p.stdout.split())
    assert (size, hits_before, hits_after) == (1, 0, 1)
    assert vectorised  # this machine's compiler builds at least one vector ISA: the check found it
    assert threads_after_meta == 0


def test_unknown_compile_mode_is_a_user_error(shakespeare_char_dir, tmp_path):
    p = train(shakespeare_char_dir, str(tmp_path / 'x'), '--compile_mode=layers')
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and 'Traceback' not in p.stderr and len(lines) == 1, p.stderr
    assert all(w in lines[0] for w in ('--compile_mode', 'regional', 'whole')), lines[0]
    assert not os.path.exists(tmp_path / 'x')


def test_compile_seconds_are_logged_apart_from_step_time(cache_runs):
    """Each record of a compiled run carries the seconds it has spent compiling so far (compile_s), and its step times
    (ms) leave them out: the cold run's first step compiles for seconds, while 7 steps of a 2-layer, d=32 model take
    a fraction of one. Had compiling been counted as step time, the train time would exceed half the compile time."""
    _, outs, stats = cache_runs
    for out, printed in zip(outs, stats):
        records = log(out)
        # iteration 0 evaluates before any training step, eagerly (8 batches): nothing is compiled yet
        assert records[0]['iter'] == 0 and records[0]['compile_s'] == 0 and records[1]['compile_s'] > 0
        assert records[-1]['compile_s'] == pytest.approx(printed['compile_s'], abs=0.01)
        train_time, prev = 0.0, 0
        for r in records:
            train_time += r.get('ms', 0.0) / 1000.0 * (r['iter'] - prev)
            prev = r['iter']
        if out == outs[0]:  # cold: compiled the graphs
            assert printed['fx_cache_miss'] > 0 and train_time < 0.2 * printed['compile_s'], (train_time, printed)


def test_the_summary_table_shows_compile_seconds_when_compiled():
    from report import table
    row = {'params': {'total': 1000, 'ffn': 500, 'extras': 0}, 'status': 'done', 'diff_to_baseline': None,
           'final_val_loss': {'mean': 2.0, 'std': 0.1}, 'tok_s': 1000.0, 'train_time_s': 3.0}
    eager = table({'baseline': 'gelu', 'variants': {'gelu': dict(row)}}).splitlines()
    compiled = table({'baseline': 'gelu', 'variants': {'gelu': dict(row, compile_s=12.34)}}).splitlines()
    assert 'compile' not in eager[0] and eager[2].endswith('| 3.0 s |')
    assert compiled[0].endswith('| compile |') and compiled[2].endswith('| 3.0 s | 12.3 s |')


def test_compile_default_follows_the_number_of_steps(monkeypatch):
    """--compile left to its default: on CUDA always; on a CPU from CPU_COMPILE_STEPS steps on (given a C++
    compiler: see the next test); never on MPS."""
    import train
    from train import CPU_COMPILE_STEPS, use_compile
    monkeypatch.setattr(train, 'cpp_compiler_found', lambda: True)
    assert use_compile('cuda', 1)[0] is True
    assert use_compile('cpu', CPU_COMPILE_STEPS)[0] is True and use_compile('cpu', CPU_COMPILE_STEPS - 1)[0] is False
    assert use_compile('mps', 10 ** 9)[0] is False


def test_evaluation_compiles_on_a_cpu_only_from_enough_batches():
    """A compiled run compiles its evaluation on CUDA always and on a CPU from CPU_COMPILE_EVAL_BATCHES batches on,
    counting its evaluations at iteration 0, every eval_interval and at max_iters."""
    from train import CPU_COMPILE_EVAL_BATCHES, compile_evaluation, evaluations
    assert compile_evaluation('cuda', 1) is True
    assert compile_evaluation('cpu', CPU_COMPILE_EVAL_BATCHES) is True
    assert compile_evaluation('cpu', CPU_COMPILE_EVAL_BATCHES - 1) is False
    assert evaluations({'max_iters': 300, 'eval_interval': 50}) == 7  # 0, 50, ..., 300
    assert evaluations({'max_iters': 7, 'eval_interval': 3}) == 4  # 0, 3, 6 and 7


def test_without_a_cpp_compiler_a_cpu_run_stays_eager_and_says_why():
    """Inductor builds CPU kernels with $CXX (else g++): pointed at no compiler, the default is eager, not a crash."""
    code = "from train import use_compile; print(use_compile('cpu', 10 ** 6))"
    p = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, 'CXX': '/nonexistent/g++'})
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith('(False,') and 'no C++ compiler' in p.stdout, p.stdout


def test_a_small_cpu_run_says_why_it_is_not_compiled(shakespeare_char_dir, tmp_path):
    p = train(shakespeare_char_dir, str(tmp_path / 'run'), '--compile=auto', '--max_iters=2', '--eval_interval=2')
    assert_ok(p)
    line = next(l for l in p.stdout.splitlines() if l.startswith('device '))
    assert 'compile False (2 steps, under the' in line and '--compile=True' in line, line
    assert all('compile_s' not in r for r in log(str(tmp_path / 'run')))


def test_a_resumed_run_decides_by_its_whole_length(shakespeare_char_dir, tmp_path):
    """The default is decided from the run's max_iters, not from the steps left: a resumed run keeps the code path
    (compiled or eager) it started on, as long as its length is unchanged."""
    run = str(tmp_path / 'run')
    assert_ok(train(shakespeare_char_dir, run, '--compile=auto', '--max_iters=2', '--eval_interval=2'))
    p = train(shakespeare_char_dir, run, '--compile=auto', '--init_from=resume', '--max_iters=4')
    assert_ok(p)
    line = next(l for l in p.stdout.splitlines() if l.startswith('device '))
    assert 'compile False (4 steps, under the' in line, line  # 4 steps in the run, 2 of them left
