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
from machinery import cli, report, run_log  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402


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
        exact = sum(p.numel() for p in configurator.meta_model(settings, '').parameters())
        assert 0.97 * exact <= configurator.min_params(configurator.model_config(settings)) <= exact, extra


# ----------------------------------------------------------------------------------------------------------------------
# checkpoints of the wrong content: the same sentence from each of their three readers


def other_weights(ckpt):
    ckpt['model'] = GPT(configurator.model_config({**ckpt['model_args'], 'n_embd': 64})).state_dict()


CHECKPOINTS = [
    ("another model's weights", other_weights,
     ['transformer.wte.weight is [128, 64] there and [128, 32] in the model', 'n_embd 32', 'train the run again']),
    ('a weight missing', lambda c: c['model'].pop('transformer.h.0.ffn.w_up.weight'),
     ['transformer.h.0.ffn.w_up.weight is missing there', 'point --out_dir at the right run directory']),
    ('a config without dataset', lambda c: c['config'].pop('dataset'), ["its config has no 'dataset'"]),
    ('no meta', lambda c: c.pop('meta'), ["its 'meta' is missing"]),
    ('iter_num a string', lambda c: c.update(iter_num='2'), ["its 'iter_num' is a str"]),
    ('a setting of another type', lambda c: c['config'].update(batch_size='4'), ["its config['batch_size'] is '4'"]),
    ('model_args of a model too big', lambda c: c['model_args'].update(n_embd=2**20),
     ['they hold fewer values than its 13,194,273,751,040 parameters']),
    # each process's states, as their writers make them
    ('an optimizer without its state', lambda c: c['optimizer'].pop('state'), ["its optimizer's 'state' is missing"]),
    ('optimizer groups without their parameters', lambda c: c['optimizer']['param_groups'][0].pop('params'),
     ["its optimizer's param_groups are not lists of parameter ids"]),
    ('a numpy RNG state a word short', lambda c: c['rng'][0]['numpy'][1].pop(),
     ["its rng[0]['numpy'] is not as train.py saves it"]),
    ('a Python RNG position past its words', lambda c: c['rng'][0].update(python=(3, (0,) * 624 + (700,), None)),
     ["its rng[0]['python'] is not as train.py saves it"]),
    ('a torch RNG state cut short', lambda c: c['rng'][0].update(torch=c['rng'][0]['torch'][:100]),
     ["its rng[0]['torch'] is not as train.py saves it"]),
    ('an RNG state of numbers', lambda c: c['rng'].__setitem__(0, 5), ['its rng[0] is a int']),
    ('a negative loader position', lambda c: c['loader'][0].update(step=-1), ["its loader[0]['step'] is -1"]),
    ('a batch hash that is not hex', lambda c: c['loader'][0].update(batch_hash='xyz'),
     ["its loader[0]['batch_hash'] is 'xyz'"]),
    ('a loader state without its seed', lambda c: c['loader'][0].pop('seed'), ["its loader[0]['seed'] is missing"]),
]
READERS = {'resume': (train, lambda d: ['--init_from=resume', f'--out_dir={d}']),
           'sample': (sample, lambda d: [f'--out_dir={d}', '--device=cpu']),
           'inspect': (inspect_run, lambda d: [f'--out_dir={d}'])}


@pytest.mark.parametrize('reader', list(READERS))
@pytest.mark.parametrize('case,change,words', CHECKPOINTS, ids=[c[0] for c in CHECKPOINTS])
def test_checkpoints_of_the_wrong_content(case, change, words, reader, world, tmp_path, capsys):
    ckpt = torch.load(os.path.join(world.run, 'ckpt.pt'), weights_only=True)
    change(ckpt)
    torch.save(ckpt, tmp_path / 'ckpt.pt')
    shutil.copy(os.path.join(world.run, 'log.jsonl'), tmp_path)
    script, argv = READERS[reader]
    before = files(world.root, tmp_path)
    code, err = call(script.main, argv(tmp_path), capsys)
    assert_one_sentence(code, err, 2, [str(tmp_path / 'ckpt.pt')] + words)
    assert files(world.root, tmp_path) == before  # the checkpoint and the log as they were


