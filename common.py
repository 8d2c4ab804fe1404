"""
Helpers that train.py, sample.py, compare.py and bench.py share: the device and precision a run uses, and the files a
run directory holds (ckpt.pt, log.jsonl, small JSON records), and the progress bar. One place each, so every script
follows the same rules.
"""
import fcntl
import functools
import importlib
import json
import os
import socket
import sys
import threading
import time
from contextlib import nullcontext

import torch
from tqdm import tqdm

from configurator import RunStopped, UserError

# ----------------------------------------------------------------------------------------------------------------------
# device and precision

DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}


def mps_available():
    return getattr(torch.backends, 'mps', None) is not None and torch.backends.mps.is_available()


def resolve_device(name):
    """'auto' picks cuda, then mps, then cpu; an explicit choice must exist on this machine."""
    if name == 'auto':
        return 'cuda' if torch.cuda.is_available() else 'mps' if mps_available() else 'cpu'
    kind, colon, index = name.partition(':')
    if kind not in ('cpu', 'cuda', 'mps') or (colon and not (kind == 'cuda' and index.isdigit())):
        raise UserError(f"--device expects auto, cpu, cuda, cuda:N or mps, got '{name}'.")
    if kind == 'cuda' and not torch.cuda.is_available():
        raise UserError("--device=cuda but no CUDA GPU is available here; use --device=cpu (or auto).")
    if index and int(index) >= (n := torch.cuda.device_count()):
        raise UserError(f"--device={name} but this machine has {n} CUDA GPU(s), cuda:0 to cuda:{n - 1}; choose one.")
    if kind == 'mps' and not mps_available():
        raise UserError("--device=mps but MPS is not available here; use --device=cpu (or auto).")
    return name


def resolve_dtype(name, device_type):
    """'auto' is bfloat16 on a CUDA GPU that supports it, float32 elsewhere."""
    if name == 'auto':
        return 'bfloat16' if device_type == 'cuda' and torch.cuda.is_bf16_supported() else 'float32'
    if name not in DTYPES:
        raise UserError(f"--dtype expects auto, float32, bfloat16 or float16, got '{name}'.")
    if name == 'bfloat16' and device_type == 'cuda' and not torch.cuda.is_bf16_supported():
        raise UserError("this GPU does not support bfloat16; use --dtype=float16 (with loss scaling) or float32.")
    return name


def autocast(device_type, dtype):
    """Mixed precision for bfloat16/float16 (matmuls in the low precision, reductions in fp32); nothing for float32."""
    return nullcontext() if dtype == 'float32' else torch.autocast(device_type=device_type, dtype=DTYPES[dtype])


# ----------------------------------------------------------------------------------------------------------------------
# torch.compile: how a model is compiled, and where the compiled code is kept

COMPILE_MODES = ('regional', 'whole')


def compile_model(model, mode):
    """Compile a GPT for training; returns what to call in place of the model.
    regional: every transformer Block is compiled in place (nn.Module.compile). The blocks run the same code on
      parameters of the same shapes, and Dynamo passes a module's parameters to the graph as inputs, so ONE compiled
      graph serves every layer: it is traced and built once, whatever the depth. The embedding, final norm and loss
      stay eager, and the model's state_dict keeps its plain keys. This is PyTorch's "regional compilation" recipe.
    whole: torch.compile of the whole GPT (one graph with the loss in it; the returned module is a wrapper whose
      state_dict keys start with '_orig_mod.'). Compiles every layer's code into one graph: more compile time, but
      Inductor can fuse across block boundaries and into the loss.
    dynamic=False: shapes never change within a run (every batch is batch_size x block_size), so Dynamo specialises
    once instead of recompiling with symbolic sizes when a second shape shows up."""
    enable_compile_cache()
    if next(model.parameters()).device.type == 'cpu':
        check_cpu_isa_in_background()
    if mode == 'whole':
        return torch.compile(model, dynamic=False)
    for block in model.transformer.h:
        block.compile(dynamic=False)
    return model


