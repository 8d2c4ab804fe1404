"""Every write fails safe and every command refuses before it destroys: a full disk, a read-only folder, a Ctrl-C or a
failed write inside torch.save end in the one documented sentence (exit status 3, 130 for Ctrl-C, 2 for what can be
checked up front), with everything written before intact and no temporary file left; records that are valid JSON but
not what train.py writes are set aside; a run interrupted before its first checkpoint simply starts again.

A full disk is a small tmpfs where this test may mount one (as root), else a patched writer that fails every write as
a full disk does (ENOSPC)."""
import contextlib
import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_hostile import TINY, call, files, message_lines  # noqa: E402
import compare  # noqa: E402
import inspect_run  # noqa: E402
import train  # noqa: E402
from comparison import runs  # noqa: E402
from machinery import files as file_safety, run_log  # noqa: E402
from machinery.cli import Terminated, run_cli  # noqa: E402
from comparison.runs import to_argv  # noqa: E402


def grid_specs(cfg):
    """The specs of every run of a comparison's grid, as compare.py plans them."""
    return [r.spec for r in compare.grid_runs(cfg, compare.check_comparison(cfg))]


def scan_state(spec):
    return runs.scan(spec).state


@contextlib.contextmanager
def small_disk(path, size):
    """A tmpfs of `size` mounted at path; None where this process may not mount one."""
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(path)],
                                           capture_output=True).returncode != 0:
        yield None
        return
    try:
        yield path
    finally:
        subprocess.run(['umount', '-l', str(path)], capture_output=True)


def fail_writes(monkeypatch, match='', skip=0):
    """A full disk, patched in: every file files.py writes whose path contains `match` fails at its first write, once
    `skip` of them have been written."""
    real_open, seen = open, []

    class Full:
        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def patched(path, mode='r', *a, **kw):
        f = real_open(path, mode, *a, **kw)
        if not any(c in mode for c in 'wa') or match not in str(path):
            return f
        seen.append(path)
        if len(seen) <= skip:
            return f
        full = Full()
        full.f = f
        return full

    monkeypatch.setattr(file_safety, 'open', patched, raising=False)


def tmp_files(folder):
    return [os.path.join(b, n) for b, _, names in os.walk(folder) for n in names if '.tmp' in n]


def assert_one_sentence(code, err, status, *words):
    """Exit status, no traceback, and one sentence that says why, the last thing on stderr (after any progress)."""
    lines = message_lines(err)
    said = [l for l in lines if l.startswith(('error:', 'stopped:', 'interrupted.'))]
    assert code == status and 'Traceback' not in err and len(said) == 1 and said[0] == lines[-1], err
    assert all(w in said[0] for w in words), said[0]


def run_args(data, out, *extra):
    return TINY + [f'--data_dir={data}', f'--out_dir={out}', '--eval_interval=2', '--log_interval=1', *extra]


def same_log_and_weights(a, b):
    la, lb = (run_log.read_log_lines(os.path.join(d, 'log.jsonl'))[0] for d in (a, b))
    assert [(r['iter'], r.get('loss'), r.get('val_loss')) for r in la] == [(r['iter'], r.get('loss'), r.get('val_loss'))
                                                                           for r in lb]
    wa, wb = (torch.load(os.path.join(d, 'ckpt.pt'), weights_only=True)['model'] for d in (a, b))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_temporary_files_of_dead_processes_go_and_a_live_ones_stays(tmp_path):
    """What a killed write left (.NAME.tmpPID of no live process, a PID past any too) goes; a running write stays."""
    names = ['.ckpt.pt.tmp' + str(os.getpid()), '.log.tmp99999999999999999999', '.ckpt.pt.tmp1x', 'kept.txt']
    finished = subprocess.Popen([sys.executable, '-c', ''])
    finished.wait()  # reaped: no process has its pid now
    names.append(f'.summary.md.tmp{finished.pid}')
    for n in names:
        (tmp_path / n).write_text('x')
    file_safety.remove_dead_temps(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted([names[0], '.ckpt.pt.tmp1x', 'kept.txt'])


# ---- checkpoints -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope='module')
def uninterrupted(shakespeare_char_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp('whole') / 'run')
    run_cli(train.main, run_args(shakespeare_char_dir, out, '--max_iters=6'))
    return out


def test_a_failed_write_inside_torch_save_stops_with_the_previous_checkpoint(shakespeare_char_dir, tmp_path,
                                                                            monkeypatch, capsys, uninterrupted):
    """torch.save reports a failed write as a RuntimeError ('unexpected pos'): it becomes the one-sentence stop, the
    checkpoint of iteration 2 stays loadable, and resuming from it ends where the uninterrupted run ended."""
    out = str(tmp_path / 'run')
    real_save, saves = torch.save, []

    def failing_save(obj, f, *a, **kw):
        saves.append(obj['iter_num'])
        if len(saves) == 2:  # the second checkpoint: part of it written, then the disk is full
            f.write(b'\0' * 1000)
            raise RuntimeError('[enforce fail at inline_container.cc:626] . unexpected pos 1000 vs 1024')
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(torch, 'save', failing_save)
    code, err = call(train.main, run_args(shakespeare_char_dir, out, '--max_iters=6'), capsys)
    assert_one_sentence(code, err, 3, 'could not write', 'ckpt.pt')
    monkeypatch.undo()
    assert torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)['iter_num'] == 2 and not tmp_files(out)
    run_cli(train.main, [f'--out_dir={out}', '--init_from=resume'])
    same_log_and_weights(out, uninterrupted)


