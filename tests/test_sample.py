"""Tests of sample.py: deterministic text of the requested length, decoded with the checkpoint's own tokenizer, from a
tiny 2-iteration run's checkpoint; and (slow tier) from a checkpoint that a *compiled* model wrote."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sample  # noqa: E402
from test_train import TINY, assert_ok, in_process, run, train_here  # noqa: E402

SEPARATOR = '\n---------------\n'


@pytest.fixture(scope='module')
def tiny_run(shakespeare_char_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp('tiny_run'))
    train_here(shakespeare_char_dir, out, '--max_iters=2', '--eval_interval=2', '--eval_iters=1')
    return out


def samples(out_dir, capsys, *args):
    sample.main([f'--out_dir={out_dir}', '--device=cpu', *args])
    out = capsys.readouterr().out
    assert out.endswith(SEPARATOR)
    return out[:-len(SEPARATOR)].split(SEPARATOR)


def check_samples(run_dir, tmp_path, capsys):
    ckpt = torch.load(os.path.join(run_dir, 'ckpt.pt'), weights_only=True)
    assert not any(k.startswith('_orig_mod.') for k in ckpt['model'])  # loads into a plain GPT
    prompt = tmp_path / 'prompt.txt'
    prompt.write_text('ROMEO:')
    args = [f'--start=FILE:{prompt}', '--num_samples=2', '--max_new_tokens=40', '--seed=7', '--temperature=1.0']
    first = samples(run_dir, capsys, *args)
    assert samples(run_dir, capsys, *args) == first  # same seed, same text
    assert len(first) == 2
    for text in first:  # char tokenizer: one character per token
        assert text.startswith('ROMEO:') and len(text) == len('ROMEO:') + 40
        assert set(text) <= set(ckpt['meta']['itos'])
    return ckpt


def test_sample_is_deterministic_and_decodes_with_the_checkpoints_tokenizer(tiny_run, tmp_path, capsys):
    check_samples(tiny_run, tmp_path, capsys)


@pytest.mark.slow
def test_sample_from_a_compiled_checkpoint(shakespeare_char_dir, tmp_path, capsys):
    out = str(tmp_path / 'compiled')
    assert_ok(run('train.py', *TINY, '--compile=True', '--max_iters=2', '--eval_interval=2', '--eval_iters=1',
                  f'--data_dir={shakespeare_char_dir}', f'--out_dir={out}'))
    assert check_samples(out, tmp_path, capsys)['compiled'] is True


def test_sample_rejects_characters_outside_the_vocabulary(tiny_run, capsys):
    code, err = in_process(sample.main, [f'--out_dir={tiny_run}', '--device=cpu', '--start=\u00e9t\u00e9'], capsys)
    assert code == 2 and 'vocabulary' in err and len(err.strip().splitlines()) == 1
    assert "'é' is not in this dataset's vocabulary" in err and 'give a --start prompt of those characters' in err


def test_a_comparisons_folder_is_answered_with_one_of_its_runs(tmp_path, capsys):
    """Not "train one first": a comparison's --out_dir holds its runs in the folders below it, so one is named."""
    run_dir = tmp_path / 'out-mine' / 'gelu' / 'lr0.008' / 'seed1340'
    run_dir.mkdir(parents=True)
    (run_dir / 'ckpt.pt').write_text('')
    code, err = in_process(sample.main, [f"--out_dir={tmp_path / 'out-mine'}", '--device=cpu'], capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"error: there is no checkpoint at {tmp_path / 'out-mine' / 'ckpt.pt'}; {tmp_path / 'out-mine'} holds runs in "
        f"the folders below it: give one of them, e.g. --out_dir={run_dir}."]


@pytest.mark.parametrize('folder, hint', [
    ('started', 'the run writes it at its first evaluation after a step: wait for that, or train it again if it was '
                'stopped before.'),
    ('diverged', 'the run diverged before its first (diverged.txt says why and what to change).')])
def test_a_run_without_its_first_checkpoint_is_not_told_to_train_one(tmp_path, capsys, folder, hint):
    """A run still before its first checkpoint (its log.jsonl only), or one that diverged before it: not "train one
    first", which the run is doing, or which diverges again at its settings."""
    (tmp_path / 'log.jsonl').write_text('')
    if folder == 'diverged':
        (tmp_path / 'diverged.txt').write_text('the training loss became non-finite\n')
    code, err = in_process(sample.main, [f'--out_dir={tmp_path}', '--device=cpu'], capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"error: there is no checkpoint at {tmp_path / 'ckpt.pt'}; {hint}"]


@pytest.mark.parametrize('arg, example', [('--start', '--start=VALUE'), ('-x', '--out_dir=VALUE')])
def test_an_argument_without_its_value_is_shown_with_a_key_sample_has(arg, example, capsys):
    code, err = in_process(sample.main, [arg], capsys)  # not train.py's --n_layer, which sample.py does not take
    assert code == 2 and f"cannot read argument '{arg}'; write overrides as --key=value (e.g. {example})." in err


@pytest.mark.parametrize('code, cause', [('before an edit', 'it was trained with other code of activations.py or '
                                                             'model.py than they hold now; restore the code it was'),
                                         (None, 'it is damaged or not written by nanoFFN')])
def test_a_checkpoint_of_other_code_that_no_longer_loads_says_so(tiny_run, tmp_path, capsys, code, cause):
    """A learner who gave an activation a parameter after training: the old checkpoint no longer fits the GPT, and
    its code, not damage, is the likely cause (a checkpoint naming no code, or this code, is blamed as before)."""
    ckpt = torch.load(os.path.join(tiny_run, 'ckpt.pt'), weights_only=True)
    ckpt['model'] = {k: v for k, v in ckpt['model'].items() if not k.endswith('ln_f.weight')}  # as a parameter added
    ckpt['code'] = code
    torch.save(ckpt, tmp_path / 'ckpt.pt')
    status, err = in_process(sample.main, [f'--out_dir={tmp_path}', '--device=cpu'], capsys)
    assert status == 2 and 'Missing key(s)' in err and cause in err and len(err.strip().splitlines()) == 1


def test_a_checkpoint_of_other_code_that_still_loads_samples_with_a_note(tiny_run, tmp_path, capsys):
    """An edit that keeps the weights' shapes (a formula's constant, say): the model loads and samples, with the code
    as it is now, and stderr says so, as inspect_run.py and a resume do."""
    ckpt = torch.load(os.path.join(tiny_run, 'ckpt.pt'), weights_only=True)
    torch.save({**ckpt, 'code': 'before an edit'}, tmp_path / 'ckpt.pt')
    sample.main([f'--out_dir={tmp_path}', '--device=cpu', '--num_samples=1', '--max_new_tokens=4'])
    assert 'was trained with other code of activations.py or model.py than they hold now' in capsys.readouterr().err
