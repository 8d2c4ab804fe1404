"""Tests of train.py and configurator.py: exact resume, DDP equivalence, atomic checkpoints and the non-finite stop
(the one-line user errors are the matrix of tests/test_hostile.py). Every run is a tiny model (1 layer, d=32, T=32)
for a handful of iterations on CPU, trained in this process (no interpreter start per run) unless it needs its own.

The shakespeare_char_dir fixture (tests/conftest.py) prepares the dataset into a temporary data_dir."""
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import configurator  # noqa: E402
import train as train_py  # noqa: E402
from machinery import cli, distributed, fingerprint, run_log  # noqa: E402
from machinery.cli import UserError, parse_args, read_text  # noqa: E402
from nan_train import nan_step  # noqa: E402

TINY = ['--device=cpu', '--dtype=float32', '--compile=False', '--n_layer=1', '--n_head=2', '--n_embd=32',
        '--block_size=32', '--batch_size=4', '--eval_iters=2', '--log_interval=1', '--warmup_iters=2',
        '--lr_decay_iters=10']


def env(**extra):
    e = dict(os.environ)
    e['OMP_NUM_THREADS'] = '1'  # several tiny processes on a shared CPU: one thread each is far faster
    e.update(extra)
    return e


def run(script, *args, extra_env=None, launcher=None):
    cmd = (launcher or [sys.executable]) + [script, *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env(**(extra_env or {})), timeout=600)


def train(data_dir, out_dir, *args, **kw):
    """train.py as a subprocess (for what needs a process of its own: torchrun, kill, a terminal)."""
    return run('train.py', *TINY, f'--data_dir={data_dir}', f'--out_dir={out_dir}', *args, **kw)


def train_here(data_dir, out_dir, *args):
    """train.py's main in this process."""
    train_py.main([*TINY, f'--data_dir={data_dir}', f'--out_dir={out_dir}', *args])


def log(out_dir):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [json.loads(line) for line in f]


def assert_ok(p):
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]


@pytest.fixture(scope='module')
def tiny_run(shakespeare_char_dir, tmp_path_factory):
    """One finished 4-iteration run (checkpoints at 2 and 4)."""
    out = str(tmp_path_factory.mktemp('tiny_run'))
    train_here(shakespeare_char_dir, out, '--max_iters=4', '--eval_interval=2')
    return shakespeare_char_dir, out


# --------------------------------------------------------------------------------------------------------------------
# check 1: exact resume

def test_exact_resume(shakespeare_char_dir, tmp_path):
    """2N iterations in one run == N iterations, then resume for N more: the same losses at every logged step.
    Dropout is on, so the RNG state must be restored too; a stray log line past the checkpoint must be dropped."""
    data, a, b = shakespeare_char_dir, str(tmp_path / 'a'), str(tmp_path / 'b')
    common = ['--eval_interval=2', '--dropout=0.1', '--ffn=moa']
    train_here(data, a, *common, '--max_iters=6')
    train_here(data, b, *common, '--max_iters=3')
    with open(os.path.join(b, 'log.jsonl'), 'a') as f:  # as if the run had logged past its last checkpoint
        f.write(json.dumps({'iter': 4, 'loss': 123.0}) + '\n')
    train_py.main([f'--out_dir={b}', '--init_from=resume', '--max_iters=6'])  # settings come from the checkpoint
    la, lb = log(a), log(b)
    assert [r['iter'] for r in la] == [r['iter'] for r in lb] == list(range(7))  # no line twice, the stray one gone
    for ra, rb in zip(la, lb):
        for key in ('loss', 'batch_hash', 'tokens', 'lr'):
            assert ra.get(key) == rb.get(key), (key, ra, rb)
        if 'val_loss' in ra and 'val_loss' in rb:  # b also evaluated at 3, where it first stopped
            assert [ra[k] for k in ('val_loss', 'val_halves', 'act')] == [rb[k] for k in ('val_loss', 'val_halves', 'act')]
    ca = torch.load(os.path.join(a, 'ckpt.pt'), weights_only=True)
    cb = torch.load(os.path.join(b, 'ckpt.pt'), weights_only=True)
    assert ca['iter_num'] == cb['iter_num'] == 6
    for k, v in ca['model'].items():
        assert torch.equal(v, cb['model'][k]), k


def test_a_resume_says_when_its_checkpoint_was_trained_with_other_code(shakespeare_char_dir, tmp_path, capsys):
    out = str(tmp_path)
    train_here(shakespeare_char_dir, out, '--max_iters=2', '--eval_interval=2')
    path = os.path.join(out, 'ckpt.pt')
    ckpt = torch.load(path, weights_only=True)
    assert ckpt['code'] == fingerprint.code_hash()
    for code, noted in ((fingerprint.code_hash(), False), ('before an edit', True)):
        torch.save({**ckpt, 'code': code}, path)
        capsys.readouterr()
        train_py.main([f'--out_dir={out}', '--init_from=resume', '--max_iters=2'])
        said = 'note: the checkpoint was trained with other code of activations.py or model.py' in capsys.readouterr().err
        assert said == noted


def test_a_resume_says_when_it_moves_its_schedules_end_or_has_nothing_left(shakespeare_char_dir, tmp_path, capsys):
    first = str(tmp_path / 'first')
    train_here(shakespeare_char_dir, first, '--max_iters=2', '--eval_interval=2', '--lr_decay_iters=0')
    for i, (given, noted) in enumerate(((['--max_iters=2'], False), (['--max_iters=4', '--lr_decay_iters=2'], False),
                                        (['--max_iters=4', '--schedule=constant'], False),  # it never decays
                                        (['--max_iters=4'], True))):  # lr_decay_iters=0 follows max_iters
        out = shutil.copytree(first, tmp_path / str(i))
        capsys.readouterr()
        train_py.main([f'--out_dir={out}', '--init_from=resume', *given])
        err = capsys.readouterr().err
        said = ('note: the learning rate now decays to min_lr at iteration 4, not 2; give --lr_decay_iters=2 to keep '
                "the checkpoint's schedule.") in err
        assert said == noted, given
        # a resume with nothing left to train says so, not only 'done'
        assert ('note: the checkpoint is at iteration 2, --max_iters=2: nothing is left to train; give a larger '
                '--max_iters to go on.' in err) == (given == ['--max_iters=2'])


