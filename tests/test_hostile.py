"""Hostile and careless inputs: the promise that a user mistake gets one sentence on stderr and exit status 2, a run
that must stop gets exit status 3 and keeps its last good checkpoint, and nothing already written is lost.

The matrix runs each case in this process through cli.run_cli (no interpreter start per case) and checks
the exit status, exactly one message line on stderr, no traceback, and every file that existed before the command
(shards, meta.json, ckpt.pt, log.jsonl, the config file) byte-identical afterwards. Cases that need a second
process (the run-directory lock, kill -9, two compare.py) run train.py / compare.py as subprocesses."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import sample  # noqa: E402
import train  # noqa: E402
from activations import VARIANTS  # noqa: E402
from data.loader import DataLoader  # noqa: E402
from data.shards import HEADER_BYTES, shard_info  # noqa: E402
from data.write import write_shard  # noqa: E402
from machinery.cli import run_cli  # noqa: E402

TINY = ['--seed=1337', '--device=cpu', '--dtype=float32', '--compile=False', '--n_layer=1', '--n_head=2', '--n_embd=32',
        '--block_size=32', '--batch_size=4', '--eval_iters=2', '--warmup_iters=0']
DIVERGING = ['--ffn=polyrelu', '--learning_rate=100', '--grad_clip=0', '--max_iters=40', '--eval_interval=1']


@pytest.fixture(scope='module')
def world(shakespeare_char_dir, tmp_path_factory):
    """A private copy of shakespeare_char (cases damage their own copies of it) and one finished 2-iteration run."""
    root = tmp_path_factory.mktemp('hostile')
    data = root / 'data'
    shutil.copytree(os.path.join(shakespeare_char_dir, 'shakespeare_char'), data / 'shakespeare_char')
    run = root / 'run'
    run_cli(train.main, TINY + [f'--data_dir={data}', f'--out_dir={run}', '--max_iters=2', '--eval_interval=2'])
    return SimpleNamespace(root=root, data=str(data), run=str(run))


def files(*dirs):
    """path -> bytes of every file under dirs."""
    out = {}
    for d in dirs:
        for base, _, names in os.walk(d):
            for n in names:
                with open(os.path.join(base, n), 'rb') as f:
                    out[os.path.join(base, n)] = f.read()
    return out


def message_lines(err):
    """stderr's lines, without progress-bar redraws (tqdm's 'desc: 40%|####  | 4/10 [...]')."""
    return [l for l in err.replace('\r', '\n').splitlines() if l.strip() and '%|' not in l]


def call(main, argv, capsys):
    """(exit status, stderr) of a script's main(argv) run as its command line runs it (cli.run_cli); 0
    when it ends normally."""
    capsys.readouterr()
    try:
        run_cli(main, argv)
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def data_copy(w, tmp):
    """A copy of the dataset under tmp, for a case that damages it: (data_dir, dataset dir)."""
    shutil.copytree(os.path.join(w.data, 'shakespeare_char'), tmp / 'data' / 'shakespeare_char')
    return str(tmp / 'data'), tmp / 'data' / 'shakespeare_char'


def with_meta(content):
    def make(w, tmp):
        data, d = data_copy(w, tmp)
        (d / 'meta.json').write_bytes(content)
        return [f'--data_dir={data}']
    return make


def with_shard(name, tokens, recorded):
    """The dataset with shard `name` replaced by tokens; recorded=False zeroes the header's largest-id field, as a
    shard written by another tool has it."""
    def make(w, tmp):
        data, d = data_copy(w, tmp)
        write_shard(str(d / name), tokens)
        if not recorded:
            with open(d / name, 'r+b') as f:
                f.seek(12)
                f.write(b'\0\0\0\0')
        return [f'--data_dir={data}']
    return make


def config_file(content):
    def make(w, tmp):
        (tmp / 'c.py').write_bytes(content)
        return [str(tmp / 'c.py')]
    return make


def a_file_as_out_dir(w, tmp):
    (tmp / 'f').write_text('not a directory\n')
    return [f'--out_dir={tmp / "f"}']


def read_only_out_dir(w, tmp):
    if os.geteuid() == 0:  # root writes through file permissions; /sys refuses new entries even to root
        return ['--out_dir=/sys/nanoffn-hostile-test/run']
    (tmp / 'ro').mkdir()
    os.chmod(tmp / 'ro', 0o555)
    return [f'--out_dir={tmp / "ro" / "run"}']


def foreign_checkpoint(w, tmp):
    torch.save({'weights': torch.zeros(3)}, tmp / 'ckpt.pt')
    return ['--init_from=resume', f'--out_dir={tmp}']


def nanogpt_checkpoint(w, tmp):
    """nanoGPT's ckpt.pt (its default out_dir is also 'out'): the same top-level keys, but not this project's model."""
    torch.save({'model': {}, 'optimizer': {}, 'iter_num': 100, 'best_val_loss': 1.5, 'config': {}, 'model_args': dict(
        n_layer=1, n_head=2, n_embd=32, block_size=32, bias=False, vocab_size=65, dropout=0.0)}, tmp / 'ckpt.pt')
    return [f'--out_dir={tmp}']


def nonfinite_checkpoint(resume):
    def make(w, tmp):
        ckpt = torch.load(os.path.join(w.run, 'ckpt.pt'), weights_only=True)
        next(iter(ckpt['model'].values())).view(-1)[0] = float('nan')
        torch.save(ckpt, tmp / 'ckpt.pt')
        return ['--init_from=resume', f'--out_dir={tmp}'] if resume else [f'--out_dir={tmp}', '--device=cpu']
    return make


def args(*a):
    return lambda w, tmp: list(a)


# (case, script, extra arguments (a function of the world and the case's tmp_path), exit status, words in the line)
CASES = [
    # the user errors that were handled before
    ('unknown key', train, args('--n_layrs=3'), 2, ["'n_layrs'", 'n_layer']),
    ('wrong type', train, args('--n_layer=abc'), 2, ['--n_layer expects an int']),
    ('unknown ffn', train, args('--ffn=swigloo'), 2, ["'swigloo'", *VARIANTS]),
    ('missing dataset', train, lambda w, tmp: [f'--data_dir={tmp}', '--dataset=openwebtext'], 2, ['prepare.py']),
    ('resume without checkpoint', train, lambda w, tmp: ['--init_from=resume', f'--out_dir={tmp}'], 2, ['ckpt.pt']),
    ('scratch over an existing run', train, lambda w, tmp: [f'--out_dir={w.run}'], 2, ['init_from=resume', 'overwrite']),
    # settings
    ('empty out_dir', train, args('--out_dir='), 2, ['--out_dir is empty']),
    ('out_dir is a file', train, a_file_as_out_dir, 2, ['is a file']),
    ('read-only out_dir', train, read_only_out_dir, 2, ['cannot write in']),
    ('negative learning_rate', train, args('--learning_rate=-0.01'), 2, ['--learning_rate', '>= 0']),
    ('nan learning_rate in a config file', train, config_file(b"learning_rate = float('nan')\n"), 2,
     ['--learning_rate', 'nan']),
    ('beta1 above 1', train, args('--beta1=1.5'), 2, ['--beta1', '[0, 1)']),
    ('beta2 of 1', train, args('--beta2=1'), 2, ['--beta2', '[0, 1)']),
    ('negative seed', train, args('--seed=-1'), 2, ['--seed must be between 0 and']),
    ('negative ffn_mult', train, args('--ffn_mult=-1'), 2, ['ffn_mult=-1.0 must be positive']),
    ('zero ffn_mult', train, args('--ffn_mult=0'), 2, ['ffn_mult=0.0 must be positive']),
    ('odd head size with RoPE', train, args('--n_embd=6', '--n_head=2'), 2, ['RoPE needs an even head size', '= 3']),
    # config files
    ('config file not UTF-8', train, config_file(b'n_layer = 2  # caf\xe9\n'), 2, ['not UTF-8']),
    ('config file calls sys.exit', train, config_file(b"import sys\nsys.exit('use config/owt.py on a GPU')\n"), 2,
     ['called sys.exit', 'use config/owt.py on a GPU']),
    ('config file calls sys.exit(1)', train, config_file(b"import sys\nsys.exit(1)\n"), 2, ['exit status 1']),
    # damaged meta.json
    ('meta.json not JSON', train, with_meta(b'{"vocab_size": 84,'), 2, ['meta.json is damaged', 'prepare']),
    ('meta.json random bytes', train, with_meta(bytes(np.random.default_rng(0).integers(0, 256, 64, np.uint8))), 2,
     ['meta.json is damaged']),
    ('meta.json empty', train, with_meta(b''), 2, ['meta.json is damaged']),
    ('meta.json {}', train, with_meta(b'{}'), 2, ['meta.json is damaged']),
    ('meta.json vocab_size a string', train, with_meta(b'{"vocab_size": "84", "tokenizer": "char"}'), 2,
     ['meta.json is damaged']),
    # data that does not match its tokenizer (GPT-2 ids next to the char vocabulary of 84)
    ('shard beyond the vocabulary', train, with_shard('val_000.bin', [1, 2, 50256] * 100, True), 2,
     ['val_000.bin holds token id 50256', 'vocabulary of 84']),
    ('foreign shard beyond the vocabulary', train, with_shard('train_000.bin', [1, 2, 50256] * 100, False), 2,
     ['train_000.bin holds token id 50256']),
    # checkpoints
    ('resume from a torch file that is not a checkpoint', train, foreign_checkpoint, 2, ['ckpt.pt']),
    ('sample a nanoGPT checkpoint', sample, nanogpt_checkpoint, 2, ['ckpt.pt']),
    ('sample without checkpoint', sample, lambda w, tmp: [f'--out_dir={tmp}'], 2,
     ['ckpt.pt', 'train', "a comparison's runs are its OUT/[SIZE/]VARIANT/[lrRATE/]seedN, SIZE a ladder's"]),
    ('resume from a non-finite checkpoint', train, nonfinite_checkpoint(True), 2, ['non-finite weights']),
    ('sample a non-finite checkpoint', sample, nonfinite_checkpoint(False), 2, ['non-finite weights']),
    # a run that must stop
    ('diverging run', train, lambda w, tmp: DIVERGING + [f'--out_dir={tmp / "run"}'], 3,
     ['weights became non-finite', 'last good checkpoint', 'set grad_clip', 'then resume or start again']),
    # a gradient norm past float32 (the aux loss's 1e20): clipping by it scales every gradient to 0, a silent no-op
    ('gradient norm overflows', train, args('--n_expert=2', '--top_k=1', '--aux_loss_weight=1e20', '--max_iters=4',
                                            '--eval_interval=4'), 3,
     ['gradient norm, by which clipping scales the update, became non-finite (inf) at iteration 1, so the run',
      'no checkpoint had been written yet; lower learning_rate, or use another dtype, then start again.']),
]


@pytest.mark.parametrize('case,script,extra,code,words', CASES, ids=[c[0] for c in CASES])
def test_hostile_input(case, script, extra, code, words, world, tmp_path, capsys):
    base = [] if script is sample else TINY + [f'--data_dir={world.data}', f'--out_dir={tmp_path / "out"}',
                                                '--max_iters=2']
    argv = base + extra(world, tmp_path)
    before = files(world.root, tmp_path)
    got, err = call(script.main, argv, capsys)
    lines = message_lines(err)
    assert got == code, err
    assert 'Traceback' not in err
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], (w, lines[0])
    after = files(world.root, tmp_path)
    assert {p: after.get(p) for p in before} == before  # every file that was there is untouched


# ----------------------------------------------------------------------------------------------------------------------
# what is left after the cases above


def test_a_compile_cache_inductor_cannot_write_is_one_sentence(world, tmp_path, capsys, monkeypatch):
    """$XDG_CACHE_HOME (or $TORCHINDUCTOR_CACHE_DIR) on a file: Inductor's own failure to make its folder was a
    traceback; it is said before the run directory is opened."""
    from machinery import speed
    (tmp_path / 'afile').write_text('')
    monkeypatch.setattr(speed, 'USER_CACHE_DIR', None)
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'afile'))
    code, err = call(train.main, TINY + [f'--data_dir={world.data}', f'--out_dir={tmp_path / "out"}', '--max_iters=2',
                                         '--compile=True'], capsys)
    lines = message_lines(err)
    assert code == 2 and len(lines) == 1 and 'Traceback' not in err, err
    assert f"cannot create the folder {tmp_path / 'afile'}" in lines[0] and '--compile=False' in lines[0]
    assert not (tmp_path / 'out').exists()


def test_divergence_leaves_a_finite_checkpoint_that_loads_and_resumes(world, tmp_path, capsys):
    """With learning_rate=100 PolyReLU's weights overflow: the run stops before a checkpoint holds them. The last
    checkpoint is finite, samples, and resumes exactly (the same step diverges again, and it is kept again)."""
    from machinery.checkpoint import load_checkpoint
    out = tmp_path / 'run'
    code, err = call(train.main, TINY + DIVERGING + [f'--data_dir={world.data}', f'--out_dir={out}'], capsys)
    assert code == 3, err
    stopped_at = int(message_lines(err)[0].split('at iteration ')[1].split()[0])
    ckpt = load_checkpoint(str(out), '')
    assert ckpt['iter_num'] == stopped_at - 1  # eval_interval=1: the iteration before the broken update
    assert np.isfinite(ckpt['val_loss']) and all(v.isfinite().all() for v in ckpt['model'].values())
    run_cli(sample.main, [f'--out_dir={out}', '--device=cpu', '--num_samples=1', '--max_new_tokens=5'])
    capsys.readouterr()
    saved = (out / 'ckpt.pt').read_bytes()
    code, err = call(train.main, [f'--out_dir={out}', '--init_from=resume'], capsys)
    assert code == 3 and f'at iteration {stopped_at} ' in message_lines(err)[0], err
    assert (out / 'ckpt.pt').read_bytes() == saved


def test_sample_never_emits_ids_outside_the_tokenizer(world, tmp_path, capsys):
    """A model trained with --vocab_size=256 over the 84-character vocabulary: after 2 iterations the 172 extra ids are
    nearly as likely as real ones, yet 300 sampled tokens all decode."""
    out = tmp_path / 'run'
    run_cli(train.main, TINY + [f'--data_dir={world.data}', f'--out_dir={out}', '--max_iters=2', '--vocab_size=256'])
    capsys.readouterr()
    run_cli(sample.main, [f'--out_dir={out}', '--device=cpu', '--num_samples=1', '--max_new_tokens=300',
                          '--temperature=1.0', '--top_k=0'])
    text = capsys.readouterr().out.split(sample.SEPARATOR)[0]
    assert len(text) == 1 + 300 + 1  # the prompt, 300 characters, the newline print adds


def test_resume_keeps_intact_log_lines_around_a_damaged_one(world, tmp_path, capsys):
    out = tmp_path / 'run'
    common = TINY + [f'--data_dir={world.data}', f'--out_dir={out}', '--eval_interval=10', '--log_interval=5']
    run_cli(train.main, common + ['--max_iters=20'])
    lines = (out / 'log.jsonl').read_text().splitlines(keepends=True)
    assert [json.loads(l)['iter'] for l in lines] == [0, 5, 10, 15, 20]
    lines[2] = lines[2][:40] + '\n'  # iteration 10 torn in the middle of the file
    (out / 'log.jsonl').write_text(''.join(lines))
    capsys.readouterr()
    run_cli(train.main, [f'--out_dir={out}', '--init_from=resume', '--max_iters=30'])
    err = capsys.readouterr().err
    iters = [json.loads(l)['iter'] for l in (out / 'log.jsonl').read_text().splitlines()]
    assert iters == [0, 5, 15, 20, 25, 30]
    assert (out / 'log.jsonl.damaged').read_text() == lines[2]
    assert 'warning: 1 damaged line' in err and 'log.jsonl.damaged' in err


@pytest.mark.slow
def test_a_run_directory_has_one_owner(world, tmp_path, capsys):
    """A second train.py on a folder in use is refused naming the first's PID; after kill -9 of the first, the folder is
    taken over by a resume with no manual cleanup."""
    out = tmp_path / 'run'
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    first = subprocess.Popen([sys.executable, 'train.py', *TINY, f'--data_dir={world.data}', f'--out_dir={out}',
                              '--max_iters=1000000', '--eval_interval=2'], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (out / 'ckpt.pt').exists():
            assert first.poll() is None and time.time() < deadline, 'the first run did not start'
            time.sleep(0.2)
        for extra in (['--init_from=resume'], TINY + [f'--data_dir={world.data}', '--overwrite=True']):
            code, err = call(train.main, [f'--out_dir={out}'] + extra, capsys)
            assert code == 2 and len(message_lines(err)) == 1 and f'PID {first.pid}' in err, err
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    it = torch.load(out / 'ckpt.pt', weights_only=True)['iter_num']
    run_cli(train.main, [f'--out_dir={out}', '--init_from=resume', f'--max_iters={it + 2}'])
    assert torch.load(out / 'ckpt.pt', weights_only=True)['iter_num'] == it + 2


def test_a_lock_compare_holds_for_its_torchrun_processes_is_theirs_alone(tmp_path):
    """torchrun passes no descriptor on, so compare.py keeps a DDP run's lock and names its file to the run."""
    from machinery import lock as run_lock
    lock, _ = run_lock.try_lock_run_dir(str(tmp_path / 'run'))
    other, _ = run_lock.try_lock_run_dir(str(tmp_path / 'other'))
    code = 'import sys; from machinery import lock; print(lock.try_lock_run_dir(sys.argv[1])[1])'
    for held, owner in (('run', 'None'), ('other', f'PID {os.getpid()}'), (None, f'PID {os.getpid()}')):
        env = {**os.environ, run_lock.LOCK_FD_ENV: run_lock.HELD + str(tmp_path / held / '.lock') if held else ''}
        p = subprocess.run([sys.executable, '-c', code, str(tmp_path / 'run')], cwd=ROOT, env=env, capture_output=True,
                           text=True)
        assert p.stdout.startswith(owner), (held, p.stdout, p.stderr)
    lock.close()
    other.close()


