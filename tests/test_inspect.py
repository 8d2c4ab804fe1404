"""Tests of inspect_run.py: the drawn curves are the model's own (LA through its module, PolyNorm's per-token median
recomputed here with numpy), the histograms count the fixed batch's pre-activations, "moved from init" is exactly 0
before training and positive after, compare.py draws one row per variant, and a log without `act` still inspects.
One tiny comparison (gelu, la, polynorm x 2 seeds, 4 iterations) is trained once for the module, in this process:
compare.py then finds every run finished and only writes the report."""
import contextlib
import io
import glob
import json
import os
import shutil
import sys
from dataclasses import asdict

import numpy as np
import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import activations
import compare
import inspect_run
from comparison.acts import inspect
import train
from data.loader import DataLoader
from machinery.cli import run_cli
from machinery.device import usable_cores
from comparison.runs import to_argv
from model import GPT, GPTConfig


def grid_specs(cfg):
    """The specs of every run of a comparison's grid, as compare.py plans them."""
    return [r.spec for r in compare.grid_runs(cfg, compare.check_comparison(cfg))]


VARIANTS = ['gelu', 'la', 'polynorm']
TINY = ['--seed=1337', '--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=4', '--max_iters=4',
        '--lr_decay_iters=4', '--warmup_iters=1', '--learning_rate=1e-2', '--eval_interval=2', '--eval_iters=1',
        '--log_interval=1', '--device=cpu', '--compile=False', '--dtype=float32']


@pytest.fixture(scope='module')
def compared(shakespeare_char_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp('inspect') / 'cmp')
    argv = [f'--data_dir={shakespeare_char_dir}', f'--out_dir={out}', f'--variants={",".join(VARIANTS)}', '--seeds=2',
            '--lrs=', '--jobs=2', '--threads=1', *TINY]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for run in grid_specs(compare.settings(argv)):  # the very runs compare.py plans, trained here
            train.main(to_argv(run['settings']))
        compare.main(argv)
    return out


def acts(run_dir):
    with open(os.path.join(run_dir, 'acts.json')) as f:
        return json.load(f)


def load(run_dir):
    """The run's model and its first validation batch, read here without inspect_run."""
    ckpt = torch.load(os.path.join(run_dir, 'ckpt.pt'), weights_only=True)
    model = GPT(GPTConfig(**ckpt['model_args']))
    model.load_state_dict(ckpt['model'])
    cfg = ckpt['config']
    idx = DataLoader(cfg['dataset'], cfg['block_size'], cfg['batch_size'], 0, data_dir=cfg['data_dir']).val_batches(1)[0][0]
    return model.eval(), idx


def preactivations(model, idx):
    """h = W_up x per layer, x caught by this test's own hook on the FFN's forward."""
    xs = []
    hooks = [b.ffn.register_forward_hook(lambda m, args, out: xs.append(args[0])) for b in model.transformer.h]
    with torch.no_grad():
        model(idx)
        hs = [b.ffn.w_up(x.reshape(-1, x.shape[-1])) for b, x in zip(model.transformer.h, xs)]
    for h in hooks:
        h.remove()
    return hs


# ----------------------------------------------------------------------------------------------------------------------
# the curves are the model's own


def test_la_curve_is_the_module_forward(compared):
    run = os.path.join(compared, 'la', 'seed1337')
    model, _ = load(run)
    for block, layer in zip(model.transformer.h, acts(run)['layers']):
        b = layer['branches']['act']
        grid = torch.tensor(b['grid'], dtype=torch.float32)
        with torch.no_grad():
            assert block.ffn.act(grid).double().tolist() == b['median']  # exactly: the module's own forward
        assert b['band'] is None and not b['token_dependent']
        # la_init=onehot starts LA as GELU: the init curve is GELU itself
        np.testing.assert_allclose(b['init'], torch.nn.functional.gelu(grid).double().numpy(), rtol=0, atol=1e-7)
        alpha = block.ffn.act.alpha.detach()
        assert not torch.equal(alpha, torch.nn.functional.one_hot(torch.tensor(3), 6).float())  # it trained


