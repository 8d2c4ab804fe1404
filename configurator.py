"""
Settings: every key a training run takes, with its default and type, and how a command line sets them.

    python train.py [config/FILE.py ...] [--key=value ...]

A config file is plain Python, exec'd with the current settings in scope (so it may write `lr_decay_iters =
max_iters`); every public name it assigns must be a known key (names starting with '_' are its own helpers). Then each
--key=value override is applied in order. A value must have the type of the key's default: an int key takes 12 or 1e4
but not 3.5 (never silently truncated), a float key 3 or 6e-4, a bool key True/False (--key alone means True), a str
key the text as written. A key whose default is None means "auto" and also takes the word auto.

A mistake raises UserError with one sentence; run_cli(main) prints it on stderr and exits with status 2, no traceback.
A run that has to stop raises RunStopped (exit status 3); Ctrl-C exits with 130.
"""
import ast
import dataclasses
import difflib
import math
import os
import sys
import textwrap
from dataclasses import dataclass

from activations import VARIANTS, check_variant, make_activations


class UserError(Exception):
    """A mistake the user can fix: the CLI prints its one-sentence message and exits with status 2."""


class RunStopped(Exception):
    """A run that had to stop (e.g. a non-finite loss, a full disk): message on stderr, exit status 3."""


# ----------------------------------------------------------------------------------------------------------------------
# The model's keys (model.py builds a GPT from them)


@dataclass
class GPTConfig:
    block_size: int = 256
    vocab_size: int = 50257  # the real vocabulary; embeddings are padded to a multiple of 64 for fast matmuls
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    dropout: float = 0.0
    bias: bool = False
    norm: str = "rmsnorm"  # rmsnorm | layernorm
    pos: str = "rope"  # rope | learned
    # feed-forward
    ffn: str = "gelu"  # a name of activations.VARIANTS
    ffn_mult: float = 4.0  # non-gated hidden width m = ffn_mult·d; gated variants use ≈ 2/3 of it (same weights)
    poly_order: int = 3  # r of PolyReLU / PolyNorm (2–4)
    act_dict: str = "identity,relu,relu2,gelu,silu,tanh"  # LA / MoA dictionary
    la_init: str = "onehot"  # onehot (as the baseline: gelu, swiglu) | mean | sum | onehot:NAME ('A/B': gate/up)
    moa_gate: str = "sigmoid"  # sigmoid | softmax | tanh
    # toy mixture of experts (n_expert = 0: dense)
    n_expert: int = 0
    top_k: int = 2
    moe_every: int = 1  # MoE in blocks 0, moe_every, 2·moe_every, …
    expert_hidden: int = 0  # 0: the dense width / top_k, so active FFN weights match the dense model
    aux_loss_weight: float = 0.01
    z_loss_weight: float = 0.001

    def __post_init__(self):
        check_variant(self.ffn)
        if self.norm not in ("rmsnorm", "layernorm") or self.pos not in ("rope", "learned"):
            raise ValueError("norm must be rmsnorm or layernorm, pos must be rope or learned")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.pos == "rope" and (self.n_embd // self.n_head) % 2:  # RoPE rotates channel pairs (i, i + head/2)
            raise ValueError(f"RoPE needs an even head size, but n_embd/n_head = {self.n_embd}/{self.n_head} = "
                             f"{self.n_embd // self.n_head}; change n_embd or n_head, or use pos=learned")
        if not (self.ffn_mult > 0 and math.isfinite(self.ffn_mult)) or int(self.ffn_mult * self.n_embd) < 1:
            raise ValueError(f"ffn_mult={self.ffn_mult} must be positive and give an FFN at least 1 unit wide")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1)")
        if self.n_expert < 0 or self.moe_every < 1 or self.expert_hidden < 0:
            raise ValueError("n_expert and expert_hidden must be >= 0 and moe_every >= 1")
        if self.n_expert and not 1 <= self.top_k <= self.n_expert:
            raise ValueError(f"top_k={self.top_k} must be between 1 and n_expert={self.n_expert}")

    @property
    def padded_vocab_size(self):
        return (self.vocab_size + 63) // 64 * 64

    @property
    def ffn_hidden(self):
        """m for the dense FFN: ffn_mult·d, or round(2/3·ffn_mult·d) for gated variants (3·d·m ≈ 2·d·ffn_mult·d)."""
        m = int(self.ffn_mult * self.n_embd)
        return round(2 * m / 3) if VARIANTS[self.ffn].gated else m

    @property
    def moe_hidden(self):
        """Expert width: expert_hidden, or the dense width / top_k rounded to a multiple of 8 (grouped_mm alignment)."""
        return self.expert_hidden or max(8, round(self.ffn_hidden / self.top_k / 8) * 8)