def test_ctrl_c_during_a_checkpoint_waits_for_it(shakespeare_char_dir, tmp_path, monkeypatch, capsys, uninterrupted):
    """A real SIGINT delivered in the middle of torch.save: the checkpoint is finished first, then the run stops with
    'interrupted.' and exit status 130; it loads, and resuming it ends where the uninterrupted run ended."""
    out = str(tmp_path / 'run')
    real_save, saves = torch.save, []

    def interrupted_save(obj, f, *a, **kw):
        saves.append(obj['iter_num'])
        if len(saves) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # the signal arrives while the file is being written
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(torch, 'save', interrupted_save)
    code, err = call(train.main, run_args(shakespeare_char_dir, out, '--max_iters=6'), capsys)
    assert_one_sentence(code, err, 130, 'interrupted.')
    monkeypatch.undo()
    assert torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)['iter_num'] == 4 and not tmp_files(out)
    run_cli(train.main, [f'--out_dir={out}', '--init_from=resume'])
    same_log_and_weights(out, uninterrupted)


@pytest.mark.parametrize('sig, handler, stop', [(signal.SIGINT, signal.default_int_handler, KeyboardInterrupt),
                                                 (signal.SIGTERM, compare.raise_terminated, Terminated)])
def test_a_stop_signal_waits_for_the_files_that_land_together(tmp_path, monkeypatch, sig, handler, stop):
    """compare.py stops on SIGTERM as on Ctrl-C: within ctrl_c_held either waits until every file is written, as a
    report's summary.json and summary.md must come from one comparison."""
    previous = signal.signal(sig, handler)
    try:
        with pytest.raises(stop):
            with file_safety.ctrl_c_held():
                file_safety.write_json(str(tmp_path / 'summary.json'), {})
                os.kill(os.getpid(), sig)
                file_safety.write_file(str(tmp_path / 'summary.md'), lambda f: f.write('x'))
        assert sorted(os.listdir(tmp_path)) == ['summary.json', 'summary.md']
    finally:
        signal.signal(sig, previous)


@pytest.mark.parametrize('when', ['second checkpoint', 'first checkpoint', 'from the start'])
def test_a_full_disk_is_a_one_sentence_stop(shakespeare_char_dir, tmp_path, monkeypatch, capsys, when):
    """The disk fills up at the second checkpoint, before the first fits, or is full before the run starts (the lock,
    the log): exit status 3, one sentence, and whatever checkpoint was written before still loads."""
    # a checkpoint of this tiny model is ~220 kB, and the next one is written beside it before it replaces it
    sizes = {'second checkpoint': '400k', 'first checkpoint': '150k', 'from the start': '64k'}
    with small_disk(tmp_path / 'disk', sizes[when]) as disk:
        out = str((disk or tmp_path) / 'run')
        if disk is None:  # a patched writer instead
            fail_writes(monkeypatch, *{'second checkpoint': ('ckpt.pt', 1), 'first checkpoint': ('ckpt.pt', 0),
                                       'from the start': ('', 0)}[when])
        elif when == 'from the start':
            with open(os.path.join(disk, 'filler'), 'wb') as f, contextlib.suppress(OSError):
                f.write(b'\0' * 10**6)
        code, err = call(train.main, run_args(shakespeare_char_dir, out, '--max_iters=4'), capsys)
        assert_one_sentence(code, err, 3, 'could not write')
        assert not os.path.exists(os.path.join(out, 'diverged.txt'))  # not an outcome: the same command continues it
        if when == 'second checkpoint':
            assert torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)['iter_num'] == 2
        assert not tmp_files(out) if os.path.isdir(out) else True