def test_polynorm_median_recomputed(compared):
    """φ_t(g) = a_0 + Σ_i a_i g^i / sqrt(mean_j h_tj^(2i) + 1e-6) per token t, then the median and 10/90% over t."""
    run = os.path.join(compared, 'polynorm', 'seed1337')
    model, idx = load(run)
    for block, h, layer in zip(model.transformer.h, preactivations(model, idx), acts(run)['layers']):
        b = layer['branches']['act']
        a = block.ffn.act.coeffs.detach().double().numpy()
        g, hd = np.array(b['grid']), h.double().numpy()
        curves = a[0] + sum(a[i] * g[None, :] ** i / np.sqrt((hd ** (2 * i)).mean(1, keepdims=True) + 1e-6)
                            for i in range(1, len(a)))
        assert curves.shape == (idx.numel(), len(g))
        np.testing.assert_allclose(b['median'], np.median(curves, axis=0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b['band'], np.percentile(curves, [10, 90], axis=0), rtol=1e-5, atol=1e-6)
        init = 0 + sum(g[None, :] ** i / 3 / np.sqrt((hd ** (2 * i)).mean(1, keepdims=True) + 1e-6) for i in (1, 2, 3))
        np.testing.assert_allclose(b['init'], np.median(init, axis=0), rtol=1e-5, atol=1e-6)


def test_histogram_counts_the_batch(compared):
    for v in VARIANTS:
        run = os.path.join(compared, v, 'seed1337')
        model, idx = load(run)
        for h, layer in zip(preactivations(model, idx), acts(run)['layers']):
            b = layer['branches']['act']
            hv = h.double().numpy().ravel()
            assert b['counts'] == np.histogram(hv, np.array(b['edges']))[0].tolist()
            inside = ((hv >= b['edges'][0]) & (hv <= b['edges'][-1])).mean()
            assert 0.985 <= inside <= 0.995  # the 0.5-99.5 percentile range


# ----------------------------------------------------------------------------------------------------------------------
# moved from init


def untrained_run(run_dir, data_dir, **model_args):
    """A checkpoint at iteration 0, as train.py writes it: the freshly initialised GPT."""
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=65, **model_args)
    os.makedirs(run_dir)
    model, data = GPT(config), DataLoader('shakespeare_char', 32, 4, 1, data_dir=data_dir)
    train.write_checkpoint({'model': model.state_dict(), 'model_args': asdict(config), 'iter_num': 0,
                           'config': {'dataset': 'shakespeare_char', 'block_size': 32, 'batch_size': 4, 'seed': 1,
                                      'data_dir': data_dir, 'eval_iters': 2}, 'meta': data.meta,
                           'optimizer': model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu').state_dict(),
                           'best_val_loss': float('inf'), 'tokens': 0, 'train_time': 0.0, 'world_size': 1,
                           'rng': [train.rng_state('cpu')],
                           'loader': [data.state_dict()]},
                           os.path.join(run_dir, 'ckpt.pt'))
    return run_dir


def test_a_run_of_other_code_is_drawn_with_a_note_that_says_so(shakespeare_char_dir, tmp_path, capsys):
    """φ is drawn by the code as it is now: a run whose log names other code of activations.py or model.py says so."""
    from machinery import fingerprint, run_log
    for name, code in (('now', fingerprint.code_hash()), ('before', 'an older one')):
        run = untrained_run(str(tmp_path / name), shakespeare_char_dir, ffn='polynorm')
        run_log.append_log(os.path.join(run, 'log.jsonl'), {'iter': 0, 'tokens': 0, 'env': {'code': code}})
        run_cli(inspect_run.main, [f'--out_dir={run}'])
        err = capsys.readouterr().err
        assert ('trained with other code of activations.py or model.py than they hold now' in err) == (name == 'before')