def moment_of_another_shape(ckpt):
    ckpt['optimizer']['state'][0]['exp_avg'] = torch.zeros(3)


def a_parameter_in_the_other_group(ckpt):
    groups = ckpt['optimizer']['param_groups']
    groups[1]['params'].append(groups[0]['params'].pop())


OPTIMIZERS = [
    ('a moment of another shape', moment_of_another_shape,
     ["its optimizer's state[0] holds {'step': [], 'exp_avg': [3], 'exp_avg_sq': [128, 32]}", 'AdamW keeps']),
    ('a moment missing', lambda c: c['optimizer']['state'][0].pop('exp_avg_sq'), ["its optimizer's state[0] holds"]),
    ('a parameter in the other group', a_parameter_in_the_other_group,
     ["its optimizer's param_groups hold [4, 4] parameters where the model's optimizer holds [5, 3]"]),
]


@pytest.mark.parametrize('case,change,words', OPTIMIZERS, ids=[c[0] for c in OPTIMIZERS])
def test_an_optimizer_state_that_does_not_fit_the_model_is_refused_before_a_resume(case, change, words, world,
                                                                                  tmp_path, capsys):
    """In torch's form, but not the state of the AdamW the checkpoint's model has: refused before the run directory
    changes, not at the first step (torch checks a moment's shape nowhere)."""
    ckpt = torch.load(os.path.join(world.run, 'ckpt.pt'), weights_only=True)
    change(ckpt)
    torch.save(ckpt, tmp_path / 'ckpt.pt')
    shutil.copy(os.path.join(world.run, 'log.jsonl'), tmp_path)
    before = files(world.root, tmp_path)
    code, err = call(train.main, ['--init_from=resume', f'--out_dir={tmp_path}', '--max_iters=4'], capsys)
    assert_one_sentence(code, err, 2, [f"cannot use the checkpoint {tmp_path / 'ckpt.pt'}"] + words)
    assert files(world.root, tmp_path) == before


# ----------------------------------------------------------------------------------------------------------------------
# log records of the wrong shape

DROP = object()  # a field left out
GOOD = {'iter': 4, 'tokens': 512, 'lr': 1e-3, 'loss': 4.0, 'val_loss': 4.1, 'val_halves': [4.0, 4.2], 'val_hash': 'ab',
        'batch_hash': 'cd', 'mfu': None, 'act': {'layers': [{'act': {'coeffs': {'a0': 0.0, 'a1': 0.5}}}, {}]}}
BAD = {
    'val_halves empty': {'val_halves': []},
    'val_halves one number': {'val_halves': [3.0]},
    'val_halves three numbers': {'val_halves': [3.0, 3.0, 3.0]},
    'val_halves nulls': {'val_halves': [None, None]},
    'val_halves strings': {'val_halves': ['a', 'b']},
    'val_halves NaN': {'val_halves': [float('nan'), 3.0]},
    'act layers of numbers': {'act': {'layers': [1]}},
    'act layers of nulls': {'act': {'layers': [None]}},
    'act part a number': {'act': {'layers': [{'act': 5}]}},
    'act coefficient a string': {'act': {'layers': [{'act': {'coeffs': {'a0': '1'}}}]}},
    'act coefficient a bool': {'act': {'layers': [{'act': {'alpha_p': True}}]}},
    'act coefficients nested too deep': {'act': {'layers': [{'act': {'coeffs': {'a0': {'b': 1.0}}}}]}},
    'act without layers': {'act': {}},
    'val_loss of 1e308': {'val_loss': 1e308},
    'loss beyond 1e6': {'loss': -2e6},
    'lr beyond a float32': {'lr': 1e300},
    'tokens of 10**400': {'tokens': 10**400},
    'iter of 10**400': {'iter': 10**400},
    'iter of 2**63': {'iter': 2**63},
    'iter a float': {'iter': 4.0},
    'iter a bool': {'iter': True},
    'negative iter': {'iter': -1},
    'no iter': {'iter': DROP},
    'a hash that is a number': {'val_hash': 5},
}