# ----------------------------------------------------------------------------------------------------------------------
# Training keys

TRAIN_DEFAULTS = dict(
    # I/O
    out_dir='out',
    init_from='scratch',  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
    overwrite=False,  # allow a scratch run to replace an existing out_dir/ckpt.pt
    always_save_checkpoint=True,  # if False, only save when val loss improves
    eval_interval=250,  # iterations between evaluations (+ checkpoints); the last iteration is always evaluated
    eval_iters=20,  # validation batches per evaluation (fixed windows: the same tokens for every run)
    log_interval=10,  # iterations between log lines
    # data
    dataset='shakespeare_char',
    data_dir='data',  # prepared datasets live in data_dir/dataset/ (train_*.bin, val_*.bin, meta.json)
    batch_size=12,  # per micro-step, per process
    gradient_accumulation_steps=1,  # per process
    # AdamW
    learning_rate=6e-4,
    max_iters=5000,
    weight_decay=1e-1,
    beta1=0.9,
    beta2=0.95,
    grad_clip=1.0,  # clip gradients at this norm, 0 disables
    # learning-rate schedule
    schedule='cosine',  # 'cosine' | 'wsd' (warmup-stable-decay) | 'constant' (after warmup)
    warmup_iters=100,
    lr_decay_iters=0,  # where the schedule reaches min_lr; 0 means max_iters
    decay_frac=0.2,  # wsd: linear decay over this last fraction of lr_decay_iters
    min_lr=6e-5,
    # system
    device='auto',  # 'auto' (cuda, then mps, then cpu) | 'cpu' | 'cuda' | 'cuda:N' | 'mps'
    dtype='auto',  # 'auto' (bfloat16 where supported, else float32) | 'float32' | 'bfloat16' | 'float16'
    compile=None,  # None = auto: on for CUDA, off elsewhere (--compile=True compiles on a CPU too)
    compile_mode='regional',  # 'regional' (each Block compiled; one graph serves every layer) | 'whole' (the GPT)
    peak_flops=0.0,  # FLOP/s for MFU; 0 = from the GPU's name (H100/H200 989e12, A100 312e12), else MFU is null
    seed=1337,
    # Weights & Biases (nanoGPT's keys; wandb is imported only when wandb_log is on)
    wandb_log=False,  # log every log.jsonl record to wandb too (WANDB_MODE=offline works without network)
    wandb_project='nanoffn',
    wandb_run_name='',  # '' = the out_dir's name
    wandb_group='',  # runs that belong together (compare.py sets one per comparison)
    wandb_tags='',  # comma-separated
)
MODEL_KEYS = [f.name for f in dataclasses.fields(GPTConfig)]
# every field of GPTConfig is a key too; vocab_size 0 = the dataset's vocabulary (meta.json)
DEFAULTS = {**TRAIN_DEFAULTS, **{f.name: f.default for f in dataclasses.fields(GPTConfig)}, 'vocab_size': 0}
TYPES = {'compile': bool}  # keys whose default (None = auto) does not tell their type
STREAM_KEYS = ['dataset', 'batch_size', 'block_size', 'seed']  # what fixes the training batches: a resume keeps them
MAX_SEED = 2**31 - 1  # numpy seeds take 32 bits; DDP ranks add their rank to the seed


def check_variants(text):
    """The FFN variants named in a comma-separated setting (e.g. --variants), each checked by check_variant."""
    names = split_list(text)
    if not names:
        raise UserError(f"no variant named; give comma-separated names of: {', '.join(VARIANTS)}.")
    for name in names:
        try:
            check_variant(name)
        except ValueError as e:
            raise UserError(f"{e}.") from None
    if len(set(names)) < len(names):
        raise UserError(f"'{text}' names a variant twice; list each once.")
    return names


def model_config(settings):
    """The GPTConfig of a run's settings (a dict with every model key), or the UserError of its first bad value."""
    try:
        return GPTConfig(**{k: settings[k] for k in MODEL_KEYS})
    except ValueError as e:
        raise UserError(f"{str(e).rstrip('.')}.") from None