def test_a_schedule_that_ends_apart_from_the_run_is_noted(shakespeare_char_dir, tmp_path, capsys):
    """A config's lr_decay_iters kept as --max_iters shortens the run leaves the rate near its peak, and as it
    lengthens the run (or a resume does) trains its last iterations at min_lr: train.py says so, as compare.py does; a
    schedule that ends with the run, a constant one, or a resume with nothing left to train says nothing of it."""
    past = 'note: lr_decay_iters=10 lies past max_iters=4, so the rate never decays to min_lr; --lr_decay_iters=0 '
    before = 'note: lr_decay_iters=2 ends before max_iters=4, so the run\'s last 2 iterations train at min_lr; '
    for i, (given, said) in enumerate(((['--lr_decay_iters=10'], past), (['--lr_decay_iters=2'], before),
                                       (['--lr_decay_iters=4'], None), (['--lr_decay_iters=0'], None),
                                       (['--lr_decay_iters=10', '--schedule=constant'], None))):
        capsys.readouterr()
        train_here(shakespeare_char_dir, str(tmp_path / str(i)), '--max_iters=4', '--eval_interval=4', *given)
        notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith('note: lr_decay_iters')]
        assert [n[:len(said or '')] for n in notes] == ([said] if said else []), (given, notes)
    train_py.main([f'--out_dir={tmp_path / "0"}', '--init_from=resume'])  # at iteration 4 of 4: nothing to note
    assert 'lr_decay_iters' not in capsys.readouterr().err
    # a resume past its schedule's end (README's, to 3000 on a config decaying at 2000) is told the fix that a resume
    # takes quietly: at --lr_decay_iters=0 the note that the checkpoint's schedule moved would send it back
    for i, given in enumerate(([], ['--lr_decay_iters=6'])):
        out = shutil.copytree(tmp_path / '2', tmp_path / f'resumed{i}')  # lr_decay_iters=4, at iteration 4
        train_py.main([f'--out_dir={out}', '--init_from=resume', '--max_iters=6', *given])
        err = capsys.readouterr().err
        assert (("note: lr_decay_iters=4 ends before max_iters=6, so the run's last 2 iterations train at min_lr; "
                 "--lr_decay_iters=6 ends the schedule with the run.") in err) == (not given)
        assert 'now decays' not in err and err.count('note: lr_decay_iters') == (not given), err


def test_a_resume_warns_of_log_lines_lost_since_its_checkpoint(shakespeare_char_dir, tmp_path, capsys):
    out = str(tmp_path)
    train_here(shakespeare_char_dir, out, '--max_iters=2', '--eval_interval=2')
    lines = open(os.path.join(out, 'log.jsonl')).readlines()
    for kept, warned in ((lines, False), (['{damaged\n', *lines[1:]], False),  # set aside, said so, not lost
                         (lines[1:], True)):  # a log cut by hand: its first line lost
        open(os.path.join(out, 'log.jsonl'), 'w').writelines(kept)
        capsys.readouterr()
        train_py.main([f'--out_dir={out}', '--init_from=resume'])
        said = (f"warning: {out}/log.jsonl holds {len(lines) - 1} of the {len(lines)} lines up to its checkpoint; the "
                "run goes on, its log without the lost ones.") in capsys.readouterr().err
        assert said == warned


def test_a_float16_resume_continues_the_loss_scaler(shakespeare_char_dir, tmp_path):
    """float16 scales the loss (torch.amp.GradScaler; CPU autocast runs float16 too): a resumed run continues the
    saved scaler, its scale and its count of steps since the last change, as one run of the same length has them."""
    data, a, b = shakespeare_char_dir, str(tmp_path / 'a'), str(tmp_path / 'b')
    common = ['--dtype=float16', '--eval_interval=2']
    train_here(data, a, *common, '--max_iters=4')
    train_here(data, b, *common, '--max_iters=2')
    train_py.main([f'--out_dir={b}', '--init_from=resume', '--max_iters=4'])
    sa, sb = (torch.load(os.path.join(d, 'ckpt.pt'), weights_only=True)['scaler'] for d in (a, b))
    assert sa['_growth_tracker'] == 4 and sa == sb


def in_process(main, argv, capsys):
    """Run a CLI's main through cli.run_cli in this process (no torch import per run): (exit code, stderr)."""
    with pytest.raises(SystemExit) as e:
        cli.run_cli(main, argv)
    return e.value.code, capsys.readouterr().err


def test_resume_rejects_a_changed_data_stream_naming_what_changed_it(tiny_run, tmp_path, capsys):
    """The sentence names the setting's source: an override, or a config file (a learner who never typed --ffn)."""
    _, out = tiny_run
    config = tmp_path / 'mine.py'
    config.write_text('batch_size = 8\n')
    for given, said in (('--batch_size=8', "--batch_size=8 differs from the checkpoint's 4; a resumed run keeps its "
                                           "model, data stream and validation windows, so drop --batch_size or"),
                        # its best_val_loss: over which windows
                        ('--eval_iters=5', "--eval_iters=5 differs from the checkpoint's"),
                        (str(config), f"{config} sets batch_size=8, which differs from the checkpoint's 4; a resumed "
                                      f"run keeps its model, data stream and validation windows, so resume without "
                                      f"{config} or")):
        code, err = in_process(train_py.main, [given, f'--out_dir={out}', '--init_from=resume', '--max_iters=5'],
                               capsys)
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1


def test_resume_checks_the_given_model_keys_against_the_checkpoints_not_the_defaults(shakespeare_char_dir, tmp_path):
    """A run trained with top_k=1 (default 2) resumes with --n_expert=1 given: top_k is the checkpoint's."""
    out = str(tmp_path / 'moe1')
    train_here(shakespeare_char_dir, out, '--max_iters=2', '--eval_interval=2', '--n_expert=1', '--top_k=1')
    train_py.main([f'--out_dir={out}', '--init_from=resume', '--max_iters=3', '--n_expert=1'])
    assert log(out)[-1]['iter'] == 3


def test_resume_applies_the_given_optimizer_settings(tiny_run, tmp_path, monkeypatch):
    """--weight_decay and --betas given on resume are used, not the checkpoint's optimizer's."""
    import shutil
    _, out = tiny_run
    run_dir = str(tmp_path / 'run')
    shutil.copytree(out, run_dir)
    seen, restore = [], train_py.restore
    monkeypatch.setattr(train_py, 'restore', lambda ckpt, r: (
        restore(ckpt, r), seen.append([(g['weight_decay'], g['betas']) for g in r.optimizer.param_groups]))[0])
    train_py.main([f'--out_dir={run_dir}', '--init_from=resume', '--max_iters=5', '--weight_decay=0.5',
                   '--beta1=0.8', '--beta2=0.9'])
    assert seen == [[(0.5, (0.8, 0.9)), (0.0, (0.8, 0.9))]]


