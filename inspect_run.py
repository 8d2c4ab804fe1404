"""
What each activation became: the learned functions of one run, drawn over the inputs they actually see.

    python inspect_run.py --out_dir=out-pn                       # any train.py run directory (ckpt.pt, log.jsonl)
    python inspect_run.py --out_dir=out-compare-shakespeare-char/la/lr0.008/seed1340  # one run of a comparison
    python inspect_run.py --out_dir=RUN --data_dir=/elsewhere    # the dataset was moved since the run trained

Writes RUN/acts.png, one row per layer, and its numbers in RUN/acts.json: the learned φ (solid) against its init
(dashed) over the 0.5-99.5% range of the layer's pre-activations h, their histogram behind, for each branch of a GLU;
what each part logged over training (log.jsonl's `act`); MoA's c_k(x) over tokens; an MoE's tokens per expert.

How it is computed and drawn: comparison/acts.py.
"""
from machinery.cli import quiet_interrupt  # first of all: a Ctrl-C while torch imports ends as quietly as one later
quiet_interrupt(__name__)
import os
import sys

from comparison.acts import inspect, short_label, write
from comparison.runs import codes_of
from machinery.cli import parse_args, run_cli
from machinery.device import resolve_device, set_threads
from machinery.files import check_writable
from machinery.fingerprint import OTHER_CODE, code_hash
from machinery.run_log import LOG, read_log_lines

DEFAULTS = dict(
    out_dir='out',  # the run directory: ckpt.pt, log.jsonl; acts.png and acts.json are written there
    data_dir='',  # where the run's dataset is prepared; '' = the data_dir the run was trained with
    bins=100,  # histogram bins over the 0.5-99.5% range of h; their centres are the grid φ is evaluated on
    device='cpu',  # the one forward pass is small; 'auto' picks a GPU
    threads=0,  # torch's CPU threads; 0 = OMP_NUM_THREADS where set, else half the cores
)


def main(argv):
    cfg, _ = parse_args(DEFAULTS, argv, prog='inspect_run.py', doc=__doc__.split('\n\n')[1], notes=[__file__])
    if os.path.isdir(cfg['out_dir']):  # no folder: no checkpoint, which inspect says
        check_writable(cfg['out_dir'], advice="inspect_run.py writes acts.png and acts.json into the run's folder: "
                       "copy the run to a folder you can write to, and give that as --out_dir")  # before the work
    set_threads(cfg['threads'])  # before anything is drawn; torch's own thread per core crawls beside a busy process
    report = inspect(cfg['out_dir'], cfg['data_dir'], cfg['bins'], resolve_device(cfg['device']))
    if codes_of(read_log_lines(os.path.join(cfg['out_dir'], LOG))[0]) - {code_hash(), None}:  # drawn all the same
        print(f"note: {cfg['out_dir']} trained with {OTHER_CODE}; its φ is drawn with the code as it is now.",
              file=sys.stderr)
    if report['damaged_lines']:
        print(f"warning: {report['damaged_lines']} damaged line(s) of {cfg['out_dir']}/log.jsonl set aside.",
              file=sys.stderr)
    write(cfg['out_dir'], report)
    for i, layer in enumerate(report['layers']):
        moved = ', '.join(f"{short_label(n, layer['branches'])} {b['moved']:.4f} (init rms {b['init_rms']:.3f})"
                          for n, b in layer['branches'].items() if b['learnable'])
        load = layer.get('expert_tokens')  # an MoE's: how evenly its router spread the tokens
        print(f"layer {i}: moved from init: {moved or '– (fixed activation)'}"
              + (f"; tokens per expert {min(load)} to {max(load)} (mean {sum(load) / len(load):.0f})" if load else ''))
    print(f"wrote {cfg['out_dir']}/acts.png and acts.json")


if __name__ == '__main__':
    run_cli(main)
