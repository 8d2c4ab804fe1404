"""Weights & Biases, an optional integration: a run's log.jsonl records, sent to wandb too (imported only when on)."""
import os

from machinery.cli import UserError, split_list


def start(cfg, out_dir):
    """A wandb run with every setting as its config, named after out_dir unless --wandb_run_name says otherwise. A
    resumed train.py starts a new wandb run of the same name and group, whose history begins at its checkpoint."""
    import wandb  # configurator.check imported it already, before anything was written
    try:
        return wandb.init(project=cfg['wandb_project'], group=cfg['wandb_group'] or None, config=cfg,
                          name=cfg['wandb_run_name'] or os.path.basename(os.path.abspath(out_dir)),
                          tags=split_list(cfg['wandb_tags']) or None)
    except Exception as e:
        raise UserError(f"wandb could not start a run ({type(e).__name__}: {e}); log in (wandb login), set "
                        f"WANDB_MODE=offline, or turn it off with --wandb_log=False.") from None


def fields(record, prefix=''):
    """A log record as wandb charts it: nested dicts and lists become '/'-joined keys of scalars."""
    out = {}
    for key, value in (record.items() if isinstance(record, dict) else enumerate(record)):
        if isinstance(value, (dict, list)):
            out.update(fields(value, f'{prefix}{key}/'))
        else:
            out[f'{prefix}{key}'] = value
    return out
