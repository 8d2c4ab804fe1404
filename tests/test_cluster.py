"""Tests of running comparisons where users run them: runs placed on the visible GPUs (faked: this machine has none),
`compare.py --plan` run by another scheduler (xargs -P here) and `--report` on the result, and progress output that
keeps stdout for results and log files free of redrawn bars. Tiny models on the CPU: 2 variants x 2 seeds x 4
iterations, trained twice (by compare.py itself and from the plan)."""
import collections
import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
import types

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import compare  # noqa: E402
from configurator import DEFAULTS, TYPES  # noqa: E402
from machinery import progress  # noqa: E402
from comparison import runs  # noqa: E402
from comparison import placement
from machinery.cli import UserError, run_cli  # noqa: E402
from machinery.files import read_json  # noqa: E402
from comparison.runs import INTENT

TINY = ['--seed=1337', '--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=4', '--max_iters=4',
        '--lr_decay_iters=4', '--warmup_iters=1', '--eval_interval=2', '--eval_iters=2', '--log_interval=1',
        '--device=cpu', '--compile=False', '--dtype=float32', '--variants=gelu,moa', '--seeds=2', '--threads=1',
        '--lrs=']
# the README's one-liner: each line of the plan is one `sh -c` command, two at a time
XARGS = "xargs -d '\\n' -n 1 -P 2 sh -c < plan.txt"


def compare_cmd(data_dir, out_dir, *extra):
    return [sys.executable, os.path.join(REPO, 'compare.py'), f'--data_dir={data_dir}', f'--out_dir={out_dir}',
            *TINY, *extra]


def env():
    return {**os.environ, 'OMP_NUM_THREADS': '1'}


def check(p):
    assert p.returncode == 0, (p.stdout if isinstance(p.stdout, str) else '')[-2000:] + p.stderr[-3000:]
    return p


# ----------------------------------------------------------------------------------------------------------------------
# all GPUs of a node: placement (on fake GPUs, tests/fake_gpu.py)

SMALL, LARGE = (1e6, 2**20), (1e13, 2**34)  # (FLOPs per step, bytes): a tiny char model, and one the size of GPT-2's


@pytest.fixture
def sixteen_cores(monkeypatch):
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(16)), raising=False)


@pytest.fixture
def four_gpus(fake_gpu, monkeypatch, sixteen_cores):
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '4,5,6,7')  # not 0..3: a child must be given the parent's names
    fake_gpu(n=4)
    return ['4', '5', '6', '7']


def test_eight_runs_on_four_gpus_are_two_per_gpu(four_gpus):
    gpus, jobs, _, _ = placement.resolve_jobs(dict(compare.DEFAULTS, device='auto', jobs=8), 8, *LARGE)
    assert gpus == four_gpus and jobs == 8
    envs = [placement.gpu_env(gpus_of_slot) for gpus_of_slot in placement.slots(jobs, gpus, 1)]
    assert all(e['CUDA_VISIBLE_DEVICES'] in four_gpus for e in envs)  # exactly one GPU each
    assert collections.Counter(e['CUDA_VISIBLE_DEVICES'] for e in envs) == {g: 2 for g in four_gpus}
    # by default a large model gets one GPU per run; DDP runs get GPUs of their own, in groups
    assert placement.resolve_jobs(dict(compare.DEFAULTS, device='cuda', jobs=0), 99, *LARGE)[:2] == (four_gpus, 4)
    assert placement.resolve_jobs(dict(compare.DEFAULTS, device='auto', jobs=0, nproc_per_run=2), 99, *LARGE)[:2] == (
        four_gpus, 2)
    assert placement.slots(4, four_gpus, 2) == [['4', '5'], ['6', '7'], ['4', '5'], ['6', '7']]
    assert placement.gpu_env(['6', '7'])['CUDA_VISIBLE_DEVICES'] == '6,7'
    assert placement.resolve_jobs(dict(compare.DEFAULTS, device='cpu', jobs=0), 99, *LARGE)[:2] == ([], 1)
    # on a CPU with one thread per run: one run per core (each core one single-threaded run)
    assert placement.resolve_jobs(dict(compare.DEFAULTS, device='cpu', jobs=0, threads=1), 99, *LARGE)[:2] == ([], 16)
    assert placement.gpu_env(None) == {}
    with pytest.raises(UserError, match='nproc_per_run=8'):
        placement.resolve_jobs(dict(compare.DEFAULTS, device='auto', nproc_per_run=8), 99, *LARGE)