def check_cpu_isa_in_background():
    """Start, on a thread, the check Inductor makes before it builds or loads its first CPU kernel in a process: which
    vector instruction sets (AVX2, AVX-512, ...) the CPU reports AND its C++ compiler can build and load. It builds a
    test program per instruction set (once per cache directory) and loads each one in a child Python process, every
    process: ~1.3 s on a 2-core CPU, over a third of a compiled run's start when its graphs are cached. Started
    here, it runs while torch.compile imports Inductor and Dynamo traces the model, instead of after (BENCHMARKS.md,
    compile-time section: a warm regional compile at 4 layers went from 2.6-3.5 s to 1.4-2.5 s on a 2-core Xeon).
    Inductor keeps the answer for the process (functools.cache), so its own call finds it ready; should it ask before
    the thread is done, it checks again itself, which costs what it did without the thread. Same check, same answer,
    only earlier. Where this torch has no such check to start (its internals moved), nothing is started: Inductor
    makes it when it asks."""
    # Every module the check imports is imported here, on the calling thread, before the thread starts: a module that
    # two threads import at once can be seen half-initialised by one of them, and the thread that compiles imports a
    # great deal. Seen: with torch.utils.cpp_extension (and the setuptools it pulls in) left to the check, one compiled
    # process of ~120 failed in torch.compile with "cannot import name ... from ... torch._functorch._aot_autograd".
    # tests/test_compile.py checks that the thread imports nothing; a torch whose check imports more fails that test,
    # and the list below needs those modules added.
    try:
        import torch._inductor.codecache  # noqa: F401
        import torch._inductor.cpp_builder  # noqa: F401
        import torch.utils.cpp_extension  # noqa: F401
        from torch._inductor.cpu_vec_isa import valid_vec_isa_list
    except (ImportError, AttributeError):
        return
    for name in ('filelock', 'torch.utils._filelock'):  # what check_build locks with, by torch version
        try:
            importlib.import_module(name)
        except ImportError:
            pass

    def check():
        try:
            valid_vec_isa_list()
        except Exception:  # e.g. no C++ compiler: Inductor's own call reports that, on the thread that compiles
            pass

    threading.Thread(target=check, name='inductor-cpu-isa-check', daemon=True).start()


@functools.cache  # asked by compare.py's plan and again for its message: one answer per process
def cpp_compiler_found():
    """Whether Inductor finds a C++ compiler to build CPU kernels with ($CXX, else g++; clang++ on macOS): without
    one, a CPU run asked to compile fails at its first step. (Importing Inductor to ask takes a few seconds.)"""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
        get_cpp_compiler()
        return True
    except Exception:  # torch raises InvalidCxxCompiler; an unusual build may fail to import the builder at all
        return False


def compile_cache_dir():
    """Where torch.compile's on-disk caches live: $TORCHINDUCTOR_CACHE_DIR if set, else
    $XDG_CACHE_HOME/nanoffn/torchinductor (~/.cache/nanoffn/torchinductor). Inductor keeps there its FX graph cache
    (graph -> generated kernels), the AOTAutograd cache (forward + backward graphs) and the built C++/Triton kernels,
    so a graph compiled by one run is loaded, not compiled again, by every later run or process on the machine that
    traces the same graph (another seed, the same variant in another comparison). Clearing it is safe:
    rm -rf ~/.cache/nanoffn/torchinductor (the next compile rebuilds what it needs)."""
    if os.environ.get('TORCHINDUCTOR_CACHE_DIR'):
        return os.environ['TORCHINDUCTOR_CACHE_DIR']
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(base, 'nanoffn', 'torchinductor')


def enable_compile_cache():
    """Point Inductor at compile_cache_dir() (it reads the variable when it first compiles) and switch on the FX graph
    and AOTAutograd caches (on by default in recent torch; set here so an older one caches too)."""
    os.environ['TORCHINDUCTOR_CACHE_DIR'] = compile_cache_dir()
    import torch._functorch.config
    import torch._inductor.config
    torch._inductor.config.fx_graph_cache = True
    torch._functorch.config.enable_autograd_cache = True


def compile_stats():
    """What torch.compile did in this process so far, from Dynamo's own counters and compile metrics: graphs compiled
    (one per distinct graph; a recompile adds one), seconds spent compiling (tracing, forward and backward), and the
    local cache hits and misses of the FX graph cache and the AOTAutograd cache."""
    from torch._dynamo.utils import compilation_time_metrics, counters
    seconds = sum(compilation_time_metrics.get('_compile.compile_inner', []))
    seconds += sum(compilation_time_metrics.get('backward._backward_impl', []))  # a backward compiled at first use
    return {'graphs': counters['stats']['unique_graphs'], 'compile_s': seconds,
            'fx_cache_hit': counters['inductor']['fxgraph_cache_hit'],
            'fx_cache_miss': counters['inductor']['fxgraph_cache_miss'],
            'aot_cache_hit': counters['aot_autograd']['autograd_cache_hit'],
            'aot_cache_miss': counters['aot_autograd']['autograd_cache_miss']}