def test_an_overwrite_that_cannot_write_its_log_keeps_the_old_run_whole(shakespeare_char_dir, tmp_path, monkeypatch,
                                                                         capsys, uninterrupted):
    """--overwrite=True on a full disk: the new run stops before it removes anything, so the old run's checkpoint and
    its finished log stay together (never a finished log beside no checkpoint: a comparison would take it as done)."""
    out = str(tmp_path / 'run')
    shutil.copytree(uninterrupted, out)
    fail_writes(monkeypatch, 'log.jsonl')
    code, err = call(train.main, run_args(shakespeare_char_dir, out, '--max_iters=6', '--overwrite=True', '--seed=7'),
                     capsys)
    assert_one_sentence(code, err, 3, 'could not write', 'log.jsonl')
    monkeypatch.undo()
    same_log_and_weights(out, uninterrupted)


def test_a_kill_as_an_overwrite_replaces_the_log_never_leaves_the_old_checkpoint_beside_the_new_log(
        shakespeare_char_dir, tmp_path, monkeypatch, capsys, uninterrupted):
    """--overwrite=True killed the moment its empty log has replaced the old run's: the old checkpoint is gone already,
    so a resume refuses (train again) instead of continuing the old run with its log lines lost."""
    out = str(tmp_path / 'run')
    shutil.copytree(uninterrupted, out)
    real_replace = os.replace

    class Killed(BaseException):
        pass

    def replace(src, dst):
        real_replace(src, dst)
        if dst.endswith('log.jsonl'):
            raise Killed

    monkeypatch.setattr(file_safety.os, 'replace', replace)
    with pytest.raises(Killed):
        train.main(run_args(shakespeare_char_dir, out, '--max_iters=6', '--overwrite=True', '--seed=7'))
    monkeypatch.undo()
    assert os.path.getsize(os.path.join(out, 'log.jsonl')) == 0 and not os.path.exists(os.path.join(out, 'ckpt.pt'))
    code, err = call(train.main, [f'--out_dir={out}', '--init_from=resume'], capsys)
    assert_one_sentence(code, err, 2, 'no checkpoint', 'train it again')


# ---- reports, pictures, records --------------------------------------------------------------------------------------


@pytest.fixture(scope='module')
def compared(shakespeare_char_dir, tmp_path_factory):
    """A finished tiny comparison (gelu, la x 1 seed), its runs trained in this process."""
    out = str(tmp_path_factory.mktemp('cmp') / 'cmp')
    argv = [f'--data_dir={shakespeare_char_dir}', f'--out_dir={out}', '--variants=gelu,la', '--seeds=1', '--lrs=',
            '--max_iters=4', '--eval_interval=2', *TINY]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for run in grid_specs(compare.settings(argv)):
            train.main(to_argv(run['settings']))
        compare.main(argv)
    return argv, out


def copy_of(compared, tmp_path):
    argv, out = compared
    moved = str(tmp_path / 'cmp')
    shutil.copytree(out, moved)
    return [a if not a.startswith('--out_dir=') else f'--out_dir={moved}' for a in argv], moved


def test_a_report_on_a_full_disk_keeps_the_previous_summary_and_pictures(compared, tmp_path, monkeypatch, capsys):
    argv, out = copy_of(compared, tmp_path)
    before = files(out)
    fail_writes(monkeypatch, out)  # every file of the comparison: pictures, summaries, acts
    code, err = call(compare.main, argv + ['--report=True'], capsys)
    assert_one_sentence(code, err, 3, 'could not write')
    assert files(out) == before and not tmp_files(out)


