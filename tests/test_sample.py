"""Tests of sample.py: deterministic text of the requested length, decoded with the checkpoint's own tokenizer, from
a checkpoint that a *compiled* model wrote (torch.compile on CPU costs tens of seconds: one tiny 2-iteration run)."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_train import TINY, assert_ok, in_process, run  # noqa: E402

SEPARATOR = '\n---------------\n'


@pytest.fixture(scope='module')
def compiled_run(shakespeare_char_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp('compiled_run'))
    p = run('train.py', *TINY, '--compile=True', '--max_iters=2', '--eval_interval=2', '--eval_iters=1',
            f'--data_dir={shakespeare_char_dir}', f'--out_dir={out}')
    assert_ok(p)
    return out


def samples(out_dir, *args):
    p = run('sample.py', f'--out_dir={out_dir}', '--device=cpu', *args)
    assert_ok(p)
    assert p.stdout.endswith(SEPARATOR)
    return p.stdout[:-len(SEPARATOR)].split(SEPARATOR)


def test_sample_from_compiled_checkpoint_is_deterministic(compiled_run, tmp_path):
    ckpt = torch.load(os.path.join(compiled_run, 'ckpt.pt'), weights_only=True)
    assert ckpt['config']['compile'] is True
    assert not any(k.startswith('_orig_mod.') for k in ckpt['model'])  # loads into a plain GPT
    prompt = tmp_path / 'prompt.txt'
    prompt.write_text('ROMEO:')
    args = [f'--start=FILE:{prompt}', '--num_samples=2', '--max_new_tokens=40', '--seed=7', '--temperature=1.0']
    first = samples(compiled_run, *args)
    assert samples(compiled_run, *args) == first  # same seed, same text
    assert len(first) == 2
    for text in first:  # char tokenizer: one character per token
        assert text.startswith('ROMEO:') and len(text) == len('ROMEO:') + 40
        assert set(text) <= set(ckpt['meta']['itos'])


def test_sample_rejects_characters_outside_the_vocabulary(compiled_run, capsys):
    import sample
    code, err = in_process(sample.main, [f'--out_dir={compiled_run}', '--device=cpu', '--start=\u00e9t\u00e9'], capsys)
    assert code == 2 and 'vocabulary' in err and len(err.strip().splitlines()) == 1
