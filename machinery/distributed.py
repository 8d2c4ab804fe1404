"""
A training process among torchrun's (DDP): its rank, its GPU, the process group it joins and leaves. Alone, a process
is rank 0 of 1 and joins nothing.
"""
import gc
import os
from contextlib import suppress
from dataclasses import dataclass

import torch
import torch.distributed as dist

from machinery import device
from machinery.cli import UserError


@dataclass(frozen=True)
class Compute:
    """Where a process computes: its device (cpu, cuda:N, mps), its dtype's name, and its place among torchrun's
    processes (ddp: launched by torchrun; rank 0 is the one that logs)."""
    device: str
    dtype: str
    ddp: bool = False
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def device_type(self):
        return self.device.split(':')[0]


def setup(name, dtype):
    """The process's one hardware set-up (as nanochat's compute_init): its device and dtype (device.use) and, under
    torchrun (RANK set), this rank's GPU and the process group it joins (nccl on GPUs, gloo otherwise)."""
    if int(os.environ.get('RANK', -1)) == -1:  # not launched by torchrun
        return Compute(*device.use(name, dtype))
    rank, local_rank, world_size = (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE'))
    # off CUDA the group is gloo, which takes CPU tensors only (DDP's first collective fails on MPS ones): auto is the
    # CPU on a Mac here, as bench.py's is
    resolved = device.resolve_device(name, mps=False)  # a name this machine has no device of is refused first
    if name.startswith('cuda:'):
        raise UserError(f"--device={name} under torchrun: each process takes the GPU of its LOCAL_RANK; pass "
                        f"--device=cuda, and choose the GPUs with CUDA_VISIBLE_DEVICES.")
    if resolved == 'mps':
        raise UserError("--device=mps under torchrun: DDP's gloo backend cannot reduce MPS tensors; pass --device=cpu, "
                        "or train on MPS in one process (python train.py).")
    if resolved.startswith('cuda'):
        if local_rank >= (n := torch.cuda.device_count()):
            raise UserError(f"torchrun started more processes on this machine than its {n} CUDA GPU(s) (LOCAL_RANK "
                            f"{local_rank}); pass --nproc_per_node={n} or less.")
        name = f'cuda:{local_rank}'
    name, dtype = device.use(name, dtype, mps=False)
    # device_id binds the group to this rank's GPU at once (NCCL then need not guess it)
    dist.init_process_group(backend='nccl' if name.startswith('cuda') else 'gloo',
                            device_id=torch.device(name) if name.startswith('cuda') else None)
    return Compute(name, dtype, True, rank, local_rank, world_size)


def teardown(hw, failed):
    """Under DDP, leave the process group. After a clean end every rank meets first (one that destroys the group while
    another is still in a collective aborts the process); after a failure the other ranks may wait in a collective
    this one never joins, so it leaves at once, and torchrun stops them."""
    if not hw.ddp:
        return
    if not failed:
        with suppress(Exception):  # a peer already gone (it failed; torchrun stops this run anyway)
            dist.barrier()
    gc.collect()  # DDP's reducer sits in reference cycles: freed after its group is gone, gloo can abort the exit
    dist.destroy_process_group()