# ----------------------------------------------------------------------------------------------------------------------
# checkpoints


def save_checkpoint(ckpt, out_dir, name='ckpt.pt'):
    """Write atomically: torch.save into a temporary file in out_dir, fsync, then os.replace over the old file.
    A kill at any moment leaves either the previous checkpoint or the new one, never a torn file."""
    path = os.path.join(out_dir, name)
    tmp = os.path.join(out_dir, f'.{name}.tmp{os.getpid()}')
    try:
        with open(tmp, 'wb') as f:
            torch.save(ckpt, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:  # disk full, permissions: stop cleanly, the previous checkpoint is untouched
        raise RunStopped(f"could not write the checkpoint {path} ({e.strerror or e}); the previous one is kept, "
                         f"free some space and resume with --init_from=resume.") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def load_checkpoint(out_dir, missing_hint):
    """out_dir/ckpt.pt as written by train.py, or a UserError: `missing_hint` says what to do if there is none.
    weights_only: a checkpoint holds tensors and plain Python values only, so loading one cannot run code."""
    path = os.path.join(out_dir, 'ckpt.pt')
    if not os.path.exists(path):
        raise UserError(f"there is no checkpoint at {path}; {missing_hint}")
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
        for key in ('model_args', 'config', 'iter_num'):
            ckpt[key]
        finite = all(bool(v.isfinite().all()) for v in ckpt['model'].values() if v.is_floating_point())
    except Exception as e:
        raise UserError(f"cannot read the checkpoint {path} ({type(e).__name__}); it is not a train.py checkpoint or "
                        f"it is damaged, so train the run again.") from None
    if not finite:  # train.py never writes one; an older version could, after a diverged step
        raise UserError(f"the checkpoint {path} (iteration {ckpt['iter_num']}) holds non-finite weights, so it "
                        f"cannot be used; train the run again with a lower learning_rate.")
    return ckpt


def checkpoint_field(run_dir, key):
    """One plain field of run_dir/ckpt.pt (iter_num, model_args), read by memory map: the tensors are not loaded.
    None if there is no readable checkpoint."""
    try:
        return torch.load(os.path.join(run_dir, 'ckpt.pt'), map_location='cpu', weights_only=True, mmap=True)[key]
    except Exception:
        return None


def model_state(state_dict):
    """A checkpoint's model weights as a plain GPT's state dict: a compiled model's keys carry '_orig_mod.' and a DDP
    one's 'module.' (stripped), and MoA's gate logits were called `gate` before they were renamed `mix_logits`."""
    out = {}
    for k, v in state_dict.items():
        for prefix in ('_orig_mod.', 'module.'):
            while k.startswith(prefix):
                k = k[len(prefix):]
            k = k.replace('.' + prefix, '.')  # a compiled block inside the model
        out[k.replace('.act.gate.', '.act.mix_logits.').replace('.act_up.gate.', '.act_up.mix_logits.')] = v
    return out


# ----------------------------------------------------------------------------------------------------------------------
# the run directory's owner

LOCK_FD_ENV = 'NANOFFN_LOCK_FD'  # compare.py hands the lock it took for a run to the train.py it starts


def try_lock_run_dir(out_dir):
    """(lock file, None) if this process now owns out_dir, or (None, 'PID n on host h') naming the process that does.

    The lock is an exclusive fcntl.flock on out_dir/.lock, a file holding the owner's PID and host. The kernel releases
    a flock when its process ends, however it ends (kill -9 included), so a .lock left behind by a dead run is simply
    taken over: nothing to clean up by hand. Keep the returned file open for as long as the run writes; closing it
    releases the lock. A process started with the lock's file descriptor in LOCK_FD_ENV shares its parent's lock.
    Limitation: on network filesystems flock may exclude only processes of the same machine (it depends on the
    filesystem and its client), so two machines must not train into one shared folder at once.
    """
    path = os.path.join(out_dir, '.lock')
    try:
        os.makedirs(out_dir, exist_ok=True)
        f = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), 'r+')  # never truncated before it is ours
    except OSError as e:
        raise UserError(f"cannot write in --out_dir={out_dir} ({e.strerror or e}); choose a directory you can write "
                        f"to.") from None
    inherited = os.environ.get(LOCK_FD_ENV, '')
    if inherited.isdigit() and _same_file(int(inherited), f.fileno()):
        f.close()
        f = os.fdopen(int(inherited), 'r+')
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = f.read().strip() or 'unknown'
        f.close()
        pid, _, host = owner.partition(' ')
        return None, f"PID {pid}" + (f" on {host}" if host else '')
    except OSError as e:  # a filesystem without locks: train anyway, but say that the folder is not guarded
        print(f"warning: cannot lock {path} ({e.strerror or e}); make sure no other run uses {out_dir}.", file=sys.stderr)
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()} {socket.gethostname()}\n")
    f.flush()
    return f, None


