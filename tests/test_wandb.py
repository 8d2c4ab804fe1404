"""wandb logging, tested for real in wandb's offline mode (no network): train.py and compare.py run with
--wandb_log=True, WANDB_MODE=offline and WANDB_DIR in a temporary folder, and the test reads the offline run's
transaction log (run-<id>.wandb) back and finds every field of log.jsonl in its history, at the same iteration.

The transaction log is wandb's record file: a 7-byte header (':W&B', magic 0xBEE1, version 0), then LevelDB-log
framing (32 KiB blocks; each chunk has a 7-byte header: crc32, length, type FULL=1/FIRST=2/MIDDLE=3/LAST=4), each
record a serialized wandb.proto.wandb_internal_pb2.Record. wandb no longer ships a Python reader for it, so this
file reads the framing itself and lets wandb's own protobuf classes decode the records."""
import glob
import json
import os
import struct
import subprocess
import sys

import importlib.util

import pytest

HAVE_WANDB = importlib.util.find_spec('wandb') is not None
needs_wandb = pytest.mark.skipif(not HAVE_WANDB, reason='wandb is not installed (pip install wandb), so its logging '
                                                        'cannot be tested')
if HAVE_WANDB:
    from wandb.proto import wandb_internal_pb2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ['--seed=1337', '--device=cpu', '--dtype=float32', '--compile=False', '--n_layer=1', '--n_head=2', '--n_embd=32',
        '--block_size=32', '--batch_size=4', '--eval_iters=2', '--log_interval=1', '--eval_interval=2',
        '--max_iters=4', '--warmup_iters=1', '--lr_decay_iters=4']
HEADER = b':W&B' + struct.pack('<HB', 0xBEE1, 0)
BLOCK, CHUNK_HEADER = 32768, 7
FULL, LAST = 1, 4


def records(path):
    """The records of a .wandb transaction log, in order."""
    with open(path, 'rb') as f:
        data = f.read()
    assert data[:len(HEADER)] == HEADER, f"{path} does not start with wandb's header"
    pos, payload = len(HEADER), b''
    while pos + CHUNK_HEADER <= len(data):
        if BLOCK - pos % BLOCK < CHUNK_HEADER:  # too little room left in the block for a chunk: zero padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack('<IHB', data[pos:pos + CHUNK_HEADER])
        payload += data[pos + CHUNK_HEADER:pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            yield record
            payload = b''


def offline_run(path):
    """(run record, {step: {key: value}}) of one offline run's .wandb file."""
    run, history = None, {}
    for r in records(path):
        kind = r.WhichOneof('record_type')
        if kind == 'run':
            run = r.run
        elif kind == 'history':
            row = {item.key or '/'.join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            history[row['_step']] = row
    return run, history


def offline_runs(wandb_dir):
    paths = glob.glob(os.path.join(wandb_dir, 'wandb', 'offline-run-*', 'run-*.wandb'))
    return [offline_run(p) for p in paths]


def run_script(argv, wandb_dir):
    env = {**os.environ, 'WANDB_MODE': 'offline', 'WANDB_DIR': str(wandb_dir), 'WANDB_SILENT': 'true',
           'OMP_NUM_THREADS': '1'}
    env.pop('WANDB_API_KEY', None)
    p = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]


def read_log(out_dir):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [json.loads(line) for line in f]


def flat(value, prefix=''):
    """{'act': {'layers': [{'x': 1}]}} -> {'act/layers/0/x': 1}: how wandb shows a nested record."""
    if isinstance(value, (dict, list)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        return {k: v for key, item in items for k, v in flat(item, f'{prefix}{key}/').items()}
    return {prefix[:-1]: value}


def assert_history_holds_log(history, log):
    """Every log.jsonl line is a history row at step = its iteration, with every field and value: scalars under their
    own key, nested values (act, val_halves) under '/'-joined keys."""
    assert sorted(history) == [r['iter'] for r in log]
    for record in log:
        row = history[record['iter']]
        for key, value in flat(record).items():
            assert row[key] == value, (record['iter'], key, row.get(key), value)
    assert any('act' in r for r in log) and any('val_loss' in r for r in log)  # the test saw what it checks
    assert any(k.startswith('act/layers/0/act/coeffs/') for r in log for k in flat(r))


@pytest.mark.slow
@needs_wandb
def test_train_logs_every_field_of_log_jsonl(shakespeare_char_dir, tmp_path):
    out_dir = tmp_path / 'pn'
    run_script(['train.py', *TINY, '--ffn=polynorm', f'--data_dir={shakespeare_char_dir}', f'--out_dir={out_dir}',
                '--wandb_log=True', '--wandb_project=nanoffn-test'], tmp_path)
    (run, history), = offline_runs(tmp_path)
    assert run.project == 'nanoffn-test' and run.display_name == 'pn'  # the run name defaults to the out_dir's name
    assert_history_holds_log(history, read_log(out_dir))


@pytest.mark.slow
@needs_wandb
def test_compare_groups_a_comparison_and_tags_variant_and_seed(shakespeare_char_dir, tmp_path):
    out_dir = tmp_path / 'cmp'
    run_script(['compare.py', *TINY, f'--data_dir={shakespeare_char_dir}', f'--out_dir={out_dir}',
                '--variants=gelu,polynorm', '--seeds=1', '--lrs=', '--jobs=2', '--threads=1', '--wandb_log=True',
                '--wandb_tags=tiny'], tmp_path)
    runs = {run.display_name: (run, history) for run, history in offline_runs(tmp_path)}
    assert sorted(runs) == ['gelu-seed1337', 'polynorm-seed1337']
    for variant in ('gelu', 'polynorm'):
        run, history = runs[f'{variant}-seed1337']
        assert run.run_group == 'cmp'  # one group per comparison: the out_dir's name
        assert sorted(run.tags) == sorted(['tiny', variant, 'seed1337'])
        log = read_log(out_dir / variant / 'seed1337')
        if variant == 'gelu':  # a fixed activation learns nothing: no 'act' field to find
            assert sorted(history) == [r['iter'] for r in log]
            assert all(history[r['iter']][k] == v for r in log for k, v in flat(r).items())
        else:
            assert_history_holds_log(history, log)


def test_wandb_log_without_wandb_is_refused_before_anything_is_written(monkeypatch):
    """A wandb that cannot be imported (missing, or broken) is refused by the settings check, before a run replaces
    anything; with --wandb_log off it is never imported."""
    from machinery import cli
    import configurator
    monkeypatch.setitem(sys.modules, 'wandb', None)  # `import wandb` now raises ImportError
    with pytest.raises(cli.UserError, match='needs the wandb package, which cannot be imported'):
        configurator.check({**configurator.DEFAULTS, 'wandb_log': True})
    configurator.check({**configurator.DEFAULTS, 'wandb_log': False})