@pytest.mark.parametrize('case', list(BAD))
def test_records_of_the_wrong_shape_are_set_aside(case, tmp_path):
    record = {k: v for k, v in {**GOOD, **BAD[case]}.items() if v is not DROP}
    bad = json.dumps(record) + '\n'
    assert run_log.parse_record(bad) is None
    path = tmp_path / 'log.jsonl'
    path.write_text(json.dumps({**GOOD, 'iter': 0}) + '\n' + bad + json.dumps(GOOD) + '\n')
    records, damaged = run_log.read_log_lines(str(path))
    assert [r['iter'] for r in records] == [0, 4] and damaged == [bad]


def test_lines_the_parser_cannot_take_are_set_aside():
    for line in ['[' * 100_000 + ']' * 100_000, '{"iter": 1' + '0' * 5000 + '}', '{"iter": 4, "ms": Infinity}']:
        assert run_log.parse_record(line) is None


def reshaped(learned):
    """Copies of a GPT.learned report, each with one value of another shape: a quantity, or one of its named numbers,
    made a list (e.g. "alpha": [1, 2] for {"gelu": 1, "silu": 2}), or a quantity's names nested one level deeper."""
    for i, layer in enumerate(learned['layers']):
        for part, quantities in layer.items():
            for q, value in quantities.items():
                named = isinstance(value, dict)
                for other in ([list(value.values()), {'x': value}] + [{**value, n: [x]} for n, x in value.items()]
                              if named else [[value], {'x': {'y': value}}]):
                    copy = json.loads(json.dumps(learned))
                    copy['layers'][i][part][q] = other
                    yield copy


@pytest.mark.parametrize('variant', list(VARIANTS))
def test_what_train_py_logs_reads_back(variant):
    """Every variant's evaluation record, with what its activations learned in a dense and an MoE block, is a record;
    with any of those values of another shape (or a key beside the layers) it is set aside."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=65, ffn=variant, n_expert=2,
                          moe_every=2))
    learned = model.learned(torch.randint(65, (2, 8)))
    record = lambda act: json.dumps({**GOOD, 'ms': 12.5, 'tok_s': 1e4, 'grad_norm': 0.5, 'loss_total': 4.01,
                                     'aux': 0.01, 'z': 1e-3, 'act': act})
    assert run_log.parse_record(record(learned)) == json.loads(record(learned))
    others = list(reshaped(learned)) + [{**learned, 'n_layer': 2}]
    assert len(others) >= 5 and all(run_log.parse_record(record(act)) is None for act in others)


def test_seeds_whose_learned_quantities_disagree_in_shape_are_averaged_where_they_agree():
    """Two records as the schema allows them, one seed's alpha named numbers and the other's a number: the summary's
    mean leaves alpha out, in either order, and keeps what the seeds agree on."""
    a = {'layers': [{'act': {'alpha': {'gelu': 1.0, 'silu': 0.0}, 'c_std': {'gelu': 0.5}}}]}
    b = {'layers': [{'act': {'alpha': 0.5, 'c_std': {'gelu': 0.25}}}]}
    assert all(run_log.parse_record(json.dumps({**GOOD, 'act': act})) for act in (a, b))
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


@pytest.mark.skipif(not os.path.exists('/proc/self/maps'), reason='watches the import of torch in /proc')
@pytest.mark.parametrize('script', ['train.py', 'compare.py', 'sample.py', 'inspect_run.py', 'bench.py',
                                    *(f'data/{d}/prepare.py' for d in ('shakespeare_char', 'shakespeare', 'text',
                                                                       'openwebtext', 'fineweb10B'))])
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