@pytest.mark.parametrize('change', ['itos', 'train_tokens'])
def test_resume_refuses_a_dataset_prepared_again(tiny_run, tmp_path, capsys, change):
    """Another vocabulary, or the same one over other text: the data are not the run's, and the sentence says so (not
    that its checkpoint is damaged)."""
    import shutil
    data, out = tiny_run
    data_copy, run_dir = tmp_path / 'data', str(tmp_path / 'run')
    shutil.copytree(data, data_copy)
    shutil.copytree(out, run_dir)
    meta_path = data_copy / 'shakespeare_char' / 'meta.json'
    meta = json.loads(meta_path.read_text())
    meta[change] = meta[change][::-1] if change == 'itos' else meta[change] + 1  # the same size, other characters
    meta_path.write_text(json.dumps(meta))
    code, err = in_process(train_py.main, [f'--out_dir={run_dir}', '--init_from=resume', '--max_iters=5',
                                           f'--data_dir={data_copy}'], capsys)
    assert code == 2 and err.startswith(f"error: shakespeare_char's meta.json differs from the one this run trained on "
                                        f"in {change} (prepared again?)")
    assert len(err.strip().splitlines()) == 1


def test_resume_refuses_other_text_under_the_same_meta_json(tiny_run, tmp_path, capsys):
    """The same vocabulary and token counts over other text (a typo fixed, files renamed): the resumed stream's last
    batch, drawn again, is another, and the sentence says the data are not the run's (not that its checkpoint is
    damaged)."""
    from data.shards import open_shard
    from data.write import write_shard
    data, out = tiny_run
    data_copy, run_dir = tmp_path / 'data', str(tmp_path / 'run')
    shutil.copytree(data, data_copy)
    shutil.copytree(out, run_dir)
    shard = str(data_copy / 'shakespeare_char' / 'train_000.bin')
    write_shard(shard, open_shard(shard)[::-1].copy())  # the same characters, in another order
    code, err = in_process(train_py.main, [f'--out_dir={run_dir}', '--init_from=resume', '--max_iters=5',
                                           f'--data_dir={data_copy}'], capsys)
    assert code == 2 and err.startswith("error: shakespeare_char's shards are not those this run trained on")
    assert len(err.strip().splitlines()) == 1


def test_a_new_run_sets_the_old_logs_damaged_lines_aside_and_its_pictures_go(tiny_run, tmp_path):
    """Trained again over an old run (--overwrite, or by compare.py), a damaged line of the old log is kept; the old
    run's acts.png and acts.json (inspect_run.py's) go, as they would stand beside the new run's log."""
    import shutil
    data, out = tiny_run
    run_dir = str(tmp_path / 'run')
    shutil.copytree(out, run_dir)
    with open(os.path.join(run_dir, 'log.jsonl'), 'a') as f:
        f.write('{"iter": 4 "loss": 1.0}\n')
    for name in run_log.PICTURES:
        (tmp_path / 'run' / name).write_text('of the old run')
    train_here(data, run_dir, '--max_iters=2', '--eval_interval=2', '--overwrite=True')
    assert open(os.path.join(run_dir, 'log.jsonl.damaged')).read() == '{"iter": 4 "loss": 1.0}\n'
    assert [r['iter'] for r in log(run_dir)] == [0, 1, 2]
    assert not any(os.path.exists(os.path.join(run_dir, name)) for name in run_log.PICTURES)


def test_a_run_into_a_comparisons_folder_is_refused_before_its_pictures_go(tiny_run, tmp_path, capsys):
    """--out_dir=out-mine, a comparison's: its summary.md shows acts.png, which a new run there would delete."""
    data, _ = tiny_run
    for name in ('summary.json', *run_log.PICTURES):
        (tmp_path / name).write_text('of the comparison')
    code, err = in_process(train_py.main, [*TINY, f'--data_dir={data}', f'--out_dir={tmp_path}', '--max_iters=2'],
                           capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"error: {tmp_path} holds a comparison (its summary.json), whose pictures a run there would replace; choose "
        f"another --out_dir."]
    assert all((tmp_path / name).read_text() == 'of the comparison' for name in run_log.PICTURES)


def test_a_run_beside_a_comparisons_summary_resumes(tiny_run, tmp_path, capsys):
    """A summary.json beside a run (an older compare.py's, into the run's folder): a resume deletes no picture, so it
    goes on, and the pictures stay."""
    data, out = tiny_run
    run_dir = str(tmp_path / 'run')
    shutil.copytree(out, run_dir)
    for name in ('summary.json', *run_log.PICTURES):
        (tmp_path / 'run' / name).write_text('of the comparison')
    train_here(data, run_dir, '--init_from=resume', '--max_iters=6', '--eval_interval=2')
    assert torch.load(os.path.join(run_dir, 'ckpt.pt'), weights_only=True)['iter_num'] == 6
    assert all((tmp_path / 'run' / name).read_text() == 'of the comparison' for name in run_log.PICTURES)


def test_checkpoint_contents(tiny_run):
    _, out = tiny_run
    ckpt = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)  # plain data: loads without pickle code
    for key in ('model', 'optimizer', 'model_args', 'iter_num', 'best_val_loss', 'config', 'rng', 'loader', 'meta',
                'tokens', 'log_lines', 'compiled'):
        assert key in ckpt, key
    assert ckpt['iter_num'] == 4 and ckpt['meta']['tokenizer'] == 'char'
    assert not any(k.startswith('_orig_mod.') for k in ckpt['model'])
    records = log(out)
    assert ckpt['log_lines'] == len(records) and records[-1]['iter'] == 4
    schema = {'iter', 'tokens', 'lr', 'loss', 'ms', 'tok_s', 'mfu', 'batch_hash'}
    assert schema <= set(records[1]) and 'val_loss' not in records[1]
    assert 'val_loss' in records[0] and 'val_loss' in records[2]
    assert records[-1]['tokens'] == 4 * 4 * 32
    # val_halves: the means over the first and the second half of the validation batches, whose mean is val_loss
    assert sum(records[2]['val_halves']) / 2 == pytest.approx(records[2]['val_loss'], rel=1e-6)