def test_inspect_takes_its_cpu_threads_as_every_command_does(shakespeare_char_dir, tmp_path, capsys, monkeypatch):
    """--threads, else OMP_NUM_THREADS, else half the cores: torch's own thread per core crawls beside a busy process."""
    import torch
    run, threads = untrained_run(str(tmp_path / 'run'), shakespeare_char_dir, ffn='polynorm'), torch.get_num_threads()
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    try:
        for given, chosen in (('--threads=1', 1), ('--threads=0', max(1, usable_cores() // 2))):
            torch.set_num_threads(3)
            run_cli(inspect_run.main, [f'--out_dir={run}', given])
            assert torch.get_num_threads() == chosen
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(SystemExit) as e:
        run_cli(inspect_run.main, [f'--out_dir={run}', '--threads=-1'])
    assert e.value.code == 2 and capsys.readouterr().err == "error: --threads must not be negative, got -1.\n"


@pytest.mark.parametrize('model_args', [dict(ffn='la', la_init='mean'), dict(ffn='polynorm'), dict(ffn='moa_glu'),
                                        dict(ffn='xielu'), dict(ffn='moa', n_expert=4, top_k=2)])
def test_moved_is_zero_at_init(shakespeare_char_dir, tmp_path, model_args, capsys):
    report = inspect(untrained_run(str(tmp_path / 'run'), shakespeare_char_dir, **model_args))
    for layer in report['layers']:
        for b in layer['branches'].values():
            assert b['moved'] == 0.0 and b['median'] == b['init'] and b['learnable']
        if model_args.get('n_expert'):  # MoE: one row per (token, chosen expert) pair
            assert sum(layer['expert_tokens']) == 4 * 32 * 2
            assert sum(layer['branches']['act']['counts']) <= 4 * 32 * 2 * GPTConfig(**model_args).moe_hidden
        # a gate panel for each activation with per-token coefficients: MoA's, and both branches of moa_glu
        assert len(layer['gates']) == {'moa': 1, 'moa_glu': 2}.get(model_args['ffn'], 0)
        assert all(s == 0.0 for g in layer['gates'].values() for s in g['std'])  # MoA starts as LA: c_k(x) = α_k
        # the gates are a token's, shared by its experts: each token counted once, in an MoE too
        assert all(sum(g['entropy_counts']) == 4 * 32 for g in layer['gates'].values())
    if model_args.get('n_expert'):  # inspect_run says how evenly the router spread the tokens, layer by layer
        inspect_run.main([f"--out_dir={tmp_path / 'run'}"])
        out = capsys.readouterr().out
        assert all(f"tokens per expert {min(n)} to {max(n)} (mean 64)" in out
                   for n in (layer['expert_tokens'] for layer in report['layers']))


def test_moved_after_training(compared):
    summary = json.load(open(os.path.join(compared, 'summary.json')))
    for v in ('la', 'polynorm'):
        report = acts(os.path.join(compared, v, 'seed1337'))
        moved = [layer['branches']['act']['moved'] for layer in report['layers']]
        assert all(m > 0 for m in moved)
        assert [layer['act']['moved'] for layer in summary['acts'][v]['layers']] == moved
    assert not any(layer['act']['learnable'] for layer in summary['acts']['gelu']['layers'])


@pytest.mark.parametrize('kind', ['polyrelu', 'polynorm'])
def test_an_edit_of_polycoms_term_reaches_the_pictures_as_it_reaches_training(kind, monkeypatch):
    """A learner multiplies poly_formula's term by 3: the curves drawn follow the edit, because one line computes the
    term for training and for the pictures."""
    import inspect as source
    from comparison.acts import phi_curves
    code = source.getsource(activations.poly_formula)
    assert code.count('base**p') == 1  # the term, computed in one place
    act = activations.Poly(kind, 3)
    h, x = torch.randn(4, 16, dtype=torch.float64), torch.randn(4, 8)
    grid = torch.linspace(-2, 2, 9, dtype=torch.float64)
    with torch.no_grad():
        act.coeffs.copy_(torch.tensor([0.1, 0.5, -0.3, 0.2]))
        before = act.curves(grid, h, x)
        scope = dict(vars(activations))
        exec(code.replace('base**p', '3 * base**p'), scope)
        monkeypatch.setattr(activations, 'poly_formula', scope['poly_formula'])
        drawn = phi_curves(act, grid, h, x)  # checks the curves against the forward first
    assert not torch.allclose(drawn, before)  # the edit shows


class RowSoftmax(activations.Activation):
    """φ(h)_j = exp(h_j) / Σ_k exp(h_k): its value at a point depends on the token's other channels."""

    def forward(self, h, gates=None):
        return torch.softmax(h, -1)


class DrawnRowSoftmax(RowSoftmax):
    def curves(self, grid, h, x):  # φ_t(v) = exp(v) / Σ_k exp(h_tk), one row per token
        return torch.exp(grid)[None] / torch.exp(h).sum(-1, keepdim=True)


def test_an_activation_the_curves_would_draw_wrong_is_refused_in_one_sentence(shakespeare_char_dir, tmp_path,
                                                                              monkeypatch, capsys):
    for name, module in (('rowsoftmax', RowSoftmax), ('drawn_rowsoftmax', DrawnRowSoftmax)):
        monkeypatch.setitem(activations.VARIANTS, name, activations.Variant('mlp', lambda cfg, branch, m=module: m()))
    run = untrained_run(str(tmp_path / 'run'), shakespeare_char_dir, ffn='rowsoftmax')
    with pytest.raises(SystemExit) as e:
        run_cli(inspect_run.main, [f'--out_dir={run}'])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and 'cannot draw RowSoftmax' in err[0] and 'curves(' in err[0]
    assert not os.path.exists(os.path.join(run, 'acts.json'))
    # the same function with its per-token curves is drawn, one curve per token
    drawn = untrained_run(str(tmp_path / 'drawn'), shakespeare_char_dir, ffn='drawn_rowsoftmax')
    assert all(l['branches']['act']['token_dependent'] for l in inspect(drawn)['layers'])


# ----------------------------------------------------------------------------------------------------------------------
# the comparison's picture and summary


def test_compare_draws_one_row_per_variant(compared):
    with open(os.path.join(compared, 'acts.png'), 'rb') as f:
        png = f.read()
    assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 20_000
    rows = acts(compared)['variants']
    assert list(rows) == VARIANTS
    assert all(r['run'] == os.path.join(compared, v, 'seed1337') for v, r in rows.items())  # the first seed
    md = open(os.path.join(compared, 'summary.md')).read()
    assert '![learned activation functions](acts.png)' in md
    section = md.split('## What the activation functions became')[1].splitlines()
    moved_lines = {line.split('**')[1]: line for line in section if line.startswith('- **')}
    assert list(moved_lines) == ['la', 'polynorm']  # the learnable variants only
    for v, line in moved_lines.items():
        moved = rows[v]['layers'][0]['branches']['act']['moved']
        assert line.endswith(f'layer 0 act {moved:.3f} ({moved / rows[v]["layers"][0]["branches"]["act"]["init_rms"]:.0%})')


def test_a_report_over_runs_of_other_code_keeps_each_runs_own_pictures(compared, shakespeare_char_dir, tmp_path,
                                                                        capsys):
    """compare.py --report after an edit of the code draws the comparison's acts.png with the code as it is now (and
    says so), but a run's own acts.json and acts.png, drawn of the code it trained with, are not redrawn."""
    out = str(tmp_path / 'cmp')
    shutil.copytree(compared, out)
    for log_path in glob.glob(os.path.join(out, '*', 'seed*', 'log.jsonl')):  # as if trained before an edit
        lines = [json.loads(line) for line in open(log_path)]
        for r in lines:
            if 'env' in r:
                r['env']['code'] = 'before an edit'
        with open(log_path, 'w') as f:
            f.writelines(json.dumps(r) + '\n' for r in lines)
    own = os.path.join(out, 'polynorm', 'seed1337', 'acts.json')
    with open(own, 'w') as f:
        f.write('{"drawn": "of the code it trained with"}')
    argv = [f'--data_dir={shakespeare_char_dir}', f'--out_dir={out}', f'--variants={",".join(VARIANTS)}', '--seeds=2',
            '--lrs=', '--jobs=2', '--threads=1', *TINY, '--report=True']
    compare.main(argv)
    assert 'than they hold now' in capsys.readouterr().err
    assert open(own).read() == '{"drawn": "of the code it trained with"}'
    assert list(acts(out)['variants']) == VARIANTS  # the comparison's picture, of the code as it is


# ----------------------------------------------------------------------------------------------------------------------
# old logs and mistakes


def rewrite_log(run_dir, change):
    path = os.path.join(run_dir, 'log.jsonl')
    records = [json.loads(line) for line in open(path)]
    with open(path, 'w') as f:
        for r in records:
            f.write(json.dumps(change(r)) + '\n')
    return records


def test_the_history_is_the_logged_record_and_a_log_without_it_still_inspects(compared, tmp_path):
    run = str(tmp_path / 'run')
    shutil.copytree(os.path.join(compared, 'la', 'seed1337'), run)
    records = [json.loads(line) for line in open(os.path.join(run, 'log.jsonl'))]
    hist = acts(os.path.join(compared, 'la', 'seed1337'))['history']
    evals = [r for r in records if 'act' in r]
    assert hist['iters'] == [r['iter'] for r in evals] and len(evals) == 3
    assert hist['layers'][0]['act']['alpha gelu'] == [r['act']['layers'][0]['act']['alpha']['gelu'] for r in evals]
    # no act at all: the functions still come from the checkpoint
    rewrite_log(run, lambda r: {k: v for k, v in r.items() if k != 'act'})
    with contextlib.redirect_stdout(io.StringIO()):
        inspect_run.main([f'--out_dir={run}'])
    report = acts(run)
    assert report['history']['iters'] == [] and report['layers'][0]['branches']['act']['learnable']
    assert os.path.getsize(os.path.join(run, 'acts.png')) > 10_000


@pytest.mark.parametrize('folder', ['empty', 'started', 'comparison', 'comparison_started', 'missing', 'file',
                                    'diverged'])
def test_missing_checkpoint_is_one_line(tmp_path, capsys, folder):
    """An empty folder, a run started before its first checkpoint (its log.jsonl only), a comparison's folder (its runs
    below it), none at all, or a run that diverged before its first checkpoint: there is no checkpoint, and where a
    comparison keeps its runs, or one of them. A file (its checkpoint itself, say): its folder is the run's."""
    (tmp_path / 'file').write_text('')
    (tmp_path / 'empty').mkdir()
    (tmp_path / 'started').mkdir()
    (tmp_path / 'started' / 'log.jsonl').write_text('')
    (tmp_path / 'comparison' / 'gelu' / 'seed1340').mkdir(parents=True)
    (tmp_path / 'comparison' / 'gelu' / 'seed1340' / 'ckpt.pt').write_text('')
    (tmp_path / 'comparison_started' / 'gelu' / 'seed1340').mkdir(parents=True)  # its runs before their first
    (tmp_path / 'comparison_started' / 'gelu' / 'seed1340' / 'log.jsonl').write_text('')
    (tmp_path / 'diverged').mkdir()
    (tmp_path / 'diverged' / 'diverged.txt').write_text('the training loss became non-finite\n')
    with pytest.raises(SystemExit) as e:
        where = {'missing': 'nope'}.get(folder, folder)
        run_cli(inspect_run.main, [f'--out_dir={tmp_path / where}'])
    err = capsys.readouterr().err.strip().splitlines()
    if folder == 'file':
        assert e.value.code == 2 and err == [f"error: --out_dir={tmp_path / 'file'} is a file; give the run's "
                                             f"directory, e.g. {tmp_path}."]
        return
    assert e.value.code == 2 and len(err) == 1 and 'there is no checkpoint at' in err[0]
    if folder.startswith('comparison'):  # not "wait for that", nor "no run has started there": its runs below
        assert err[0].endswith(f"give one of them, e.g. --out_dir={tmp_path / folder / 'gelu' / 'seed1340'}.")
        return
    runs = " (a comparison's runs are its OUT/[SIZE/]VARIANT/[lrRATE/]seedN, SIZE a ladder's)."
    hint = {'missing': 'no such folder; give the --out_dir of a run' + runs,
            'empty': 'no run has started there; give the --out_dir of a run' + runs,
            'started': 'wait for that, or train it again if it was stopped before.',
            'diverged': 'the run diverged before its first (diverged.txt says why and what to change).',
            }[folder]
    assert err[0].endswith(hint)


def test_a_run_folder_it_cannot_write_in_is_told_to_be_copied(tmp_path, capsys, monkeypatch):
    """acts.png and acts.json go into the run's own folder, and there is no other: not "choose a folder you can write
    to", which no key of inspect_run.py does, but copy the run to one."""
    def refused(*args, **kwargs):
        raise PermissionError(13, 'Permission denied')
    monkeypatch.setattr('tempfile.TemporaryFile', refused)  # a read-only folder (a test run as root writes anywhere)
    with pytest.raises(SystemExit) as e:
        run_cli(inspect_run.main, [f'--out_dir={tmp_path}'])
    assert e.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [
        f"error: cannot write in {tmp_path} (Permission denied); inspect_run.py writes acts.png and acts.json into the "
        f"run's folder: copy the run to a folder you can write to, and give that as --out_dir."]


def test_a_comparisons_run_directory_that_is_a_file_names_no_out_dir(tmp_path):
    """A comparison's scan (no missing_hint) of a run directory that is a file: not "--out_dir=OUT/gelu/seed1 is a
    file; give OUT/gelu", a --out_dir the user never gave; the comparison says it cannot write there, as before."""
    from machinery.checkpoint import load_checkpoint
    (tmp_path / 'seed1').write_text('')
    assert load_checkpoint(str(tmp_path / 'seed1'), None) is None


def test_a_run_on_data_prepared_again_since_is_refused_in_one_sentence(shakespeare_char_dir, tmp_path, capsys):
    """φ drawn over other data than the run's (another tokenizer's ids would fail deep in the model): refused, as a
    comparison refuses to reuse the run, by its dataset's meta.json or by the validation windows its log names."""
    data = tmp_path / 'data'
    shutil.copytree(shakespeare_char_dir, data)
    run = untrained_run(str(tmp_path / 'run'), str(data), ffn='polynorm')
    windows = DataLoader('shakespeare_char', 32, 4, 1, data_dir=str(data)).val_hash(2)  # eval_iters=2, as it logs
    meta_path = data / 'shakespeare_char' / 'meta.json'
    meta = json.loads(meta_path.read_text())
    other = '0' * 64
    # the log's windows at the checkpoint's iteration (0) count; a later evaluation's (a resume with another
    # eval_iters, which saved no checkpoint) do not
    for logged, other_meta, refused in (([windows], False, False), ([other], False, True),
                                        ([windows, other], False, False), ([windows], True, True)):
        with open(os.path.join(run, 'log.jsonl'), 'w') as f:
            f.writelines(json.dumps({'iter': i, 'tokens': 0, 'val_hash': h}) + '\n' for i, h in enumerate(logged))
        if other_meta:  # another preparation's vocabulary
            meta_path.write_text(json.dumps({**meta, 'itos': meta['itos'][::-1]}))
        with pytest.raises(SystemExit) if refused else contextlib.nullcontext() as e:
            run_cli(inspect_run.main, [f'--out_dir={run}'])
        err = capsys.readouterr().err
        assert not refused or e.value.code == 2 and err.startswith(
            f"error: {data / 'shakespeare_char'} holds other data than {run} trained on (prepared again since?)")
