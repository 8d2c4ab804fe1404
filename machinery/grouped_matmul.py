"""
The toy MoE's expert matmul: rows of tokens sorted by expert, times each expert's weight matrix, as one grouped matmul
where torch runs it as one kernel, and as a loop over the experts elsewhere. It is a custom op so that torch.compile
sees one opaque node with a known output shape: Inductor's fake-tensor rule for grouped_mm accepts only bf16, and the
loop needs the group sizes on the host (a sync, and a graph break). Inside the op both are plain eager code.

Where a host sync remains: the loop reads the group sizes on the host, one sync per call (each expert matrix once
forward and twice backward: 9 per gated MoE layer and micro-step). On CUDA that is every GPU but Hopper (compute
capability 9.0) and, from torch 2.10, datacenter Blackwell (10.x), and every dtype but bf16: an A100, RTX 4090, L4 or
RTX 50xx (12.0) syncs. torch's own F.grouped_mm would not help there: off sm90/sm100 it loops over the groups with a
host sync per call too. A sync-free path for those GPUs (groups padded to a bound known without a sync) is not written:
unmeasured.
"""
import torch
import torch.nn.functional as F

# torch.nn.functional.grouped_mm from torch 2.10; torch 2.8-2.9 have the same kernel as torch._grouped_mm
GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
TORCH = tuple(int(x) for x in torch.__version__.split(".")[:2])


def one_kernel(device_type, dtype, capability=None, version=TORCH):
    """Whether torch `version` runs the grouped matmul as one kernel, without a host sync, for this device type, dtype
    and CUDA compute capability: on CUDA its CUTLASS kernel takes bf16 on sm90 (9.0) and, from torch 2.10, sm100 (10.x)
    (torch 2.8's _grouped_mm raises on any other capability, later ones loop); on a CPU, fp32 and bf16 from 2.10."""
    if GROUPED_MM is None or version < (2, 8):
        return False
    if device_type == "cuda":
        return dtype == torch.bfloat16 and (capability == (9, 0) or version >= (2, 10) and capability[0] == 10)
    return device_type == "cpu" and version >= (2, 10) and dtype in (torch.float32, torch.bfloat16)


def _grouped_mm_ok(a, w):
    # one kernel for these operands (one_kernel), and 16-byte aligned rows
    capability = torch.cuda.get_device_capability(a.device) if a.is_cuda else None
    return (a.dtype == w.dtype and one_kernel(a.device.type, a.dtype, capability)
            and all(s * a.element_size() % 16 == 0 for s in (a.shape[-1], w.shape[-1])))


def _group_sizes(offs):
    return torch.diff(offs, prepend=offs.new_zeros(1)).tolist()


@torch.library.custom_op("nanoffn::expert_mm", mutates_args=())
def expert_mm(a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Rows of `a` sorted by expert (group e = rows offs[e-1]:offs[e]) times that expert's w[e] (E, in, out)."""
    if _grouped_mm_ok(a, w):
        return GROUPED_MM(a, w, offs=offs)
    # no one grouped kernel here: an expert at a time (reading the group sizes costs a host sync)
    return torch.cat([ae @ we for ae, we in zip(a.split(_group_sizes(offs)), w.unbind(0))])


@torch.library.custom_op("nanoffn::expert_mm_weight_grad", mutates_args=())
def expert_mm_weight_grad(a: torch.Tensor, grad: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """∂L/∂w[e] = a_eᵀ · grad_e for every expert e: (E, in, out)."""
    if _grouped_mm_ok(a, grad):
        return GROUPED_MM(a.t(), grad, offs=offs)
    sizes = _group_sizes(offs)
    return torch.stack([ae.t() @ ge for ae, ge in zip(a.split(sizes), grad.split(sizes))])


@expert_mm.register_fake
def _(a, w, offs):
    return a.new_empty(a.shape[0], w.shape[-1])


@expert_mm_weight_grad.register_fake
def _(a, grad, offs):
    return a.new_empty(offs.shape[0], a.shape[-1], grad.shape[-1])


def _expert_mm_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _expert_mm_backward(ctx, grad):
    a, w, offs = ctx.saved_tensors
    grad = grad.contiguous()  # the activations' gradient; the weights are read transposed in place, never copied
    grad_a = expert_mm(grad, w.transpose(1, 2), offs)
    return grad_a, expert_mm_weight_grad(a, grad, offs), None


expert_mm.register_autograd(_expert_mm_backward, setup_context=_expert_mm_setup)


def expert_matmul(a, w, offs):
    """expert_mm under autocast: both operands in the autocast dtype (custom ops are not autocast by torch)."""
    if torch.is_autocast_enabled(a.device.type):
        dt = torch.get_autocast_dtype(a.device.type)
        a, w = a.to(dt), w.to(dt)
    return expert_mm(a, w, offs)