def test_the_log_shows_the_loss_terms_forward_returns(shakespeare_char_dir, tmp_path, monkeypatch):
    """An MoE run's line holds the mean over its micro-steps of the terms GPT.forward returned: loss (the
    cross-entropy), aux and z, and loss_total their sum."""
    from model import GPT
    returned, forward = [], GPT.forward
    monkeypatch.setattr(GPT, 'forward', lambda self, *a: returned.append(out := forward(self, *a)) or out)
    out = str(tmp_path / 'run')
    train_here(shakespeare_char_dir, out, '--n_expert=4', '--max_iters=2', '--eval_interval=2',
               '--gradient_accumulation_steps=2')
    steps = [terms for _, loss, terms in returned if loss is not None and loss.requires_grad]
    assert len(steps) == 4
    for r, micro in zip(log(out)[1:], (steps[:2], steps[2:])):
        mean = {k: sum(p[k] / 2 for p in micro).item() for k in ('ce', 'aux', 'z')}
        assert (r['loss'], r['aux'], r['z']) == (mean['ce'], mean['aux'], mean['z']) and mean['aux'] > 0
        assert r['loss_total'] == pytest.approx(mean['ce'] + mean['aux'] + mean['z'], rel=1e-6)


# --------------------------------------------------------------------------------------------------------------------
# check 2: DDP (torchrun, gloo on CPU) == gradient accumulation in one process

@pytest.mark.slow
def test_ddp_matches_gradient_accumulation(shakespeare_char_dir, tmp_path):
    """2 processes x 1 accumulation step see the batches of 1 process x 2 steps (the loader's stream semantics), so
    the losses agree up to the order of the floating-point reduction; each logs the MFU of one process, its share of
    the tokens against one device's peak. ~20 s on 2 cores."""
    from model import GPT
    data, ddp_out, one_out = shakespeare_char_dir, str(tmp_path / 'ddp'), str(tmp_path / 'one')
    common = ['--max_iters=4', '--eval_interval=2', '--peak_flops=1e12']
    torchrun = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
    assert_ok(train(data, ddp_out, *common, '--gradient_accumulation_steps=1', launcher=torchrun))
    assert_ok(train(data, one_out, *common, '--gradient_accumulation_steps=2'))
    ld, l1 = log(ddp_out), log(one_out)
    assert [r['iter'] for r in ld] == [r['iter'] for r in l1] == list(range(5))
    for rd, r1 in zip(ld, l1):
        assert rd['tokens'] == r1['tokens']
        for key in ('loss', 'val_loss'):
            if key in r1:
                assert rd[key] == pytest.approx(r1[key], rel=1e-5, abs=1e-5), (key, rd, r1)
    args = torch.load(os.path.join(one_out, 'ckpt.pt'), weights_only=True)['model_args']
    flops = GPT(configurator.model_config(args)).flops_per_token()
    for records, processes in ((ld, 2), (l1, 1)):
        mfus = [(r['mfu'], flops * r['tok_s'] / processes / 1e12) for r in records if 'tok_s' in r]
        assert mfus and all(got == pytest.approx(want, rel=1e-6) for got, want in mfus), (processes, mfus)


# --------------------------------------------------------------------------------------------------------------------
# check 3: user mistakes (exit 2, one sentence on stderr, no traceback) are the matrix of tests/test_hostile.py


# --------------------------------------------------------------------------------------------------------------------
# check 4: a kill during the checkpoint write leaves the previous checkpoint loadable

def test_killed_checkpoint_write_keeps_previous(tiny_run, monkeypatch):
    _, out = tiny_run
    path = os.path.join(out, 'ckpt.pt')
    before = open(path, 'rb').read()
    ckpt = torch.load(path, weights_only=True)
    real_save = torch.save

    def dying_save(obj, f, *a, **kw):  # writes part of the file, then the process "dies"
        real_save(obj, f, *a, **kw)
        f.seek(0)
        f.truncate(100)
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, 'save', dying_save)
    with pytest.raises(KeyboardInterrupt):
        train_py.write_checkpoint({**ckpt, 'iter_num': 999}, path)
    monkeypatch.undo()
    assert open(path, 'rb').read() == before
    assert torch.load(path, weights_only=True)['iter_num'] == 4
    assert not [n for n in os.listdir(out) if n.startswith('.ckpt.pt.tmp')]


# --------------------------------------------------------------------------------------------------------------------
# check 5: a non-finite loss stops the run with one sentence and keeps the last good checkpoint

def test_nonfinite_loss_stops_and_keeps_checkpoint(shakespeare_char_dir, tmp_path, monkeypatch, capsys):
    out = str(tmp_path)
    monkeypatch.setattr(train_py, 'step', nan_step(train_py.step, 3))  # iteration 3's loss is NaN
    code, err = in_process(train_py.main, [*TINY, f'--data_dir={shakespeare_char_dir}', f'--out_dir={out}',
                                           '--max_iters=5', '--eval_interval=2', '--lr_decay_iters=0'], capsys)
    assert code == 3 and 'Traceback' not in err
    lines = [l for l in err.strip().splitlines() if '%' not in l]
    assert len(lines) == 1 and 'non-finite' in lines[0] and 'iteration 3' in lines[0], err
    ckpt = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)
    assert ckpt['iter_num'] == 2
    assert all(torch.isfinite(v).all() for v in ckpt['model'].values())
    assert max(r['iter'] for r in log(out)) == 2  # the poisoned step was never logged


def test_a_non_finite_gradient_norm_inside_a_log_window_stops_the_run(shakespeare_char_dir, tmp_path, monkeypatch,
                                                                       capsys):
    """Iteration 2's loss times 1e30 stays finite, but its gradients' norm overflows float32: clipping by it zeroes
    the update, a silent no-op step. Though iteration 2 is not the last of its log window (4 iterations), it stops the
    run."""
    out = str(tmp_path)
    monkeypatch.setattr(train_py, 'step', nan_step(train_py.step, 2, scale=1e30))
    code, err = in_process(train_py.main, [*TINY, f'--data_dir={shakespeare_char_dir}', f'--out_dir={out}',
                                           '--max_iters=4', '--log_interval=4', '--eval_interval=4',
                                           '--lr_decay_iters=0'], capsys)
    lines = [l for l in err.strip().splitlines() if '%' not in l]
    assert code == 3 and len(lines) == 1 and 'gradient norm' in lines[0] and '(inf) at iteration 2' in lines[0], err
    assert [r['iter'] for r in log(out)] == [0] and not os.path.exists(os.path.join(out, 'ckpt.pt'))