@pytest.mark.slow
@pytest.mark.parametrize('nproc', [1, 2])
def test_two_compares_on_one_out_dir_train_each_run_once(world, tmp_path, nproc):
    """Started together, two compare.py share the runs through their directories' locks: each run is trained by one
    of them (its train.out holds one train.py command), and both finish with the full summary; also when each run is
    2 DDP processes under torchrun."""
    cmd = [sys.executable, 'compare.py', '--variants=gelu', '--seeds=1', '--lrs=', '--max_iters=2', '--eval_interval=2',
           *TINY, f'--data_dir={world.data}', f'--out_dir={tmp_path}', f'--nproc_per_run={nproc}']
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    for variant in ('gelu',):
        commands = [l for l in (tmp_path / variant / 'seed1337' / 'train.out').read_text().splitlines()
                    if l.startswith('$ ')]
        assert len(commands) == 1, (variant, outputs)


@pytest.mark.slow
def test_two_compares_of_other_settings_never_retrain_each_others_runs(world, tmp_path):
    """Started together on one out_dir, a comparison of 30 iterations and one of 20, neither with --overwrite: each
    takes a run, and finds the other's finished with other settings once it holds that run's lock. It refuses it in
    the sentence it would have said up front (exit status 2) instead of training it again, so each run is trained
    once, by one of them, and stays whole."""
    cmd = lambda iters: [sys.executable, 'compare.py', '--variants=gelu,relu', '--seeds=1', '--lrs=', '--jobs=1',
                         f'--max_iters={iters}', *TINY, f'--data_dir={world.data}', f'--out_dir={tmp_path}']
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    procs = [subprocess.Popen(cmd(n), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for n in (30, 20)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert 2 in [p.returncode for p in procs], errs
    for p, err in zip(procs, errs):
        lines = message_lines(err)
        assert p.returncode in (0, 2) and 'Traceback' not in err, err
        if p.returncode == 2:
            assert [l for l in lines if l.startswith('error:')] == lines[-1:], err
            assert 'was trained with other settings: max_iters=' in lines[-1] and '--overwrite=True' in lines[-1]
    for variant in ('gelu', 'relu'):
        d = tmp_path / variant / 'seed1337'
        commands = [l for l in (d / 'train.out').read_text().splitlines() if l.startswith('$ ')]
        assert len(commands) == 1 and '--overwrite=False' in commands[0], (variant, errs)
        iters = json.loads((d / 'compare.json').read_text())['settings']['max_iters']
        ckpt = torch.load(d / 'ckpt.pt', weights_only=True)
        last = json.loads((d / 'log.jsonl').read_text().splitlines()[-1])
        assert ckpt['config']['max_iters'] == ckpt['iter_num'] == last['iter'] == iters


def start_a_long_comparison(world, out, nproc):
    """compare.py training one long run of nproc processes, once the run has logged; (compare.py, the run's dir)."""
    cmd = [sys.executable, 'compare.py', '--variants=gelu', '--seeds=1', '--lrs=', '--max_iters=100000', *TINY,
           f'--data_dir={world.data}', f'--out_dir={out}', f'--nproc_per_run={nproc}']
    p = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, 'OMP_NUM_THREADS': '1'}, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    log = out / 'gelu' / 'seed1337' / 'log.jsonl'
    while not (log.exists() and log.stat().st_size > 0):
        assert p.poll() is None
        time.sleep(0.2)
    return p, str(log.parent)


def processes_of(run_dir):
    p = subprocess.run(['pgrep', '-f', '--', f'--out_dir={run_dir} '], capture_output=True, text=True)
    assert p.returncode in (0, 1), p.stderr  # 1: none
    return p.stdout.split()


@pytest.mark.slow
@pytest.mark.parametrize('nproc', [1, 2])
def test_a_terminated_compare_stops_its_runs(world, tmp_path, nproc):
    """SIGTERM (kill, timeout) ends compare.py as Ctrl-C does: its train.py (every torchrun worker) is stopped too
    and the directory freed."""
    from machinery import lock as run_lock
    p, run_dir = start_a_long_comparison(world, tmp_path, nproc)
    p.terminate()
    assert p.wait(timeout=120) == 143
    assert processes_of(run_dir) == []
    lock, owner = run_lock.try_lock_run_dir(run_dir)
    assert owner is None
    lock.close()


@pytest.mark.slow
def test_a_ddp_run_keeps_its_directory_locked_while_it_trains(world, tmp_path):
    """compare.py killed outright: its torchrun run trains on, and its directory stays locked until that ends."""
    from machinery import lock as run_lock
    p, run_dir = start_a_long_comparison(world, tmp_path, 2)
    p.kill()
    p.wait()
    try:
        assert run_lock.try_lock_run_dir(run_dir)[1] is not None
    finally:
        for pid in processes_of(run_dir):
            subprocess.run(['kill', '-9', pid])


def test_shards_record_their_largest_token_id_and_foreign_shards_still_load(tmp_path):
    """Our shards carry 1 + the largest id in header[3]; a shard with zeros there (modded-nanogpt's FineWeb) loads and
    is checked when first read."""
    write_shard(str(tmp_path / 'a.bin'), [3, 7, 2])
    assert shard_info(str(tmp_path / 'a.bin')) == (3, 8)
    d = tmp_path / 'ds'
    d.mkdir()
    (d / 'meta.json').write_text('{"vocab_size": 10, "tokenizer": "char", "itos": "abcdefghij"}')
    for name in ('train_000.bin', 'val_000.bin'):
        write_shard(str(d / name), np.arange(100) % 10)
        with open(d / name, 'r+b') as f:
            f.seek(12)
            f.write(b'\0\0\0\0')
        assert shard_info(str(d / name)) == (100, 0)
    loader = DataLoader('ds', block_size=8, batch_size=2, seed=0, data_dir=str(tmp_path))
    x, _ = loader.next_batch()
    assert int(x.max()) < 10 and not loader.train.unchecked
    assert os.path.getsize(d / 'train_000.bin') == HEADER_BYTES + 200
