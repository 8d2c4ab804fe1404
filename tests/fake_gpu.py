"""A fake CUDA GPU for a machine without one, so that every CUDA branch that runs before a tensor is placed on a GPU is
tested on a CPU too (PyTorch Lightning tests its GPU selection on CPU-only CI the same way).

Only the CUDA runtime's lowest calls are stubbed: the torch._C functions a CUDA build defines (device count, init,
set and get the current device) and the runtime module's cudaMemGetInfo. Everything above them is torch's own Python
(argument checks, lazy initialisation, device counting, properties, bf16 support, with emulation or without), which
runs as it does on a GPU.
Nothing can be placed on such a GPU; a model's forward on one runs under torch's FakeTensorMode.
"""
import types

import torch
import torch._dynamo  # noqa: F401  imported now: imported while CUDA looks compiled in, it asks for CUDA's C functions


class FakeRuntime:
    """The CUDA runtime module as torch.cuda.cudart() returns it: only what nanoFFN asks of it."""

    def __init__(self, free):
        self.free = free

    def cudaMemGetInfo(self, index):
        return self.free[index], FAKE.props[index].total_memory


FAKE = types.SimpleNamespace(props=[], current=0, set_device_calls=[])


def install(monkeypatch, n=1, name='NVIDIA H100 80GB HBM3', total_gib=80.0, free_gib=None, capability=(9, 0)):
    """Make torch.cuda see n GPUs (n counts those this process sees, after CUDA_VISIBLE_DEVICES) of the model `name`,
    each of total_gib GiB with free_gib free (all of it unless given), of compute capability `capability` (or a list,
    one per GPU). Returns the record of torch._C._cuda_setDevice's calls. monkeypatch undoes it all at the test's end."""
    capabilities = capability if isinstance(capability, list) else [capability] * n
    FAKE.props = [types.SimpleNamespace(name=name, total_memory=int(total_gib * 2**30), major=major, minor=minor,
                                        multi_processor_count=132, is_integrated=False) for major, minor in capabilities]
    FAKE.current, FAKE.set_device_calls = 0, []
    free = [int((total_gib if free_gib is None else free_gib) * 2**30)] * n

    def cuda_init():  # what the CUDA build's torch._C._cuda_init defines in torch.cuda
        torch.cuda.default_generators = tuple(torch.Generator() for _ in range(n))  # CPU generators stand in
        torch.cuda._get_device_properties = lambda index: FAKE.props[index]

    def set_device(index):
        if not 0 <= index < n:
            raise RuntimeError('CUDA error: invalid device ordinal')
        FAKE.current = index
        FAKE.set_device_calls.append(index)

    C = torch._C
    monkeypatch.setattr(C, '_cuda_getDeviceCount', lambda: n, raising=False)
    monkeypatch.setattr(C, '_cuda_init', cuda_init, raising=False)
    monkeypatch.setattr(C, '_cuda_setDevice', set_device, raising=False)
    monkeypatch.setattr(C, '_cuda_getDevice', lambda: FAKE.current, raising=False)
    # torch.cuda's own state, put back afterwards: a real process initialises CUDA once
    monkeypatch.setattr(torch.cuda, '_cudart', FakeRuntime(free))
    monkeypatch.setattr(torch.cuda, '_initialized', False)
    monkeypatch.setattr(torch.cuda, '_cached_device_count', None)
    monkeypatch.setattr(torch.cuda, '_queued_calls', [])
    monkeypatch.setattr(torch.cuda, '_lazy_seed_tracker', type(torch.cuda._lazy_seed_tracker)())
    monkeypatch.setattr(torch.cuda, 'default_generators', ())
    monkeypatch.setattr(torch.cuda, '_get_device_properties', None, raising=False)
    # is_bf16_supported() answers from the capability at 8.0 and newer; below, by making a bf16 tensor on the GPU,
    # which every CUDA card can (it emulates bf16 arithmetic): True, as torch says on a real T4 or V100
    monkeypatch.setattr(torch.cuda, '_check_bf16_tensor_supported', lambda device: True)
    return FAKE.set_device_calls