def test_an_infinite_gradient_is_named_at_its_step_not_the_nan_loss_it_causes(shakespeare_char_dir, tmp_path,
                                                                            monkeypatch, capsys):
    """Iteration 2's gradient holds an inf (its loss finite): clipping multiplies it by 0, NaN, so iteration 3's loss
    is NaN in the same log window. The run names where it began, iteration 2's gradient norm."""
    step = train_py.step

    def inf_grad_at_2(r, lr):
        if r.iter_num + 1 != 2:
            return step(r, lr)
        hook = next(r.raw_model.parameters()).register_hook(lambda g: g.index_fill(0, torch.tensor(0), float('inf')))
        try:
            return step(r, lr)
        finally:
            hook.remove()
    monkeypatch.setattr(train_py, 'step', inf_grad_at_2)
    code, err = in_process(train_py.main, [*TINY, f'--data_dir={shakespeare_char_dir}', f'--out_dir={tmp_path}',
                                           '--max_iters=4', '--log_interval=4', '--eval_interval=4',
                                           '--lr_decay_iters=0'], capsys)
    assert code == 3 and 'the gradient norm, by which clipping scales the update, became non-finite (inf) at ' \
        'iteration 2' in err, err


def test_a_model_non_finite_before_any_step_stops_at_iteration_0_and_blames_its_formula(shakespeare_char_dir, tmp_path,
                                                                                      monkeypatch, capsys):
    """A formula edit that gives NaN at init: the run stops before training, says so, and logs no NaN line (which
    would not be JSON)."""
    import activations
    monkeypatch.setitem(activations.BASIS, 'gelu', lambda h: torch.log(h))  # NaN wherever h < 0
    out = str(tmp_path)
    code, err = in_process(train_py.main, [*TINY, f'--data_dir={shakespeare_char_dir}', f'--out_dir={out}',
                                           '--lr_decay_iters=0'], capsys)
    lines = [l for l in err.strip().splitlines() if '%' not in l]
    assert code == 3 and len(lines) == 1 and "the untrained model's validation loss is nan" in lines[0], err
    assert 'learning_rate' not in lines[0] and 'activations.py' in lines[0]
    (line,) = log(out)  # the try is on record, with its code, without the numbers NaN would make no JSON
    assert line['iter'] == 0 and 'val_loss' not in line and line['env']['code'] == fingerprint.code_hash()
    assert not os.path.exists(os.path.join(out, 'ckpt.pt'))
    assert os.path.exists(os.path.join(out, 'diverged.txt'))  # the outcome at these settings, as a comparison counts it


# --------------------------------------------------------------------------------------------------------------------
# configurator, in-process (fast)

DEFAULTS = {'n_layer': 6, 'dropout': 0.0, 'bias': False, 'dataset': 'x', 'compile': None}


def test_one_table_says_what_every_key_is():
    """configurator.SETTINGS: the model's keys are GPTConfig's fields, with its defaults (vocab_size 0: the dataset's);
    what a tuned rate depends on is part of what a run is; what a resume keeps is the dataset, batch, context, seed
    and validation windows."""
    from model import GPTConfig
    fields = {f.name: f.default for f in dataclasses.fields(GPTConfig)}
    assert configurator.keys_that('model') == list(fields)
    assert {k: configurator.DEFAULTS[k] for k in fields} == {**fields, 'vocab_size': 0}
    assert set(configurator.keys_that('tune')) < set(configurator.keys_that('id')) < set(configurator.DEFAULTS)
    assert set(configurator.keys_that('stream')) == {'dataset', 'batch_size', 'block_size', 'seed', 'eval_iters'}
    assert configurator.TYPES['compile'] is bool and configurator.TYPES['n_layer'] is int
    words = {w for key in configurator.SETTINGS.values() for w in key.what.split()}
    assert words == {'model', 'stream', 'id', 'tune', 'shown'}  # a misspelt word would classify nothing


def test_configurator_types():
    cfg, given = parse_args(DEFAULTS, ['--n_layer=4', '--dropout=1', '--bias=True', '--dataset=owt', '--compile=False'],
                            types={'compile': bool})
    assert cfg == {'n_layer': 4, 'dropout': 1.0, 'bias': True, 'dataset': 'owt', 'compile': False}
    assert given == dict.fromkeys(DEFAULTS, '--')  # each key, with what set it: an override
    assert parse_args(DEFAULTS, ['--n_layer=1e3'])[0]['n_layer'] == 1000  # integral: not a truncation
    assert parse_args(DEFAULTS, ['--compile=auto'], types={'compile': bool})[0]['compile'] is None
    for bad in ('--n_layer=3.5', '--n_layer=True', '--bias=maybe', '--dropout=abc', '--n_layr=2', 'n_layer=2'):
        with pytest.raises(UserError):
            parse_args(DEFAULTS, [bad], types={'compile': bool})


def test_a_value_of_the_wrong_type_is_told_its_type_not_a_default_its_config_file_changed():
    with pytest.raises(UserError, match=r"^--max_iters expects an int, got 'abc'\.$"):  # the config's is 2000
        parse_args(configurator.DEFAULTS, [os.path.join(ROOT, 'config', 'shakespeare_char.py'), '--max_iters=abc'],
                   types=configurator.TYPES)
    with pytest.raises(UserError, match=r"^--compile expects a bool \(True/False\) or auto, got 'maybe'\.$"):
        parse_args(configurator.DEFAULTS, ['--compile=maybe'], types=configurator.TYPES)


def test_a_value_after_a_space_is_read_as_the_keys_it_was_meant_for():
    """argparse's habit, --ffn polynorm: the refusal shows the --key=value it meant; a stray word alone is refused
    with no guess."""
    with pytest.raises(UserError, match=r"cannot read argument 'polynorm' \(did you mean --ffn=polynorm\?\): a config"):
        parse_args(DEFAULTS, ['--n_layer=2', '--ffn', 'polynorm'])
    with pytest.raises(UserError, match=r"cannot read argument 'polynorm': a config"):
        parse_args(DEFAULTS, ['polynorm', '--ffn=gelu'])


def test_help_says_what_each_key_is_by_the_comment_beside_it(capsys):
    """--help reads each key's comment where the key is defined: SETTINGS' over GPTConfig's (vocab_size 0 means the
    dataset's vocabulary to a run), GPTConfig's where SETTINGS has none (poly_order)."""
    notes = cli.key_notes(*configurator.NOTES)
    assert notes['vocab_size'] == "0 = the dataset's vocabulary (its meta.json)"
    assert notes['poly_order'] == 'r of PolyReLU / PolyNorm (2–4)' and 'n_layer' not in notes
    with pytest.raises(SystemExit) as e:
        parse_args(configurator.DEFAULTS, ['--threads=2', '--help'], types=configurator.TYPES, notes=configurator.NOTES)
    out = capsys.readouterr().out
    assert e.value.code == 0 and re.search(r"^  --threads +2  # torch's CPU threads; 0 = OMP_NUM_THREADS", out, re.M)
    assert re.search(r"^  --n_layer +6$", out, re.M)  # no comment, no note
    with pytest.raises(SystemExit) as e:  # what comes after --help is not read: no config file to find
        parse_args(configurator.DEFAULTS, ['--n_layer=3', '--help', 'config/missing.py'], types=configurator.TYPES)
    assert e.value.code == 0 and re.search(r"^  --n_layer +3$", capsys.readouterr().out, re.M)