@pytest.mark.parametrize('n_gpus', [1, 2, 8])
def test_tiny_runs_share_a_gpu_and_large_ones_have_one_each(fake_gpu, sixteen_cores, n_gpus):
    """A tiny model leaves a GPU idle: up to MAX_SHARE of its runs share one, one CPU core each, as long as their
    memory estimates fit; a large model's runs take a GPU each; --device=cuda:N puts them all on GPU N."""
    fake_gpu(n=n_gpus, total_gib=80)
    names = [str(i) for i in range(n_gpus)]
    cfg = dict(compare.DEFAULTS, device='auto', jobs=0)
    per_gpu = min(placement.MAX_SHARE, 16 // n_gpus)
    gpus, jobs, _, why = placement.resolve_jobs(cfg, 99, *SMALL)
    assert (gpus, jobs) == (names, per_gpu * n_gpus) and f'up to {per_gpu} per GPU' in why and '--jobs' in why
    slots = placement.slots(jobs, gpus, 1)
    assert collections.Counter(placement.gpu_env(g)['CUDA_VISIBLE_DEVICES'] for g in slots) == {g: per_gpu for g in names}
    assert placement.resolve_jobs(cfg, 99, *LARGE)[:2] == (names, n_gpus)
    assert placement.resolve_jobs(cfg, 99, SMALL[0], 60 * 2**30)[:2] == (names, n_gpus)  # two would not fit in 80 GiB
    # one GPU named: no placement (each run's own set-up picks the GPU), the same rule for how many at a time
    gpus, jobs, _, why = placement.resolve_jobs({**cfg, 'device': f'cuda:{n_gpus - 1}'}, 99, *SMALL)
    assert (gpus, jobs) == ([], min(placement.MAX_SHARE, 16)) and f'GPU {n_gpus - 1}' in why
    assert placement.slots(jobs, gpus, 1) == [None] * jobs


def test_cpu_runs_at_a_time_count_the_cores_this_process_may_use(monkeypatch):
    """Under a cpuset (Slurm, taskset) of 4 of the machine's cores: 4 one-thread runs, 2 of 2 processes each."""
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, 'cpu_count', lambda: 64)
    cfg = dict(compare.DEFAULTS, device='cpu', jobs=0, threads=1)
    assert placement.resolve_jobs(cfg, 99, *SMALL)[:2] == ([], 4)
    assert placement.resolve_jobs({**cfg, 'nproc_per_run': 2}, 99, *SMALL)[:2] == ([], 2)


class FakeProcess:
    """Stands in for a train.py subprocess: keeps the GPU its environment names, exits after a few polls."""

    def __init__(self, env, live):
        self.gpu, self.returncode, self.live = env['CUDA_VISIBLE_DEVICES'], None, live
        self.polls = 2 + len(live) % 3  # runs end at different times, so GPUs free up in a mixed order
        live.append(self)
        self.load = sum(p.gpu == self.gpu for p in live)  # runs on its GPU while it starts, itself included

    def poll(self):
        self.polls -= 1
        if self.polls <= 0 and self.returncode is None:
            self.returncode = 0
            self.live.remove(self)
        return self.returncode


def test_train_all_keeps_two_runs_per_gpu(four_gpus, tmp_path, monkeypatch):
    """12 runs, 8 at a time on 4 GPUs: a finished run's GPU goes to the next run, never a third run on one GPU."""
    started, live = [], []

    def popen(cmd, env, **kw):
        started.append(FakeProcess(env, live))
        return started[-1]

    monkeypatch.setattr(compare.subprocess, 'Popen', popen)
    monkeypatch.setattr(compare.time, 'sleep', lambda s: None)
    planned = [runs.make_run(dict(compare.DEFAULTS, out_dir=str(tmp_path)), 'gelu', s) for s in range(12)]
    compare.train_all([runs.scan(r) for r in planned], placement.slots(8, four_gpus, 1), 0, False,
                      progress.progress_bar(12, 'runs'))
    records = [read_json(os.path.join(r['dir'], INTENT)) for r in planned]
    assert len(started) == 12 and all(rec['at_once'] == 8 for rec in records)
    assert max(p.load for p in started) == 2
    assert collections.Counter(p.gpu for p in started[:8]) == {g: 2 for g in four_gpus}
    # one run left to train has 8 slots to itself: it trains alone, and its record says so (its tok/s depend on it)
    compare.train_all([runs.scan(runs.make_run(dict(compare.DEFAULTS, out_dir=str(tmp_path / 'one')), 'gelu', 0))],
                      placement.slots(8, four_gpus, 1), 0, False, progress.progress_bar(1, 'runs'))
    assert read_json(os.path.join(tmp_path, 'one', 'gelu', 'seed0', INTENT))['at_once'] == 1


