"""
Sample from a model trained by train.py, decoding with the checkpoint's own tokenizer (char or gpt2).

    python sample.py --out_dir=out-shakespeare-char
    python sample.py --out_dir=out-shakespeare-char --start="ROMEO:" --num_samples=3 --max_new_tokens=200
    python sample.py --out_dir=out-owt --start=FILE:prompt.txt --temperature=0.8 --top_k=200

Each sample is printed as the prompt followed by max_new_tokens generated tokens, then a line of dashes.
Status messages go to stderr, so stdout holds only the samples.
"""
from machinery.cli import quiet_interrupt  # first of all: a Ctrl-C while torch imports ends as quietly as one later
quiet_interrupt(__name__)
import os
import sys

import torch

from data.tokenizer import get_tokenizer
from machinery import device
from machinery.checkpoint import CKPT, RUN_DIRS, checkpoint_model, load_checkpoint, loading
from machinery.cli import UserError, parse_args, read_text, run_cli
from machinery.fingerprint import OTHER_CODE, code_hash
from model import GPT, GPTConfig

DEFAULTS = dict(
    out_dir='out',  # the run directory holding ckpt.pt
    start='\n',  # the prompt, or FILE:path to read it from a file
    num_samples=3,
    max_new_tokens=500,
    temperature=0.8,  # 1.0 = the model's distribution, lower = more conservative, 0 = greedy
    top_k=200,  # keep only the top_k most likely tokens; 0 = no limit
    seed=1337,
    device='auto',  # 'auto' (cuda, then mps, then cpu) | 'cpu' | 'cuda' | 'cuda:N' | 'mps'
    dtype='auto',  # auto: bfloat16 on GPUs of compute capability 8.0+, float16 below, float32 elsewhere
    threads=0,  # torch's CPU threads; 0 = OMP_NUM_THREADS where set, else half the cores
)
SEPARATOR = '---------------'


def check(cfg):
    if cfg['num_samples'] < 1 or min(cfg['max_new_tokens'], cfg['top_k'], cfg['threads']) < 0:
        raise UserError("--num_samples must be at least 1, and --max_new_tokens, --top_k and --threads not negative.")
    # 0 is greedy; far below 1e-3 the logits / temperature overflow float32 (and NaN is no temperature at all)
    if not (cfg['temperature'] == 0 or 1e-3 <= cfg['temperature'] < float('inf')):
        raise UserError(f"--temperature must be 0 (greedy) or a finite number of at least 0.001, got "
                        f"{cfg['temperature']}.")
    if cfg['seed'] < 0:  # an int is below 2**63 already (cli.INT_RANGE)
        raise UserError(f"--seed must be between 0 and 2**63 - 1, got {cfg['seed']}.")


def main(argv):
    cfg, _ = parse_args(DEFAULTS, argv, prog='sample.py', doc=__doc__.split('\n\n')[1], notes=[__file__])
    check(cfg)
    checkpoint = load_checkpoint(cfg['out_dir'], "train one first (python train.py config/shakespeare_char.py) or "
                                                 f"point --out_dir at a run's directory ({RUN_DIRS}).")
    ckpt_path = os.path.join(cfg['out_dir'], CKPT)
    where, dtype = device.use(cfg['device'], cfg['dtype'])  # the dtype is the chosen GPU's, not the current one's
    threads = device.set_threads(cfg['threads'])
    torch.manual_seed(cfg['seed'])

    model = checkpoint_model(checkpoint, ckpt_path, lambda args: GPT(GPTConfig(**args))).eval().to(where)
    if checkpoint.get('code') not in (None, code_hash()):  # it loads, but runs the code as it is now
        print(f"note: {ckpt_path} was trained with {OTHER_CODE}; it samples with the code as it is now.",
              file=sys.stderr)

    with loading(ckpt_path):
        tok, iter_num = get_tokenizer(checkpoint['meta']), checkpoint['iter_num']
    # a model trained with --vocab_size above its tokenizer's has ids that decode to nothing; the loader keeps them out
    # of the training data, so they are never sampled either
    model.config.vocab_size = min(model.config.vocab_size, tok.vocab_size)
    start = cfg['start']
    if start.startswith('FILE:'):
        start = read_text(start[len('FILE:'):], '--start=FILE: prompt file', 'prompt.txt')
    try:
        start_ids = tok.encode(start)
    except UserError as e:  # the default prompt too, where the text holds no newline
        raise UserError(f"{e}; give a --start prompt of those characters (the default is a newline).") from None
    if not start_ids:
        raise UserError("the prompt is empty; give at least one character with --start (the default is a newline).")
    x = torch.tensor(start_ids, dtype=torch.long, device=where)[None, ...]
    print(f"sampling {cfg['num_samples']} x {cfg['max_new_tokens']} tokens from {ckpt_path} "
          f"(iteration {iter_num}, {checkpoint['meta'].get('tokenizer')} tokenizer) on {where}, {dtype}, {threads}",
          file=sys.stderr)

    with torch.no_grad(), device.autocast(where.split(':')[0], dtype):
        for _ in range(cfg['num_samples']):
            y = model.generate(x, cfg['max_new_tokens'], temperature=cfg['temperature'], top_k=cfg['top_k'] or None)
            print(tok.decode(y[0].tolist()))
            print(SEPARATOR)


if __name__ == '__main__':
    run_cli(main)