def test_configurator_config_file(tmp_path):
    f = tmp_path / 'c.py'
    f.write_text("n_layer = 6\n_helper = 3\ndropout = 0.1 * _helper\n")
    cfg, given = parse_args(DEFAULTS, [str(f), '--n_layer=2'])
    assert cfg['n_layer'] == 2 and cfg['dropout'] == pytest.approx(0.3)
    assert given == {'n_layer': '--', 'dropout': str(f)}  # what set each last: an override, the config file
    assert parse_args(DEFAULTS, ['--n_layer=2', str(f)]) == (cfg, given)  # an override before a file wins too
    f.write_text("n_layers = 6\n")
    with pytest.raises(UserError, match="n_layers"):
        parse_args(DEFAULTS, [str(f)])
    f.write_text("compile = 'auto'\n")  # as on the command line, where --compile=auto works
    assert parse_args(DEFAULTS, [str(f)], types=configurator.TYPES)[0]['compile'] is None
    f.write_text("for i in range(3):\n    pass\n")
    with pytest.raises(UserError, match="unknown config key 'i' .a config file's own names, .*start with _"):
        parse_args(DEFAULTS, [str(f)])


def test_a_byte_order_mark_is_not_part_of_a_text_file(tmp_path):
    """Windows' Notepad may save UTF-8 with a byte-order mark: a config file with one was a syntax error, a prompt
    was refused for U+FEFF, and a char dataset's vocabulary held it."""
    f = tmp_path / 'c.py'
    f.write_bytes('\ufeffn_layer = 2\n'.encode('utf-8'))
    assert parse_args(DEFAULTS, [str(f)])[0]['n_layer'] == 2
    assert read_text(str(f), 'config file', 'c.py') == 'n_layer = 2\n'


def test_a_pipe_is_read_as_a_text_file():
    """A shell's process substitution (sample.py --start=FILE:<(printf ROMEO)) names a pipe, which exists but is not a
    regular file: it was said to be 'not found'."""
    r, w = os.pipe()
    os.write(w, 'ROMEO:'.encode())
    os.close(w)
    try:
        assert read_text(f'/dev/fd/{r}', 'prompt file', 'p.txt') == 'ROMEO:'
    finally:
        os.close(r)


def test_a_folders_tilde_is_the_users_home_from_a_flag_or_a_config_file(tmp_path, monkeypatch):
    """No shell expands a ~ after --key=, nor in a config file's string: train.py made a folder named ~ in the
    repository (which a later `rm -rf ~` would take for the home)."""
    monkeypatch.setenv('HOME', str(tmp_path))
    f = tmp_path / 'c.py'
    f.write_text("data_dir = '~/data'\ndataset = '~/not_a_folder'\n")
    cfg, _ = parse_args(configurator.DEFAULTS, [str(f), '--out_dir=~/run'], types=configurator.TYPES)
    assert (cfg['out_dir'], cfg['data_dir']) == (str(tmp_path / 'run'), str(tmp_path / 'data'))
    assert cfg['dataset'] == '~/not_a_folder'  # a name, not a path
    (tmp_path / 'p.txt').write_text('ROMEO:')
    assert read_text('~/p.txt', 'prompt file', 'p.txt') == 'ROMEO:'  # sample.py's --start=FILE:~/p.txt
    with pytest.raises(UserError, match=f"^prompt file '{tmp_path}' is a folder; give a path such as p.txt.$"):
        read_text('~', 'prompt file', 'p.txt')
    import bench
    assert parse_args(bench.DEFAULTS, ['--json=~/b.json'])[0]['json'] == str(tmp_path / 'b.json')


def test_run_cli_exit_codes(capsys):
    def bad(argv):
        raise UserError('something is wrong;\nfix it.')
    with pytest.raises(SystemExit) as e:
        cli.run_cli(bad, [])
    assert e.value.code == 2
    assert capsys.readouterr().err == 'error: something is wrong; fix it.\n'


def test_a_file_that_cannot_be_used_is_one_sentence_cut_at_a_word():
    """cli.reading: any failure to use a file nanoFFN wrote becomes one sentence naming the file; a long cause is cut
    at a word, with a mark that it was cut, never to nothing."""
    missing = RuntimeError('Missing key(s): ' + ', '.join(f'"transformer.h.{i}.ffn.act.s"' for i in range(12)) + '.')
    for error, cause in ((missing, 'RuntimeError: Missing key(s):'), (RuntimeError('x' * 300), 'RuntimeError: ...')):
        with pytest.raises(UserError) as e:
            with cli.reading('out/ckpt.pt', 'train the run again'):
                raise error
        said = str(e.value)
        assert said.startswith(f"cannot use out/ckpt.pt ({cause}") and said.endswith(
            " ...), so it is damaged or not written by nanoFFN; train the run again.")


def test_a_thread_count_past_4_per_core_is_refused_in_a_sentence(monkeypatch):
    """torch.set_num_threads crashes the process (a segfault, or an overflow) on a count past an int: refused first,
    from --threads or OMP_NUM_THREADS alike."""
    from machinery import device
    cores, threads = device.usable_cores(), torch.get_num_threads()
    try:
        with pytest.raises(UserError, match=rf"^--threads=99999999999 asks for more threads than 4 per core of this "
                                            rf"machine's {cores}; give at most {4 * cores}\.$"):
            device.set_threads(99999999999)
        monkeypatch.setenv('OMP_NUM_THREADS', str(4 * cores + 1))
        with pytest.raises(UserError, match=rf"^OMP_NUM_THREADS={4 * cores + 1} asks for more threads"):
            device.set_threads(0)
        assert device.set_threads(4 * cores).startswith(f"{4 * cores} CPU thread(s)")
        with pytest.raises(UserError, match=r"^--threads must not be negative, got -1\.$"):
            device.set_threads(-1)
    finally:
        torch.set_num_threads(threads)