def check(cfg):
    """Catch the mistakes a run's settings can make, before anything is built or written."""
    for key, choices in (('init_from', ('scratch', 'resume')), ('schedule', ('cosine', 'wsd', 'constant')),
                         ('compile_mode', ('regional', 'whole'))):
        if cfg[key] not in choices:
            raise UserError(f"--{key} expects {' or '.join(choices)}, got '{cfg[key]}'.")
    if not cfg['out_dir'].strip():
        raise UserError("--out_dir is empty; give the run's directory, e.g. --out_dir=out-gelu.")
    if os.path.exists(cfg['out_dir']) and not os.path.isdir(cfg['out_dir']):
        raise UserError(f"--out_dir={cfg['out_dir']} is a file, not a directory; choose another --out_dir.")
    for key in ('batch_size', 'block_size', 'gradient_accumulation_steps', 'eval_interval', 'eval_iters',
                'log_interval', 'n_layer', 'n_head', 'n_embd'):
        if cfg[key] < 1:
            raise UserError(f"--{key} must be at least 1, got {cfg[key]}.")
    for key in ('max_iters', 'warmup_iters', 'lr_decay_iters'):
        if cfg[key] < 0:
            raise UserError(f"--{key} must not be negative, got {cfg[key]}.")
    if not 0.0 <= cfg['decay_frac'] <= 1.0:
        raise UserError(f"--decay_frac must be between 0 and 1, got {cfg['decay_frac']}.")
    for key in ('learning_rate', 'min_lr', 'weight_decay', 'grad_clip', 'peak_flops'):
        if not (math.isfinite(cfg[key]) and cfg[key] >= 0):  # `not >=` also catches NaN
            raise UserError(f"--{key} must be a finite number >= 0, got {cfg[key]}.")
    for key in ('beta1', 'beta2'):  # AdamW's moment decay rates (Loshchilov & Hutter 2019) lie in [0, 1)
        if not 0.0 <= cfg[key] < 1.0:
            raise UserError(f"--{key} must be in [0, 1), got {cfg[key]}.")
    if not 0 <= cfg['seed'] <= MAX_SEED:
        raise UserError(f"--seed must be between 0 and {MAX_SEED}, got {cfg['seed']}.")
    try:  # the activation's settings (poly_order, act_dict, la_init, moa_gate) are checked as it is built
        make_activations(model_config(cfg))
    except ValueError as e:
        raise UserError(f"{str(e).rstrip('.')}.") from None
    if cfg['wandb_log']:  # imported now, before a run replaces anything, and only when asked for
        try:
            import wandb  # noqa: F401
        except Exception as e:
            raise UserError(f"--wandb_log=True needs the wandb package, which cannot be imported here "
                            f"({type(e).__name__}: {e}); pip install wandb, or drop --wandb_log.") from None


# ----------------------------------------------------------------------------------------------------------------------
# The command line

_TYPE_NAMES = {bool: 'a bool (True/False)', int: 'an int', float: 'a float', str: 'a string'}


def coerce(key, value, want, default, where):
    """Return `value` (a Python object) as type `want`, or raise UserError."""
    if default is None and (value is None or str(value).strip().lower() == 'auto'):  # a config file's 'auto' too
        return None
    if want is bool and isinstance(value, str) and value.lower() in ('true', 'false', '1', '0'):
        return value.lower() in ('true', '1')
    if want is bool and isinstance(value, int) and value in (0, 1):  # True, False, 1 or 0
        return bool(value)
    if want is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if want is int and isinstance(value, float) and value.is_integer():  # 1e4 is an int-valued float: fine
        return int(value)
    if want is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if want is str and isinstance(value, str):
        return value
    shown = value if isinstance(value, str) else repr(value)
    raise UserError(f"{where}{key} expects {_TYPE_NAMES.get(want, want.__name__)} (default "
                    f"{'auto' if default is None else repr(default)}), got '{shown}'.")


def _unknown_key(key, valid, where):
    close = difflib.get_close_matches(key, valid, n=2, cutoff=0.75)
    if close:
        return UserError(f"{where}unknown config key '{key}' (did you mean {' or '.join(repr(c) for c in close)}?); "
                         f"run with --help to list all {len(valid)} keys.")
    return UserError(f"{where}unknown config key '{key}'; valid keys: {', '.join(sorted(valid))}.")


def _parse_literal(text, want, default):
    """The text of --key=value as a Python object: a literal, or the raw text for string keys."""
    if default is None and text.strip().lower() in ('auto', 'none'):
        return None
    if want is str:
        return text[1:-1] if len(text) >= 2 and text[0] == text[-1] and text[0] in '"\'' else text
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # coerce() reports it with the expected type


def read_text(path, what, example):
    """A UTF-8 text file the user named (a config file, a prompt), or the UserError that says what is wrong with it."""
    if not os.path.isfile(path):
        raise UserError(f"{what} '{path}' not found; give a path such as {example}.")
    try:
        with open(path, encoding='utf-8') as f:
            return f.read()
    except UnicodeDecodeError:
        raise UserError(f"{what} '{path}' is not UTF-8 text; save it as UTF-8.") from None
    except OSError as e:
        raise UserError(f"{what} '{path}' cannot be read ({e.strerror}).") from None