def lock_run_dir(out_dir):
    """The lock file of out_dir (see try_lock_run_dir), or a UserError naming the process that owns the directory."""
    f, owner = try_lock_run_dir(out_dir)
    if f is None:
        raise UserError(f"{out_dir} is in use by another run ({owner}); wait for it to finish or stop it, or choose "
                        f"another --out_dir.")
    return f


def _same_file(fd, other_fd):
    try:
        a, b = os.fstat(fd), os.fstat(other_fd)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


# ----------------------------------------------------------------------------------------------------------------------
# log.jsonl and JSON records


def read_log_lines(path):
    """(records, damaged): the JSON records of a log.jsonl, and the text of the lines that are not a JSON object (a
    torn last line after a kill mid-write, or a line damaged by hand or by a disk), which are skipped, never a reason
    to ignore the intact lines after them."""
    records, damaged = [], []
    if os.path.exists(path):
        with open(path, encoding='utf-8', errors='replace') as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    record = None
                if isinstance(record, dict):
                    records.append(record)
                elif line.strip():
                    damaged.append(line if line.endswith('\n') else line + '\n')
    return records, damaged


def read_log(path):
    """The records of a log.jsonl (damaged lines skipped, see read_log_lines)."""
    return read_log_lines(path)[0]


def read_json(path):
    """A JSON file's content, or None if it is missing or not JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path, obj):
    """Write a JSON file atomically (a temporary file renamed over it; named by process, as two compare.py sharing an
    out_dir may write the same summary at once)."""
    tmp = f'{path}.tmp{os.getpid()}'
    with open(tmp, 'w') as f:
        json.dump(obj, f, indent=1)
        f.write('\n')
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------------------------
# progress: on stderr, so that stdout holds only results (`python compare.py > summary.md` is the table)

PLAIN_EVERY = 30.0  # seconds between plain progress lines when stderr is a log file


def progress_bar(total, desc, initial=0, unit='it', disable=False):
    """A tqdm bar on stderr, redrawn at most twice a second, when stderr is a terminal. When it is not (a Slurm
    output file, a compare run's train.out, a pipe), a redrawn bar would fill the log with carriage returns: a
    PlainProgress prints one plain line every PLAIN_EVERY seconds and one at the end instead."""
    if sys.stderr.isatty():
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=disable, file=sys.stderr,
                    mininterval=0.5, dynamic_ncols=True)
    return PlainProgress(total, desc, initial, unit, disable)


class PlainProgress:
    """The part of tqdm's interface the scripts use, as occasional whole lines on stderr."""

    def __init__(self, total, desc, initial=0, unit='it', disable=False):
        self.total, self.desc, self.unit, self.disable = total, desc, unit, disable
        self.n = self.initial = initial
        self.postfix, self.t0, self.leave = '', time.time(), True  # leave=False: no closing line, as tqdm's
        self.shown_t, self.shown_n = self.t0, initial

    def update(self, n=1):
        self.n += n
        if time.time() - self.shown_t >= PLAIN_EVERY:
            self.show()

    def set_description(self, desc):
        self.desc = desc

    def set_postfix_str(self, postfix):
        self.postfix = postfix

    def set_postfix(self, **values):
        self.postfix = ', '.join(f'{k}={v}' for k, v in values.items())

    @staticmethod
    def write(line, file=None):
        """As tqdm.write: a message line, on stdout unless a file is given."""
        print(line, file=file or sys.stdout, flush=True)

    def show(self):
        self.shown_t, self.shown_n = time.time(), self.n
        if not self.disable:  # tqdm's own format, without the bar (ncols=0)
            print(tqdm.format_meter(self.n, self.total, self.shown_t - self.t0, ncols=0, prefix=self.desc,
                                    unit=self.unit, postfix=self.postfix or None, initial=self.initial),
                  file=sys.stderr, flush=True)

    def close(self):
        if self.leave and self.n != self.shown_n:  # where it ended, unless the last line already said so
            self.show()
