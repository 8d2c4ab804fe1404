"""
The toy MoE's expert matmul: rows of tokens sorted by expert, times each expert's weight matrix, as one grouped matmul
(torch.nn.functional.grouped_mm) where torch has it for the dtype and device, and as a loop over the experts elsewhere.
It is a custom op so that torch.compile sees one opaque node with a known output shape: Inductor's fake-tensor rule
for grouped_mm accepts only bf16, and the loop needs the group sizes on the host (a graph break). Inside the op both
are plain eager code.
"""
import torch
import torch.nn.functional as F


def _grouped_mm_ok(a, w):
    # grouped_mm wants fp32/bf16 (bf16 only on CUDA) and 16-byte aligned rows
    if not hasattr(F, "grouped_mm") or a.dtype != w.dtype:
        return False
    if a.dtype not in ((torch.bfloat16,) if a.is_cuda else (torch.float32, torch.bfloat16)):
        return False
    return all(s * a.element_size() % 16 == 0 for s in (a.shape[-1], w.shape[-1]))


def _group_sizes(offs):
    return torch.diff(offs, prepend=offs.new_zeros(1)).tolist()


@torch.library.custom_op("nanoffn::expert_mm", mutates_args=())
def expert_mm(a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, grouped: bool) -> torch.Tensor:
    """Rows of `a` sorted by expert (group e = rows offs[e-1]:offs[e]) times that expert's w[e] (E, in, out)."""
    if grouped and _grouped_mm_ok(a, w):
        return F.grouped_mm(a, w, offs=offs)
    return torch.cat([ae @ we for ae, we in zip(a.split(_group_sizes(offs)), w.unbind(0))])  # fallback loop


@torch.library.custom_op("nanoffn::expert_mm_weight_grad", mutates_args=())
def expert_mm_weight_grad(a: torch.Tensor, grad: torch.Tensor, offs: torch.Tensor, grouped: bool) -> torch.Tensor:
    """∂L/∂w[e] = a_eᵀ · grad_e for every expert e: (E, in, out)."""
    if grouped and _grouped_mm_ok(a, grad):
        return F.grouped_mm(a.t(), grad, offs=offs)
    sizes = _group_sizes(offs)
    return torch.stack([ae.t() @ ge for ae, ge in zip(a.split(sizes), grad.split(sizes))])


@expert_mm.register_fake
def _(a, w, offs, grouped):
    return a.new_empty(a.shape[0], w.shape[-1])


@expert_mm_weight_grad.register_fake
def _(a, grad, offs, grouped):
    return a.new_empty(offs.shape[0], a.shape[-1], grad.shape[-1])


def _expert_mm_setup(ctx, inputs, output):
    a, w, offs, grouped = inputs
    ctx.save_for_backward(a, w, offs)
    ctx.grouped = grouped


def _expert_mm_backward(ctx, grad):
    a, w, offs = ctx.saved_tensors
    grad = grad.contiguous()
    grad_a = expert_mm(grad, w.transpose(1, 2).contiguous(), offs, ctx.grouped)
    return grad_a, expert_mm_weight_grad(a, grad, offs, ctx.grouped), None, None


expert_mm.register_autograd(_expert_mm_backward, setup_context=_expert_mm_setup)


def expert_matmul(a, w, offs, grouped=True):
    """expert_mm under autocast: both operands in the autocast dtype (custom ops are not autocast by torch)."""
    if torch.is_autocast_enabled(a.device.type):
        dt = torch.get_autocast_dtype(a.device.type)
        a, w = a.to(dt), w.to(dt)
    return expert_mm(a, w, offs, grouped)
