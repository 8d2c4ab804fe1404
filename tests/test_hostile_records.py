"""Hostile inputs of the wrong kind or shape: settings of another type or beyond any memory, checkpoints whose content
is not what train.py writes, log records of another shape, and a Ctrl-C while a command starts. Each ends as
test_hostile.py's cases do (one sentence, exit status 2, no traceback, every file as it was), a record of another
shape is set aside as a damaged line is, and a Ctrl-C at any moment ends a command with status 130 (a SIGTERM
compare.py with 143)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_hostile import TINY, call, files, message_lines, world  # noqa: E402,F401 (world: the fixture)
import compare  # noqa: E402
import configurator  # noqa: E402
import inspect_run  # noqa: E402
import sample  # noqa: E402
import train  # noqa: E402
from activations import VARIANTS  # noqa: E402
from machinery import cli, run_log  # noqa: E402
from comparison import report, runs
from model import GPT  # noqa: E402


def config_file(text):
    def make(w, tmp):
        (tmp / 'c.py').write_text(text)
        return [str(tmp / 'c.py')]
    return make


def args(*a):
    return lambda w, tmp: list(a)


def assert_one_sentence(code, err, want_code, words):
    lines = message_lines(err)
    assert code == want_code and 'Traceback' not in err and len(lines) == 1, err
    for w in words:
        assert w in lines[0], (w, lines[0])


# ----------------------------------------------------------------------------------------------------------------------
# settings of the wrong kind, or too big for any memory

SETTINGS = [
    ('a function for a float', train, config_file('learning_rate = lambda it: 1e-3\n'),
     ['c.py: learning_rate expects a float', 'a function']),
    ('a module for a string', train, config_file('import os\ndataset = os\n'), ['c.py: dataset expects a string']),
    ('NUL in out_dir', train, config_file('out_dir = "out\\0put"\n'), ['c.py: out_dir holds a NUL']),
    ('NUL in data_dir', train, config_file('data_dir = "da\\0ta"\n'), ['c.py: data_dir holds a NUL']),
    ('NUL in compare.py out_dir', compare, args('--out_dir=out\0put'), ['--out_dir holds a NUL']),
    ('NUL in compare.py data_dir', compare, config_file('data_dir = "da\\0ta"\n'), ['c.py: data_dir holds a NUL']),
    ('int beyond 64 bits', train, args(f'--vocab_size={10**30}'), ['--vocab_size must lie within -2**63']),
    ('int beyond 64 bits in a config file', train, config_file('vocab_size = 10**30\n'), ['c.py: vocab_size must lie']),
    ('int beyond 64 bits written as a float', train, args('--max_iters=1e30', '--batch_size=0'),  # never trained
     ['--max_iters must lie within -2**63']),
    ('int beyond any float for a float', train, config_file('learning_rate = 10**400\n'), ['learning_rate must lie']),
    ('n_embd 10**15', train, args('--n_embd=1000000000000000'), ['needs at least', 'lower n_layer, n_embd']),
    ('vocab_size 2**62', train, args(f'--vocab_size={2**62}'), ['needs at least', 'or vocab_size']),
    ('n_layer 10**9', train, args('--n_layer=1000000000'), ['needs at least', 'lower n_layer']),
    ('10**9 sequences a batch', train, args('--batch_size=1000000000'), ['needs at least', 'lower batch_size']),
    ('10**9 validation batches', train, args('--eval_iters=1000000000'), ['needs at least', 'or eval_iters']),
    ('block_size 10**9 of RoPE tables', train, args('--block_size=1000000000', '--batch_size=1'), ['needs at least']),
    ('an FFN wider than int64', train, args('--ffn_mult=1e300'), ['ffn_mult=1e+300', '2**63 - 1 units wide']),
    ('negative vocab_size', train, args('--vocab_size=-1'), ['--vocab_size must not be negative']),
    ('negative aux_loss_weight', train, args('--aux_loss_weight=-1'), ['--aux_loss_weight must be a finite']),
    ('nan z_loss_weight', train, config_file("z_loss_weight = float('nan')\n"), ['--z_loss_weight must be a finite']),
    ('10**12 histogram bins', inspect_run, lambda w, tmp: [f'--out_dir={w.run}', '--bins=1000000000000'],
     ['--bins must be between 2 and 1000']),
]


@pytest.mark.parametrize('case,script,extra,words', SETTINGS, ids=[c[0] for c in SETTINGS])
def test_settings_of_the_wrong_kind_or_size(case, script, extra, words, world, tmp_path, capsys):
    base = TINY + [f'--data_dir={world.data}', f'--out_dir={tmp_path / "out"}', '--max_iters=2']
    argv = (base if script is train else []) + extra(world, tmp_path)
    before = files(world.root, tmp_path)
    code, err = call(script.main, argv, capsys)
    assert_one_sentence(code, err, 2, words)
    assert files(world.root, tmp_path) == before and not os.path.exists(tmp_path / 'out')


def test_a_run_that_does_not_fit_names_its_size_and_the_machines(world, tmp_path, capsys, monkeypatch):
    """The tiny run needs 16 bytes for each of its 16,384 counted parameters, its RoPE tables, a batch's logits and the
    validation windows, 0.000334 GB: on a device of 0.0001 GB it is refused before anything is built; here it trains."""
    monkeypatch.setattr(configurator.device, 'memory_bytes', lambda name: 10**5)
    argv = TINY + [f'--data_dir={world.data}', f'--out_dir={tmp_path / "out"}', '--max_iters=2']
    code, err = call(train.main, argv, capsys)
    assert_one_sentence(code, err, 2, ['needs at least 0.000334 GB', '1.64e+4 parameters', 'this machine has 0.0001'])
    monkeypatch.undo()
    assert call(train.main, argv, capsys)[0] == 0


@pytest.mark.parametrize('variant', list(VARIANTS))
def test_min_params_is_a_lower_bound_within_3_percent(variant):
    """min_params counts the matrices from the settings alone; the model on the meta device has them and its norms and
    activation extras: dense, MoE in every other block, learned positions."""
    for extra in ({}, {'n_expert': 4, 'top_k': 2, 'moe_every': 2}, {'pos': 'learned'}):
        settings = {**configurator.DEFAULTS, 'n_layer': 3, 'n_embd': 64, 'n_head': 2, 'vocab_size': 65,
                    'ffn': variant, **extra}
        exact = sum(p.numel() for p in runs.meta_model(settings, '').parameters())
        assert 0.97 * exact <= configurator.min_params(configurator.model_config(settings)) <= exact, extra


# ----------------------------------------------------------------------------------------------------------------------
# checkpoints of the wrong content: one sentence naming the file from each of their three readers, nothing changed


def other_weights(ckpt):
    ckpt['model'] = GPT(configurator.model_config({**ckpt['model_args'], 'n_embd': 64})).state_dict()


def a_parameter_in_the_other_group(ckpt):
    groups = ckpt['optimizer']['param_groups']
    groups[1]['params'].append(groups[0]['params'].pop())


def state(part, **change):
    return lambda c: c[part][0].update(change)


CHECKPOINTS = [
    ("another model's weights", other_weights),
    ('a weight missing', lambda c: c['model'].pop('transformer.h.0.ffn.w_up.weight')),
    ('a config without dataset', lambda c: c['config'].pop('dataset')),
    ('no meta', lambda c: c.pop('meta')),
    ('iter_num a string', lambda c: c.update(iter_num='2')),
    ('a setting of another type', lambda c: c['config'].update(batch_size='4')),
    ('model_args of a model too big', lambda c: c['model_args'].update(n_embd=2**20)),
    ('a list, not a dict', lambda c: c.clear()),
    ('char vocabulary of ints', lambda c: c['meta'].update(itos=list(range(c['meta']['vocab_size'])))),
]
RESUMED = [  # what only a resume loads: each state checked by its owner as it loads
    ('an optimizer without its state', lambda c: c['optimizer'].pop('state')),
    ('optimizer groups without their parameters', lambda c: c['optimizer']['param_groups'][0].pop('params')),
    ('a moment of another shape', lambda c: c['optimizer']['state'][0].update(exp_avg=torch.zeros(3))),
    ('a moment missing', lambda c: c['optimizer']['state'][0].pop('exp_avg_sq')),
    ('a parameter in the other group', a_parameter_in_the_other_group),
    ('an optimizer step of -5', lambda c: [s.update(step=torch.tensor(-5.0)) for s in c['optimizer']['state'].values()]),
    ('a numpy RNG state a word short', lambda c: c['rng'][0]['numpy'][1].pop()),
    ('a Python RNG position past its words', state('rng', python=(3, (0,) * 624 + (700,), None))),
    ('a torch RNG state cut short', lambda c: c['rng'][0].update(torch=c['rng'][0]['torch'][:100])),
    ('a zeroed torch RNG state', lambda c: c['rng'][0]['torch'].zero_()),
    ('an RNG state of numbers', lambda c: c['rng'].__setitem__(0, 5)),
    ('a negative loader position', state('loader', step=-1)),
    ('a loader position off by one', lambda c: c['loader'][0].update(step=c['loader'][0]['step'] + 1)),
    ('a loader position of 2**62', state('loader', step=2**62)),
    ('a loader of another world size', state('loader', world_size=2)),
    ('another batch hash', state('loader', batch_hash='ab' * 32)),
    ('a batch hash that is not hex', state('loader', batch_hash='xyz')),
    ('a loader state without its seed', lambda c: c['loader'][0].pop('seed')),
]
READERS = {'resume': (train, lambda d: ['--init_from=resume', f'--out_dir={d}', '--max_iters=4']),
           'sample': (sample, lambda d: [f'--out_dir={d}', '--device=cpu']),
           'inspect': (inspect_run, lambda d: [f'--out_dir={d}'])}
CASES = [(c, change, r) for c, change in CHECKPOINTS for r in READERS] + [(c, change, 'resume') for c, change in RESUMED]


@pytest.mark.parametrize('case,change,reader', CASES, ids=[f'{c[0]}-{c[2]}' for c in CASES])
def test_checkpoints_of_the_wrong_content(case, change, reader, world, tmp_path, capsys):
    """train.py wrote a checkpoint, then it changed: whichever part a reader uses, one sentence (exit status 2, no
    traceback), and the checkpoint and the log as they were. A change a reader does not use is no failure of it."""
    ckpt = torch.load(os.path.join(world.run, 'ckpt.pt'), weights_only=True)
    change(ckpt)
    torch.save(list(ckpt) if case == 'a list, not a dict' else ckpt, tmp_path / 'ckpt.pt')
    shutil.copy(os.path.join(world.run, 'log.jsonl'), tmp_path)
    script, argv = READERS[reader]
    before = files(world.root, tmp_path)
    code, err = call(script.main, argv(tmp_path), capsys)
    if (case, reader) in UNUSED:
        assert code == 0, err
    else:
        assert_one_sentence(code, err, 2, [])
        assert files(world.root, tmp_path) == before


UNUSED = {('a config without dataset', 'sample'), ('a setting of another type', 'sample'), ('iter_num a string', 'sample'),
          ('iter_num a string', 'inspect')}


# ----------------------------------------------------------------------------------------------------------------------
# log records: a JSON object with an int 'iter' is one; any other line is set aside

GOOD = {'iter': 4, 'tokens': 512, 'lr': 1e-3, 'loss': 4.0, 'val_loss': 4.1, 'val_halves': [4.0, 4.2], 'val_hash': 'ab',
        'batch_hash': 'cd', 'mfu': None}
NOT_RECORDS = {'iter of 2**63': 2**63, 'iter a float': 4.0, 'iter a bool': True, 'negative iter': -1, 'no iter': None,
               'iter a string': '4'}


@pytest.mark.parametrize('case', list(NOT_RECORDS))
def test_lines_that_are_not_records_are_set_aside(case, tmp_path):
    record = {**GOOD, 'iter': NOT_RECORDS[case]} if case != 'no iter' else {k: v for k, v in GOOD.items() if k != 'iter'}
    bad = json.dumps(record) + '\n'
    assert run_log.parse_record(bad) is None
    path = tmp_path / 'log.jsonl'
    path.write_text(json.dumps({**GOOD, 'iter': 0}) + '\n' + bad + json.dumps(GOOD) + '\n')
    records, damaged = run_log.read_log_lines(str(path))
    assert [r['iter'] for r in records] == [0, 4] and damaged == [bad]


def test_lines_the_parser_cannot_take_are_set_aside():
    for line in ['[' * 100_000 + ']' * 100_000, '{"iter": 1' + '0' * 5000 + '}', '{"iter": 4, "ms": Infinity}']:
        assert run_log.parse_record(line) is None


def test_seeds_whose_learned_quantities_disagree_in_shape_are_averaged_where_they_agree():
    """Two records, one seed's alpha named numbers and the other's a number: the summary's mean leaves alpha out, in
    either order, and keeps what the seeds agree on."""
    a = {'layers': [{'act': {'alpha': {'gelu': 1.0, 'silu': 0.0}, 'c_std': {'gelu': 0.5}}}]}
    b = {'layers': [{'act': {'alpha': 0.5, 'c_std': {'gelu': 0.25}}}]}
    for seeds in ([a, b], [b, a]):
        assert report.mean_over_seeds(seeds) == {'layers': [{'act': {'c_std': {'gelu': 0.375}}}]}


def test_a_real_run_logs_only_records(world):
    lines = open(os.path.join(world.run, 'log.jsonl')).readlines()
    records, damaged = run_log.read_log_lines(os.path.join(world.run, 'log.jsonl'))
    assert damaged == [] and len(records) == len(lines) == 2 and 'val_halves' in records[-1]


# ----------------------------------------------------------------------------------------------------------------------
# Ctrl-C and SIGTERM at the edges


def test_main_gets_python_ctrl_c_and_the_rest_the_quiet_one():
    """quiet_interrupt holds until run_cli starts main, which gets Python's KeyboardInterrupt (a run stops cleanly),
    and is back once main is done; a module imported rather than run, or a SIGINT ignored, is left alone."""
    before = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        cli.quiet_interrupt('train')
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        cli.quiet_interrupt('__main__')
        assert signal.getsignal(signal.SIGINT) is cli._interrupted
        assert cli.run_cli(lambda argv: signal.getsignal(signal.SIGINT), []) is signal.default_int_handler
        assert signal.getsignal(signal.SIGINT) is cli._interrupted
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cli.quiet_interrupt('__main__')
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


COMMANDS = ['train.py', 'compare.py', 'sample.py', 'inspect_run.py', 'bench.py',
            *(f'data/{d}/prepare.py' for d in ('shakespeare_char', 'shakespeare', 'text', 'openwebtext', 'fineweb10B'))]


@pytest.mark.parametrize('script', COMMANDS)
def test_on_windows_a_command_says_at_once_where_it_runs(script):
    """Without flock and POSIX signals a command would fail deep inside (or a stale-file check end another process):
    on Windows every command stops before it imports anything else, in one sentence that names WSL, status 2."""
    run_as_windows = (f"import runpy, sys; sys.platform = 'win32'; sys.argv = [{script!r}]; "
                      f"runpy.run_path({script!r}, run_name='__main__')")
    p = subprocess.run([sys.executable, '-c', run_as_windows], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout) == (2, '') and p.stderr == (
        'error: nanoFFN runs on Linux and macOS; on Windows, run it in WSL (wsl --install).\n'), p.stderr


@pytest.mark.skipif(not os.path.exists('/proc/self/maps'), reason='watches the import of torch in /proc')
@pytest.mark.parametrize('script', COMMANDS)
def test_ctrl_c_while_a_command_imports_torch(script, tmp_path):
    """SIGINT as soon as the command has begun to load its heaviest library, in the middle of `import torch` (a prepare
    script's: numpy, it imports no torch): status 130, one line. The child takes SIGINT as in a terminal (a shell's
    background job would ignore it). Its argument would stop it at once if the signal came too late."""
    arg = f'--json={tmp_path}' if script == 'bench.py' else f'--out_dir={tmp_path}'
    p = subprocess.Popen([sys.executable, script, arg], cwd=ROOT, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 60
        library = '_multiarray_umath' if script.startswith('data/') else 'libtorch'
        while library not in open(f'/proc/{p.pid}/maps').read():
            assert p.poll() is None and time.time() < deadline, p.communicate()
            time.sleep(0.005)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()  # a command the signal missed would go on to train
    assert (p.returncode, err, out) == (130, 'interrupted.\n', '')


def test_sigterm_while_a_config_file_runs_ends_as_any_sigterm(tmp_path):
    """compare.py stops on SIGTERM as on Ctrl-C: one that arrives while a config file executes ends it with
    'terminated.' and status 143, as it would a moment later, not as the file's own sys.exit (an error, status 2)."""
    (tmp_path / 'c.py').write_text('import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(60)\n')
    p = subprocess.run([sys.executable, 'compare.py', str(tmp_path / 'c.py'), f'--out_dir={tmp_path / "out"}'],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stderr, p.stdout) == (143, 'terminated.\n', '')
    assert os.listdir(tmp_path) == ['c.py']