def test_inspect_on_a_read_only_run_directory_is_refused_before_the_work(compared, tmp_path, capsys):
    _, out = compared
    run = os.path.join(out, 'la', 'seed1337')
    if os.geteuid() == 0:  # root writes through permissions: a read-only bind mount of the run
        ro = tmp_path / 'ro'
        ro.mkdir()
        if subprocess.run(['mount', '--bind', '-o', 'ro', run, str(ro)], capture_output=True).returncode:
            pytest.skip('cannot make a read-only mount here')
        subprocess.run(['mount', '-o', 'remount,bind,ro', str(ro)], capture_output=True)
        run = str(ro)
    else:
        os.chmod(run, 0o555)
    try:
        before = files(run)
        code, err = call(inspect_run.main, [f'--out_dir={run}'], capsys)
        assert_one_sentence(code, err, 2, 'cannot write in')
        assert files(run) == before
    finally:
        if os.geteuid() == 0:
            subprocess.run(['umount', str(run)], capture_output=True)
        else:
            os.chmod(run, 0o755)


@pytest.mark.parametrize('damage', ['iter renamed', 'iter text'])
def test_valid_json_of_the_wrong_shape_is_set_aside(compared, tmp_path, capsys, damage):
    argv, out = copy_of(compared, tmp_path)
    run = os.path.join(out, 'la', 'seed1337')
    path = os.path.join(run, 'log.jsonl')
    records = [json.loads(l) for l in open(path)]
    change = {'iter renamed': lambda r: {('step' if k == 'iter' else k): v for k, v in r.items()},
              'iter text': lambda r: {**r, 'iter': str(r['iter'])}}[damage]
    records[1] = change(records[1])  # a line in the middle (of iterations 0, 2 and 4)
    with open(path, 'w') as f:
        f.writelines(json.dumps(r) + '\n' for r in records)
    code, err = call(compare.main, argv + ['--report=True'], capsys)
    assert code == 0 and 'Traceback' not in err
    assert [l for l in message_lines(err) if 'damaged' in l] == [f"compare: damaged log lines set aside (not JSON "
                                                                f"records as train.py writes them): 1 in {path}"]
    assert (f"WARNING: damaged log lines set aside (not JSON records as train.py writes them): 1 in {path}."
            in open(os.path.join(out, 'summary.md')).read())  # where the table is read, not only on stderr
    code, err = call(inspect_run.main, [f'--out_dir={run}'], capsys)
    assert code == 0 and [l for l in message_lines(err)] == [f"warning: 1 damaged line(s) of {run}/log.jsonl set aside."]


def test_a_log_that_is_a_directory_is_a_run_to_train_again(compared, tmp_path, capsys):
    argv, out = copy_of(compared, tmp_path)
    run = os.path.join(out, 'la', 'seed1337')
    os.remove(os.path.join(run, 'log.jsonl'))
    os.mkdir(os.path.join(run, 'log.jsonl'))
    before = files(out)
    code, err = call(compare.main, argv + ['--report=True'], capsys)
    assert_one_sentence(code, err, 2, '1 of 2 runs are not finished')
    assert files(out) == before
    code, err = call(inspect_run.main, [f'--out_dir={run}'], capsys)  # the pictures come from the checkpoint
    assert code == 0 and message_lines(err) == [f"warning: 1 damaged line(s) of {run}/log.jsonl set aside."]


def test_a_finished_run_whose_log_is_gone_is_trained_again_not_counted(compared, tmp_path, capsys):
    argv, out = copy_of(compared, tmp_path)
    os.remove(os.path.join(out, 'la', 'seed1337', 'log.jsonl'))
    cfg = compare.settings(argv)
    run = next(r for r in grid_specs(cfg) if r['variant'] == 'la')
    assert scan_state(run) == 'retrain'
    with contextlib.redirect_stdout(io.StringIO()) as plan:
        compare.main(argv + ['--plan=True'])
    assert plan.getvalue().count('\n') == 1 and '--overwrite=True' in plan.getvalue()
    code, err = call(compare.main, argv + ['--report=True'], capsys)
    assert_one_sentence(code, err, 2, 'not finished')


def test_a_ladder_report_checks_every_size_before_writing(compared, shakespeare_char_dir, tmp_path, capsys):
    """Size 1x32 finished, 1x16 never trained: --report refuses and writes nothing, not even 1x32's summary."""
    out = str(tmp_path / 'ladder')
    argv = [f'--data_dir={shakespeare_char_dir}', f'--out_dir={out}', '--variants=gelu', '--seeds=1', '--max_iters=2',
            '--eval_interval=2', '--lrs=', *TINY, '--sizes=1x32x2,1x16x2']
    with contextlib.redirect_stderr(io.StringIO()):
        for run in grid_specs(compare.settings(argv + ['--sizes=', f'--out_dir={out}/1x32'])):
            train.main(to_argv(run['settings']))
    before = files(out)
    code, err = call(compare.main, argv + ['--report=True'], capsys)
    assert_one_sentence(code, err, 2, '1x16', 'not finished')
    assert files(out) == before