def _run_config_file(path, config, defaults, types, given):
    source = read_text(path, 'config file', 'config/shakespeare_char.py')
    scope = {**config, '__builtins__': __builtins__}
    try:
        exec(compile(source, path, 'exec'), scope)
    except SystemExit as e:  # the file stopped the command on purpose: its message is the sentence
        said = e.code if isinstance(e.code, str) else f'exit status {e.code or 0}'
        raise UserError(f"config file '{path}' called sys.exit ({said}), so nothing was run.") from None
    except Exception as e:
        raise UserError(f"config file '{path}' failed to run ({type(e).__name__}: {e}); fix the file.") from None
    # names the file assigns at its top level, so that a value equal to the default still counts as chosen
    assigns = [node for node in ast.parse(source).body if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))]
    targets = [t for node in assigns for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
    assigned = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    for key, value in scope.items():
        if key.startswith('_') or callable(value) or type(value).__name__ == 'module':
            continue
        if key not in defaults:
            raise _unknown_key(key, list(defaults), f"{path}: ")
        if key in assigned or value is not config[key]:
            config[key] = coerce(key, value, types.get(key, type(defaults[key])), defaults[key], f"{path}: ")
            given.add(key)


def format_help(prog, config, doc=''):
    """--help: the usage line, the script's own words, and every key with the value it has now."""
    lines = [f"usage: python {prog} [config/FILE.py ...] [--key=value ...]"]
    if doc:
        lines.append(textwrap.indent(textwrap.dedent(doc).strip('\n'), '  '))
    lines.append('keys (value after the config files given before --help):')
    width = max(len(k) for k in config)
    lines += [f"  --{k.ljust(width)} {'auto' if config[k] is None else repr(config[k])}" for k in sorted(config)]
    return '\n'.join(lines)


def parse_args(defaults, argv, types=None, prog='train.py', doc=''):
    """Apply config files and --key=value overrides from argv to a copy of `defaults`. Returns (config, given): the
    settings and the set of keys set explicitly (by a config file or an override), so that e.g. a resumed run can
    tell the user's choices from plain defaults."""
    config, given, types = dict(defaults), set(), types or {}
    for arg in argv:
        if arg in ('-h', '--help'):
            print(format_help(prog, config, doc))
            sys.exit(0)
        if not arg.startswith('-'):
            _run_config_file(arg, config, defaults, types, given)
            continue
        key, equals, text = arg[2:].partition('=')
        key = key if key in defaults else key.replace('-', '_')
        want = types.get(key, type(defaults.get(key)))
        if arg.startswith('--') and not equals and want is bool:
            equals, text = '=', 'True'  # a bool key alone switches it on: --plan means --plan=True
        if not arg.startswith('--') or not equals:
            raise UserError(f"cannot read argument '{arg}'; write overrides as --key=value (e.g. --n_layer=4).")
        if key not in defaults:
            raise _unknown_key(key, list(defaults), '')
        config[key] = coerce(key, _parse_literal(text, want, defaults[key]), want, defaults[key], '--')
        given.add(key)
    return config, given


def to_argv(settings):
    """Settings as --key=value arguments that parse_args reads back as the same values: the one way a settings dict
    becomes a command line."""
    text = lambda v: 'auto' if v is None else v if isinstance(v, str) else repr(v)
    return [f'--{k}={text(v)}' for k, v in settings.items()]


def split_list(text):
    """'a, b,,c' -> ['a', 'b', 'c']: every comma-separated setting is read this way."""
    return [part.strip() for part in text.split(',') if part.strip()]


def run_cli(main, argv=None):
    """Run main(argv); a UserError becomes 'error: message' on stderr with exit status 2 (no traceback), a RunStopped
    'stopped: message' with status 3, Ctrl-C 'interrupted.' with status 130, a closed stdout pipe quietly 141."""
    try:
        return main(sys.argv[1:] if argv is None else argv)
    except UserError as e:
        message, status = f"error: {e}", 2
    except RunStopped as e:
        message, status = f"stopped: {e}", 3
    except KeyboardInterrupt:
        message, status = 'interrupted.', 130
    except BrokenPipeError:  # stdout's reader stopped reading (`| head`): end quietly, as a shell tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush cannot fail again
        sys.exit(141)
    sys.stdout.flush()
    print(' '.join(message.split()), file=sys.stderr)  # one line, whatever the message held
    sys.exit(status)