def test_a_closed_stdout_pipe_ends_quietly():
    """`python sample.py ... | head`: no BrokenPipeError traceback, the shell's status for SIGPIPE."""
    code = 'from machinery.cli import run_cli; run_cli(lambda argv: [print("x" * 1000) for _ in range(100000)])'
    p = subprocess.Popen([sys.executable, '-c', code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.read(10)
    p.stdout.close()
    assert p.wait(timeout=60) == 141 and p.stderr.read() == b''


@pytest.mark.skipif(not os.path.exists('/dev/full'), reason='no /dev/full (a device always full) here')
def test_stdout_on_a_full_disk_stops_in_one_sentence():
    """`python train.py --help > log` with the disk full: one sentence and status 3, as any write that fails."""
    with open('/dev/full', 'w') as full:
        p = subprocess.run([sys.executable, 'train.py', '--help'], cwd=ROOT, stdout=full, stderr=subprocess.PIPE,
                           text=True, env=env(), timeout=60)
    assert p.returncode == 3 and p.stderr == ("stopped: could not write the output (No space left on device); free "
                                              "some space, then try again.\n")


def test_results_reach_a_log_file_as_they_are_printed():
    """`python train.py > log 2>&1` (a Slurm output file): each line on stdout is written as it is printed, in order
    with the progress on stderr, not when stdout's buffer fills at the end."""
    code = ('import sys; from machinery.cli import run_cli; '
            'run_cli(lambda argv: (print("iter 10: val loss 2.0"), print("train: 100%", file=sys.stderr)))')
    e = {k: v for k, v in env().items() if k != 'PYTHONUNBUFFERED'}
    p = subprocess.run([sys.executable, '-c', code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env=e, timeout=60)
    assert p.stdout.splitlines() == ['iter 10: val loss 2.0', 'train: 100%']


def test_activation_settings_are_checked_before_anything_runs():
    """configurator.check builds the activation, so its own checks are one-sentence errors before any training
    (compare.py calls it for every variant before its first run)."""
    for args, words in [(['--ffn=polynorm', '--poly_order=7'], 'poly_order'),
                        (['--ffn=la', '--act_dict=gelu,relu,gelu'], 'each entry once'),
                        (['--ffn=moa', '--moa_gate=relu'], 'moa_gate'),
                        (['--ffn=la', '--la_init=half'], 'la_init')]:
        cfg, _ = parse_args(configurator.DEFAULTS, args, types=configurator.TYPES)
        with pytest.raises(UserError, match=words):
            configurator.check(cfg)


def test_device_names_are_checked(fake_gpu):
    from machinery.device import resolve_device
    for bad in ('cuda:x', 'cpu:0', 'gpu', 'cuda:'):
        with pytest.raises(UserError, match='--device expects'):
            resolve_device(bad)
    with pytest.raises(UserError, match='no CUDA GPU is available here'):
        resolve_device('cuda')
    fake_gpu(n=2)  # as on a machine with two GPUs
    assert resolve_device('cuda:1') == 'cuda:1' and resolve_device('cuda') == 'cuda:0'
    with pytest.raises(UserError, match='2 CUDA GPU'):
        resolve_device('cuda:2')


def test_the_hardware_is_set_up_only_through_distributed_setup_and_device_use(shakespeare_char_dir, tmp_path,
                                                                              monkeypatch):
    """distributed.setup is train.py's one hardware set-up, and device.use the one place a device and dtype are chosen:
    neither train.py, sample.py nor bench.py (whose call tests/test_bench.py checks) resolves a device or dtype, joins
    a process group or sets TF32 itself."""
    calls, setup = [], distributed.setup
    monkeypatch.setattr(distributed, 'setup', lambda *a: calls.append(a) or setup(*a))
    train_here(shakespeare_char_dir, str(tmp_path / 'run'), '--max_iters=0')
    assert calls == [('cpu', 'float32')]
    for script in ('train.py', 'sample.py', 'bench.py'):
        source = open(os.path.join(ROOT, script)).read()
        for own in ('resolve_device', 'resolve_dtype', 'init_process_group', 'set_float32_matmul', 'set_device'):
            assert own not in source, (script, own)


def as_torchrun_process(monkeypatch):
    """This process as torchrun's only worker (rank 0 of 1, a free port for the group's rendezvous): distributed.setup
    then joins a gloo process group."""
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    for key, value in dict(RANK=0, LOCAL_RANK=0, WORLD_SIZE=1, MASTER_ADDR='127.0.0.1', MASTER_PORT=port).items():
        monkeypatch.setenv(key, str(value))


def test_distributed_setup_joins_torchrun_s_process_group(monkeypatch):
    """Alone, a process computes on its device; under torchrun (RANK, LOCAL_RANK, WORLD_SIZE set) distributed.setup
    also joins the process group, gloo on a CPU."""
    import torch.distributed as dist
    from machinery.distributed import Compute, setup
    assert setup('cpu', 'auto') == Compute('cpu', 'float32', ddp=False, rank=0, local_rank=0, world_size=1)
    as_torchrun_process(monkeypatch)
    try:
        assert setup('cpu', 'float32') == Compute('cpu', 'float32', ddp=True, rank=0, local_rank=0, world_size=1)
        assert dist.get_backend() == 'gloo' and dist.get_world_size() == 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_under_torchrun_a_device_name_is_checked_before_it_is_refused_as_a_ranks(monkeypatch):
    """--device=cuda:x is no device at all: saying so beats advice to pass --device=cuda (which may be none either)."""
    from machinery.distributed import setup
    as_torchrun_process(monkeypatch)
    with pytest.raises(UserError, match=r"--device expects auto, cpu, cuda, cuda:N or mps, got 'cuda:x'\."):
        setup('cuda:x', 'auto')


def test_the_compile_cache_is_the_documented_one_after_inductor_has_loaded(tmp_path):
    """Building AdamW loads Inductor, which writes its own default (/tmp/torchinductor_USER) into
    TORCHINDUCTOR_CACHE_DIR: the cache train.py uses stays ~/.cache/nanoffn/torchinductor unless the user set one."""
    code = ("import model; from machinery import speed; m = model.GPT(model.GPTConfig(n_layer=1, n_head=2, n_embd=32, "
            "vocab_size=65)); m.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu'); print(speed.compile_cache_dir())")
    clean = {k: v for k, v in env(XDG_CACHE_HOME=str(tmp_path)).items() if k != 'TORCHINDUCTOR_CACHE_DIR'}
    for extra, want in (({}, os.path.join(str(tmp_path), 'nanoffn', 'torchinductor')),
                        ({'TORCHINDUCTOR_CACHE_DIR': '/elsewhere'}, '/elsewhere')):
        p = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                           env={**clean, **extra})
        assert p.stdout.strip() == want, p.stderr[-2000:]


def test_a_float16_run_logs_records_that_read_back(shakespeare_char_dir, tmp_path):
    """float16's loss scaler skips its first steps (their gradient norm is not finite): their lines are still records
    (grad_norm null), so resuming keeps them instead of moving them to log.jsonl.damaged."""
    from machinery.run_log import read_log_lines
    out = str(tmp_path / 'run')
    train_here(shakespeare_char_dir, out, '--dtype=float16', '--max_iters=3', '--eval_interval=3', '--block_size=1',
               '--batch_size=1')  # a shape whose first scaled gradients overflow float16
    records, damaged = read_log_lines(os.path.join(out, 'log.jsonl'))
    assert not damaged and [r['iter'] for r in records] == [0, 1, 2, 3] and records[1]['grad_norm'] is None


def test_max_iters_0_names_no_checkpoint(shakespeare_char_dir, tmp_path, capsys):
    """A run of 0 iterations evaluates the untrained model and writes no checkpoint, so its last line names none."""
    train_here(shakespeare_char_dir, str(tmp_path / 'run'), '--max_iters=0')
    out, err = capsys.readouterr()
    done = out.splitlines()[-1]
    assert done.startswith('done: 0 iterations') and 'no checkpoint' in done
    assert 'train:' not in err  # no progress bar for no step (tqdm would draw '0it')
    assert not os.path.exists(tmp_path / 'run' / 'ckpt.pt')


def test_the_last_line_names_the_iteration_its_checkpoint_holds(shakespeare_char_dir, tmp_path, capsys):
    """With always_save_checkpoint=False a checkpoint is written only when the validation loss improves: at a rate
    of 0 it never does after iteration 2, so the run ends at 4 with its checkpoint at 2, and says so."""
    train_here(shakespeare_char_dir, str(tmp_path / 'run'), '--max_iters=4', '--eval_interval=2',
               '--always_save_checkpoint=False', '--learning_rate=0', '--min_lr=0')
    done = capsys.readouterr().out.splitlines()[-1]
    assert done.startswith('done: 4 iterations') and done.endswith(f"{tmp_path / 'run' / 'ckpt.pt'} (iteration 2)")


def test_a_log_lines_step_time_counts_the_wait_for_the_device(shakespeare_char_dir, tmp_path, monkeypatch):
    """On a GPU the loop only queues each step's work, and the log line's one sync (window_losses) waits for it to
    run: the step time is read after that wait, so it counts the work. Here the wait is made 0.2 s long."""
    import time
    window_losses = train_py.window_losses
    monkeypatch.setattr(train_py, 'window_losses', lambda w, hw: time.sleep(0.2) or window_losses(w, hw))
    out = str(tmp_path / 'run')
    train_here(shakespeare_char_dir, out, '--max_iters=4', '--eval_interval=4', '--log_interval=2')
    steps = [r['ms'] for r in log(out) if 'ms' in r]
    assert len(steps) == 2 and all(ms >= 100 for ms in steps), steps  # 0.2 s over a window of 2 steps


def test_evaluation_copies_nothing_to_the_device(shakespeare_char_dir, tmp_path, monkeypatch):
    """The fixed validation windows are placed on the device once, when the run starts, not at every evaluation."""
    copies, evaluations, to, evaluate = [], [], torch.Tensor.to, train_py.evaluate
    to_device = lambda a, kw: 'device' in kw or any(isinstance(v, (str, torch.device)) for v in a)
    monkeypatch.setattr(torch.Tensor, 'to', lambda self, *a, **kw: (copies.append(a) if to_device(a, kw) else None)
                        or to(self, *a, **kw))

    def counted(model, batches, *a):
        copies.clear()
        result = evaluate(model, batches, *a)
        evaluations.append((len(batches), list(copies)))
        return result
    monkeypatch.setattr(train_py, 'evaluate', counted)
    train_here(shakespeare_char_dir, str(tmp_path / 'run'), '--eval_iters=3', '--max_iters=2', '--eval_interval=1')
    assert evaluations == [(3, [])] * 3  # iterations 0, 1 and 2


def test_ddp_does_not_broadcast_buffers_nothing_changes(shakespeare_char_dir, tmp_path, monkeypatch):
    """DDP's default re-sends every buffer from rank 0 before each forward; the model's only buffers are RoPE's
    tables, which training never changes."""
    as_torchrun_process(monkeypatch)
    wrapped, DDP = [], train_py.DDP
    monkeypatch.setattr(train_py, 'DDP', lambda model, **kw: wrapped.append(DDP(model, **kw)) or wrapped[-1])
    train_here(shakespeare_char_dir, str(tmp_path / 'run'), '--max_iters=1', '--eval_interval=1')
    assert wrapped[0].broadcast_buffers is False
    assert [name for name, _ in wrapped[0].module.named_buffers()] == ['transformer.h.0.attn.cos',
                                                                        'transformer.h.0.attn.sin']


def test_ddp_is_freed_before_its_process_group_is_destroyed(shakespeare_char_dir, tmp_path, monkeypatch):
    """DDP's reducer, freed after its gloo group is gone, aborts the process at exit now and then ('terminate called
    without an active exception', about one exit in four on a loaded 2-core machine): torchrun then fails a finished
    run. train.py frees it first."""
    import weakref
    as_torchrun_process(monkeypatch)
    wrapped, alive_at_destroy, DDP, destroy = [], [], train_py.DDP, distributed.dist.destroy_process_group
    monkeypatch.setattr(train_py, 'DDP', lambda model, **kw: (m := DDP(model, **kw), wrapped.append(weakref.ref(m)))[0])
    monkeypatch.setattr(distributed.dist, 'destroy_process_group',
                        lambda: (alive_at_destroy.append(wrapped[0]() is not None), destroy())[1])
    train_here(shakespeare_char_dir, str(tmp_path / 'run'), '--max_iters=1', '--eval_interval=1')
    assert alive_at_destroy == [False]


def test_a_bundled_dataset_is_prepared_on_demand(tmp_path, capsys):
    """A fresh clone has no prepared data: train.py prepares the bundled corpus itself (seconds), as compare.py does."""
    data, out = tmp_path / 'data', str(tmp_path / 'run')
    with pytest.raises(UserError, match=f"^--data_dir={data} is not a folder here; give the folder that holds"):
        train_here(str(data), out, '--max_iters=1', '--eval_interval=1')  # a typo: no folder is made for it
    assert not data.exists() and not os.path.exists(out)
    data.mkdir()
    train_here(str(data), out, '--max_iters=1', '--eval_interval=1')
    assert 'preparing the bundled dataset shakespeare_char' in capsys.readouterr().err
    assert (data / 'shakespeare_char' / 'meta.json').exists() and log(out)[-1]['iter'] == 1