# ---- up-front refusals -----------------------------------------------------------------------------------------------


def test_a_wandb_that_cannot_be_imported_is_refused_before_the_old_run_is_replaced(compared, monkeypatch, capsys):
    _, out = compared
    run = os.path.join(out, 'gelu', 'seed1337')
    before = files(run)
    monkeypatch.setitem(sys.modules, 'wandb', None)  # import wandb raises ImportError, as a broken install does
    code, err = call(train.main, TINY + [f'--out_dir={run}', '--overwrite=True', '--wandb_log=True', '--max_iters=2',
                                         f"--data_dir={compare.settings([f'--out_dir={out}'])['data_dir']}"], capsys)
    assert_one_sentence(code, err, 2, 'wandb')
    assert files(run) == before
    code, err = call(compare.main, [f'--out_dir={out}/other', '--wandb_log=True', '--lrs=', *TINY], capsys)
    assert_one_sentence(code, err, 2, 'wandb')
    assert not os.path.exists(f'{out}/other')


@pytest.mark.parametrize('script,argv,words', [
    (train, ['--seed=4294967296'], '--seed must be between 0 and'),
    (compare, ['--sizes=1x32', '--tokens_per_param=1e30'], 'iterations'),
    ('sample', ['--temperature=1e-300'], '--temperature'),
    ('sample', ['--seed=18446744073709551616'], '--seed'),
    ('sample', ['--seed=-1'], '--seed must be between 0 and 2**63 - 1, got -1.'),  # as 2**63 is said: one range
], ids=['train seed 2**32', 'tokens_per_param 1e30', 'temperature 1e-300', 'sample seed 2**64', 'sample seed -1'])
def test_numbers_out_of_range_are_one_sentence(script, argv, words, compared, capsys, tmp_path):
    import sample
    _, out = compared
    script = sample if script == 'sample' else script
    base = [f'--out_dir={out}/gelu/seed1337', '--device=cpu'] if script is sample else [f'--out_dir={tmp_path}/x']
    code, err = call(script.main, base + argv, capsys)
    assert_one_sentence(code, err, 2, words)


def test_a_nan_temperature_in_a_config_file_is_refused(compared, tmp_path, capsys):
    import sample
    _, out = compared
    (tmp_path / 'c.py').write_text("temperature = float('nan')\n")
    code, err = call(sample.main, [str(tmp_path / 'c.py'), f'--out_dir={out}/gelu/seed1337', '--device=cpu'], capsys)
    assert_one_sentence(code, err, 2, '--temperature')


# ---- a run interrupted before its first checkpoint -------------------------------------------------------------------


@pytest.mark.slow
def test_a_plan_line_killed_before_its_first_checkpoint_is_planned_again_and_finishes(shakespeare_char_dir, tmp_path):
    out = str(tmp_path / 'cmp')
    argv = [f'--data_dir={shakespeare_char_dir}', f'--out_dir={out}', '--variants=gelu', '--seeds=1', '--max_iters=400',
            '--eval_interval=200', '--lrs=', *TINY]

    def plan_lines():
        with contextlib.redirect_stdout(io.StringIO()) as buf, contextlib.redirect_stderr(io.StringIO()):
            compare.main(argv + ['--plan=True'])
        return buf.getvalue().splitlines()

    (line,) = plan_lines()
    log = os.path.join(out, 'gelu', 'seed1337', 'log.jsonl')
    p = subprocess.Popen(line, shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                         start_new_session=True)
    try:
        while not (os.path.exists(log) and os.path.getsize(log) > 0):  # iteration 0 logged, no checkpoint yet
            assert p.poll() is None, 'the run ended before it could be killed'
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert not os.path.exists(os.path.join(out, 'gelu', 'seed1337', 'ckpt.pt'))
    assert plan_lines() == [line]  # planned again, as it was: it starts again
    assert subprocess.run(line, shell=True, capture_output=True, cwd=ROOT).returncode == 0
    assert plan_lines() == []
    with contextlib.redirect_stdout(io.StringIO()) as table, contextlib.redirect_stderr(io.StringIO()):
        compare.main(argv + ['--report=True'])
    assert '| gelu |' in table.getvalue()