# ----------------------------------------------------------------------------------------------------------------------
# any scheduler: --plan, run the lines elsewhere (xargs -P), --report; the same summary as compare.py running them


def run_main(argv):
    """compare.main in this process: (stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        compare.main(argv)
    return out.getvalue(), err.getvalue()


@pytest.fixture(scope='module')
def planned(shakespeare_char_dir, tmp_path_factory):
    """The same tiny comparison twice: `python compare.py > out.txt` (it trains the runs itself), and --plan, the plan
    run by xargs -P 2 from another directory, then --report."""
    root = tmp_path_factory.mktemp('cluster')
    local, elsewhere = str(root / 'local'), str(root / 'elsewhere')
    with open(root / 'out.txt', 'w') as out:
        p = check(subprocess.run(compare_cmd(shakespeare_char_dir, local), stdout=out, stderr=subprocess.PIPE,
                                 text=True, env=env(), cwd=REPO))
    plan = run_main(compare_cmd(shakespeare_char_dir, elsewhere, '--plan')[2:])  # a bool key alone: True
    (root / 'plan.txt').write_text(plan[0])
    ran = check(subprocess.run(XARGS, shell=True, capture_output=True, text=True, env=env(), cwd=root))
    report = run_main(compare_cmd(shakespeare_char_dir, elsewhere, '--report')[2:])
    return dict(root=root, data=shakespeare_char_dir, local=local, elsewhere=elsewhere, local_err=p.stderr,
                out=(root / 'out.txt').read_text(), plan=plan, ran=ran, report=report)


@pytest.mark.slow
def test_plan_lists_every_run_with_every_setting(planned):
    lines = planned['plan'][0].splitlines()
    assert len(lines) == 4  # 2 variants x 2 seeds, nothing else on stdout
    # seed by seed (the runs side by side are different variants: each variant compiles once)
    dirs = [os.path.join(planned['elsewhere'], v, f'seed{s}') for s in (1337, 1338) for v in ('gelu', 'moa')]
    for line, d in zip(lines, dirs):
        assert line.startswith(f'OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1 {sys.executable} '
                               f'{runs.TRAIN_PY} --')
        assert f'--out_dir={d} ' in line and os.path.isabs(d)
        assert all(f' --{k}=' in line for k in DEFAULTS)  # every setting explicit
        assert '--init_from=scratch' in line and '--overwrite=False' in line
    assert '4 of 4 runs to do' in planned['plan'][1]


def strip_paths_and_times(summary):
    """A summary without what depends on where the runs are and how fast the machine was at the time."""
    summary.pop('at_once')  # how many ran side by side: what compare.py recorded (xargs records nothing)
    for s in summary['variants'].values():
        s.pop('tok_s'), s.pop('train_time_s')
        if s['matched']:  # the time-matched part of the verdicts
            s['matched'].pop('seconds_ratio'), s['matched'].pop('loss_at_base_time')
        for r in s['runs']:
            r.pop('dir'), r.pop('tok_s'), r.pop('train_time_s')
    for a in summary['acts'].values():
        a.pop('run')
    return summary


@pytest.mark.slow
def test_report_of_planned_runs_equals_compare_running_them(planned):
    a, b = (json.load(open(os.path.join(d, 'summary.json'))) for d in (planned['local'], planned['elsewhere']))
    assert a['variants']['moa']['diff_to_baseline']['std'] is not None  # two seeds: the statistics are there
    assert strip_paths_and_times(b) == strip_paths_and_times(a)
    assert '(4 to reuse, 0 to train)' in planned['report'][1]
    # compare.py only planned them: their records hold the settings, not how many trained at once (their checkpoints
    # say what they are)
    records = [os.path.join(d, 'compare.json') for d, _, files in os.walk(planned['elsewhere']) if 'ckpt.pt' in files]
    assert len(records) == 4 and all(set(json.load(open(r))) == {'settings', 'processes'} for r in records)
    assert '| moa |' in planned['report'][0]
    # nothing is left to do: planning again lists nothing
    again = run_main(compare_cmd(planned['data'], planned['elsewhere'], '--plan=True')[2:])
    assert again[0] == '' and '0 of 4 runs to do' in again[1]


# README's loop: --plan, the plan run by xargs, until --plan prints nothing; then --report
LOOP = f"while {{plan}} > plan.txt 2>> plan.err && [ -s plan.txt ]; do {XARGS}; done"


@pytest.mark.slow
def test_a_sweep_planned_round_by_round_reports_what_compare_trains(shakespeare_char_dir, tmp_path):
    """A sweep of two rates with --lr_extend: the best rate is at an edge, so its runs come in at least three rounds
    (the sweep's, a step beyond the edge, the verdict's fresh seed). README's loop takes it round by round to the
    summary compare.py writes training the runs itself, in no more rounds than the first --plan said to expect."""
    sweep = ['--variants=gelu', '--seeds=1', '--lrs=1e-3,2e-3', '--learning_rate=2e-3', '--lr_extend=True']
    local, elsewhere = str(tmp_path / 'local'), str(tmp_path / 'elsewhere')
    check(subprocess.run(compare_cmd(shakespeare_char_dir, local, *sweep), capture_output=True, text=True, env=env(),
                         cwd=REPO))
    plan = shlex.join(compare_cmd(shakespeare_char_dir, elsewhere, *sweep, '--plan'))
    check(subprocess.run(LOOP.format(plan=plan), shell=True, capture_output=True, text=True, env=env(), cwd=tmp_path))
    said = [l for l in (tmp_path / 'plan.err').read_text().splitlines() if l.startswith('compare: ')]
    rounds = [l for l in said if 'runs to do;' in l]
    assert 3 <= len(rounds) <= 8 and all('at most 8 rounds' in l for l in rounds), said
    assert said[-1].startswith('compare: 0 of ') and said[-1].endswith('all finished: --report instead of --plan '
                                                                        'builds the summary')
    table = run_main(compare_cmd(shakespeare_char_dir, elsewhere, *sweep, '--report')[2:])[0]
    a, b = (json.load(open(os.path.join(d, 'summary.json'))) for d in (local, elsewhere))
    assert len(a['lr']['gelu']['rates']) >= 3 and a['seeds'] == [1338]  # a rate beyond the edge; the fresh seed
    assert strip_paths_and_times(b) == strip_paths_and_times(a) and '| gelu |' in table


@pytest.mark.slow
@pytest.mark.parametrize('extra, words', [
    (['--learning_rate=0.01'], 'learning_rate=0.002 (now 0.01)'),  # read from the checkpoints' config
    (['--nproc_per_run=2'], 'processes=1 (now 2)'),  # the checkpoints' world size
])
def test_runs_done_elsewhere_are_checked_like_local_ones(planned, extra, words, capsys):
    argv = compare_cmd(planned['data'], planned['elsewhere'], '--report=True', *extra)[2:]
    with pytest.raises(SystemExit) as e:
        run_cli(compare.main, argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and words in err and len(err.strip().splitlines()) == 1


def test_a_bool_key_alone_switches_it_on():
    cfg, given = compare.parse_args(compare.DEFAULTS, ['--plan'], types=TYPES)
    assert cfg['plan'] is True and cfg['report'] is False and given == {'plan': '--'}
    with pytest.raises(UserError, match=r'--key=value \(e.g. --n_layer=VALUE\)'):  # any other key needs its value
        compare.parse_args(compare.DEFAULTS, ['--n_layer'], types=TYPES)


@pytest.mark.slow
def test_report_refuses_unfinished_runs(planned, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        run_cli(compare.main, compare_cmd(planned['data'], str(tmp_path / 'none'), '--report=True')[2:])
    err = capsys.readouterr().err
    assert e.value.code == 2 and '4 of 4 runs are not finished' in err and '--plan' in err
    assert not os.path.exists(tmp_path / 'none')


@pytest.mark.slow
def test_plan_of_ddp_runs_launches_torchrun(planned, tmp_path):
    """--nproc_per_run=2: each run is a torchrun of 2 processes (the DDP run itself is tested in test_train.py)."""
    lines = run_main(compare_cmd(planned['data'], str(tmp_path / 'ddp'), '--plan=True', '--nproc_per_run=2')[2:])[0]
    lines = lines.splitlines()
    assert len(lines) == 4 and all(f'{sys.executable} -m torch.distributed.run --standalone --nproc_per_node=2 '
                                   f'{runs.TRAIN_PY} ' in line for line in lines)


# ----------------------------------------------------------------------------------------------------------------------
# output that behaves in logs


@pytest.mark.slow
def test_stdout_holds_only_results(planned):
    """`python compare.py > out.txt`: the table in out.txt; progress, as plain lines, on stderr."""
    out, err = planned['out'], planned['local_err']
    assert out.strip().startswith('| variant |') and '| gelu |' in out and '| moa |' in out
    assert '\r' not in out and 'runs' not in out and '%' not in out and 'compare:' not in out
    assert '\r' not in err and 'runs: 100% 4/4' in err and '(0 to reuse, 4 to train, 2 at a time)' in err
    for v in ('gelu', 'moa'):  # train.py's output in a file (its train.out): plain progress lines, no redraws
        text = open(os.path.join(planned['local'], v, 'seed1337', 'train.out')).read()
        assert '\r' not in text and 'train: 100% 4/4' in text and 'iter 4: train loss' in text
    assert '\r' not in planned['ran'].stderr and 'train: 100% 4/4' in planned['ran'].stderr


def test_plain_progress_lines_are_occasional(monkeypatch, capsys):
    import tqdm.std
    monkeypatch.setattr(tqdm.std, 'time', lambda: now)  # tqdm's clock, and the plain lines'
    monkeypatch.setattr(progress, 'time', types.SimpleNamespace(time=lambda: now))
    now = 0.0
    bar = progress.progress_bar(10, 'train')  # stderr is not a terminal here
    for i in range(10):
        now = 10.0 * (i + 1)  # 10 s per step: a line once PLAIN_EVERY = 30 s have passed since the last one
        bar.update()
        bar.set_postfix(loss=f'{10 - i}')  # as train.py: a redraw, a line only every 30 s
    now += 40.0  # the last evaluation and checkpoint, before the bar closes: one closing line all the same
    bar.close()
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == '' and '\r' not in err
    assert [line.split(' [')[0] for line in lines] == ['train:  30% 3/10', 'train:  60% 6/10', 'train:  90% 9/10',
                                                       'train: 100% 10/10']
    assert lines[-1].endswith('loss=1]')
    ended = progress.progress_bar(3, 'runs')
    for i in range(3):
        now += 30.0  # each update a line, the last at 3/3: the close adds none
        ended.update()
    ended.close()
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(' [')[0] for line in lines] == ['runs:  33% 1/3', 'runs:  67% 2/3', 'runs: 100% 3/3']
    stopped = progress.progress_bar(10, 'train')
    stopped.update()
    now += 40.0  # a long evaluation that fails
    stopped.leave = False  # what train.py sets when the run stops: its one-sentence error is all stderr says after
    stopped.close()
    assert capsys.readouterr().err == ''


@pytest.mark.slow
def test_bar_on_a_terminal_redraws_on_stderr_only(shakespeare_char_dir, tmp_path):
    """train.py with stderr on a terminal (a pty): the bar is redrawn there; stdout (a file) gets no bar text."""
    import fcntl, struct, termios  # POSIX only
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack('HHHH', 24, 100, 0, 0))  # a 100-column terminal
    cmd = [sys.executable, os.path.join(REPO, 'train.py'), f'--data_dir={shakespeare_char_dir}',
           f'--out_dir={tmp_path}', *[a for a in TINY if not a.startswith(('--variants', '--seeds', '--threads', '--lrs'))]]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, text=True, env=env())
    os.close(slave)
    tty = b''
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        tty += chunk
    os.close(master)
    out = p.communicate()[0]
    assert p.returncode == 0, tty.decode(errors='replace')
    assert b'\r' in tty and b'4/4' in tty
    assert '\r' not in out and '4/4' not in out and 'iter 4: train loss' in out and 'done: 4 iterations' in out
