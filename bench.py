"""placeholder"""
import torch


def saved_bytes_for_backward(fn, *args):
    """Bytes of activations autograd keeps for backward while running fn(*args): every tensor saved by any op,
    counted once per storage, parameters excluded (they exist anyway). Measured with saved_tensors_hooks."""
    params = {p.untyped_storage().data_ptr() for a in args if isinstance(a, torch.nn.Module) for p in a.parameters()}
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return sum(storages.values()), out
