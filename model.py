"""
The GPT of nanoFFN: nanoGPT's model with a swappable feed-forward layer (any variant of activations.VARIANTS) and an
optional toy Mixture-of-Experts of those FFNs. Read top to bottom:
    norms, RoPE, attention -> FFN -> MoE -> Block -> GPT (init, forward, reports, optimizer, generate).
Its settings are GPTConfig, below. References: nanoGPT (github.com/karpathy/nanoGPT) for everything not about
the FFN; the FFN variants' papers are named in activations.py; the MoE follows the dropless top-k design of OLMoE
(Muennighoff et al. 2024) and MegaBlocks (Gale et al. 2022), with Switch Transformer's load-balance loss and ST-MoE's
z-loss.

Every module here can be built and used on its own (FFN(config), MoE(config), Block(config, use_moe)): its weights
start at PyTorch's default Linear init (uniform in ±1/√fan_in) and its activation's extras at the activation's own
init. GPT then re-initialises every weight as GPT-2 does: N(0, 0.02), residual output projections
N(0, 0.02/√(2·n_layer)), MoA gate logits zero.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from activations import Activation, VARIANTS, glu, make_activations
from machinery.grouped_matmul import expert_matmul


# ----------------------------------------------------------------------------------------------------------------------
# Settings


@dataclass
class GPTConfig:
    block_size: int = 256  # the context, in tokens
    vocab_size: int = 50257  # the real vocabulary; embeddings are padded to a multiple of 64 for fast matmuls
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    dropout: float = 0.0
    bias: bool = False  # in the Linears and LayerNorms; an MoE's experts have none (as Mixtral's), nor its router
    norm: str = "rmsnorm"  # rmsnorm | layernorm
    pos: str = "rope"  # rope | learned
    # feed-forward
    ffn: str = "gelu"  # a name of activations.VARIANTS
    ffn_mult: float = 4.0  # non-gated hidden width m = ffn_mult·d; gated variants use ≈ 2/3 of it (same weights)
    poly_order: int = 3  # r of PolyReLU / PolyNorm (2–4)
    act_dict: str = "identity,relu,relu2,gelu,silu,tanh"  # LA / MoA dictionary
    la_init: str = "onehot"  # onehot (as the baseline: gelu, swiglu) | mean | sum | onehot:NAME; A/B: gate/up (mlp: A)
    moa_gate: str = "sigmoid"  # sigmoid | softmax | tanh | plain_sigmoid (activations.MOA_GATES)
    # toy mixture of experts (n_expert = 0: dense)
    n_expert: int = 0  # experts in each MoE layer
    top_k: int = 2  # the experts each token is routed to
    moe_every: int = 1  # MoE in blocks 0, moe_every, 2·moe_every, …
    expert_hidden: int = 0  # 0: the dense width / top_k (to a multiple of 8): active FFN weights ≈ the dense model's
    aux_loss_weight: float = 0.01  # w_aux, the load-balance loss's weight (Switch Transformer)
    z_loss_weight: float = 0.001  # w_z, the router z-loss's weight (ST-MoE)

    @property
    def padded_vocab_size(self):
        return (self.vocab_size + 63) // 64 * 64

    @property
    def ffn_hidden(self):
        """m for the dense FFN: int(ffn_mult·d), or round(2/3 of it) when gated (3·d·m ≈ 2·d·ffn_mult·d)."""
        m = int(self.ffn_mult * self.n_embd)
        return round(2 * m / 3) if VARIANTS[self.ffn].gated else m

    @property
    def moe_hidden(self):
        """Expert width: expert_hidden, or the dense width / top_k rounded to a multiple of 8 (grouped_mm alignment)."""
        return self.expert_hidden or max(8, round(self.ffn_hidden / self.top_k / 8) * 8)


def make_norm(config):
    return nn.RMSNorm(config.n_embd, eps=1e-6) if config.norm == "rmsnorm" else nn.LayerNorm(config.n_embd, bias=config.bias)


# ----------------------------------------------------------------------------------------------------------------------
# Attention


def rope_tables(head_dim, block_size, base=10000.0):
    """cos/sin tables of rotary position embeddings (Su et al. 2021), rotating pairs (i, i + head_dim/2)."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(block_size).float(), inv_freq)  # (T, head_dim/2)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[: x.shape[-2]].to(x.dtype), sin[: x.shape[-2]].to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_head, self.dropout = config.n_head, config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.rope = config.pos == "rope"
        if self.rope:
            cos, sin = rope_tables(config.n_embd // config.n_head, config.block_size)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.rope:
            q, k = apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


# ----------------------------------------------------------------------------------------------------------------------
# Feed-forward


def learned_by(act, act_up, x):
    """What a layer's activation(s) learned on its FFN inputs x: {'act': ..., 'act_up': ...}, empty parts left out."""
    parts = {"act": act.learned(x), "act_up": act_up.learned(x) if act_up is not None else {}}
    return {name: part for name, part in parts.items() if part}


class FFN(nn.Module):
    """
    mlp: y = W_down φ(W_up x)                       hidden width m = ffn_mult·d
    glu: y = W_down (φ(W_gate x) ⊙ φ_up(W_up x))    m = round(2/3·ffn_mult·d): 3·d·m ≈ 2·d·(ffn_mult·d) weights
    Returns (y, aux) like the MoE, with aux = [0, 0]: a dense FFN has no load-balance or z-loss.
    """

    def __init__(self, config):
        super().__init__()
        m, d = config.ffn_hidden, config.n_embd
        self.act, self.act_up = make_activations(config)  # one set per layer (an MoE's experts share it)
        self.w_gate = nn.Linear(d, m, bias=config.bias) if self.act_up is not None else None
        self.w_up = nn.Linear(d, m, bias=config.bias)
        self.w_down = nn.Linear(m, d, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        # token_gates(x): MoA's per-token gates from the FFN input (None for the other activations)
        if self.act_up is None:
            h = self.act(self.w_up(x), self.act.token_gates(x))
        else:
            h = glu(self.act, self.act_up, self.w_gate(x), self.w_up(x),
                    self.act.token_gates(x), self.act_up.token_gates(x))
        return self.dropout(self.w_down(h)), torch.zeros(2, device=x.device)  # no MoE losses

    def learned(self, x):
        return learned_by(self.act, self.act_up, x)


# ----------------------------------------------------------------------------------------------------------------------
# Toy Mixture of Experts


class MoE(nn.Module):
    """
    Dropless top-k mixture of FFN experts of the configured variant: y(x) = dropout(Σ_{e in top-k} w_e · FFN_e(x)).
      router (fp32, no bias): p = softmax(W_r x), keep the top-k, renormalise their weights (k ≥ 2, as Mixtral does;
        OLMoE keeps p; top-1 keeps p_e, as Switch Transformer does, or the router would learn nothing from the
        language-model loss);
      dispatch: the (token, expert) pairs sorted by expert, each expert's rows one group of a grouped matmul.
    A layer's experts share the activation's coefficients, and MoA's gates are computed once per token (as PolyCom's
    OLMoE code does). Returns (y, aux), aux = [load balance w_aux·E/(k·T)·Σ_i c_i·P̄_i (Switch Transformer; c_i the
    tokens routed to expert i, P̄_i its mean probability; w_aux at perfect balance), z-loss w_z·mean(logsumexp(z)²)
    (ST-MoE)].
    """

    def __init__(self, config):
        super().__init__()
        E, d, m = config.n_expert, config.n_embd, config.moe_hidden
        self.n_expert, self.top_k = E, config.top_k
        self.aux_loss_weight, self.z_loss_weight = config.aux_loss_weight, config.z_loss_weight
        self.router = nn.Linear(d, E, bias=False)
        self.act, self.act_up = make_activations(config)
        # E experts' matrices stacked, (E, in, out), each initialised like an nn.Linear of that shape
        expert = lambda n_in, n_out: nn.Parameter(torch.empty(E, n_in, n_out).uniform_(-n_in**-0.5, n_in**-0.5))
        self.w_gate = expert(d, m) if self.act_up is not None else None
        self.w_up = expert(d, m)
        self.w_down = expert(m, d)
        self.dropout = nn.Dropout(config.dropout)

    def route(self, x):
        """x (T, d) -> router probabilities (T, E) fp32, top-k weights and expert ids (T, k), router logits."""
        with torch.autocast(x.device.type, enabled=False):
            z = F.linear(x.float(), self.router.weight.float())
        probs = torch.softmax(z, dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.top_k > 1:
            weights = weights / weights.sum(-1, keepdim=True)
        return probs, weights, experts, z

    def dispatch(self, experts):
        """The T·k (token, expert) pairs sorted by expert: each expert's rows become one contiguous group. Returns the
        pairs' order (pair j = token j // k, its expert experts.flat[j]), their token ids, the tokens per expert
        and the groups' end offsets."""
        flat = experts.reshape(-1)
        order = flat.argsort(stable=True)
        counts = flat.new_zeros(self.n_expert).scatter_add_(0, flat, torch.ones_like(flat))  # static shape, unlike bincount
        return order, order // self.top_k, counts, counts.cumsum(0).to(torch.int32)

    def forward(self, x):
        B, T, d = x.shape
        x = x.reshape(-1, d)
        probs, weights, experts, z = self.route(x)
        order, token, counts, offs = self.dispatch(experts)
        xs = x[token]
        mm = lambda a, w: expert_matmul(a, w, offs)
        # MoA's gates: computed once per token, then gathered for each (token, expert) pair
        gate_rows = lambda act: None if (c := act.token_gates(x)) is None else c[token]
        if self.act_up is None:
            h = self.act(mm(xs, self.w_up), gate_rows(self.act))
        else:
            h = glu(self.act, self.act_up, mm(xs, self.w_gate), mm(xs, self.w_up),
                    gate_rows(self.act), gate_rows(self.act_up))
        y = mm(h, self.w_down) * weights.reshape(-1)[order, None].to(h.dtype)
        out = torch.zeros_like(x, dtype=y.dtype).index_add_(0, token, y)

        load_balance = (self.aux_loss_weight * self.n_expert / (self.top_k * x.shape[0])
                        * (counts.float() * probs.mean(0)).sum())
        z_loss = self.z_loss_weight * torch.logsumexp(z, dim=-1).square().mean()
        return self.dropout(out.view(B, T, d).to(x.dtype)), torch.stack([load_balance, z_loss])

    def learned(self, x):
        """The activation's report, and 'moe': the expert load over the tokens of x, max/mean and entropy (nats)."""
        _, _, experts, _ = self.route(x.reshape(-1, x.shape[-1]))
        _, _, counts, _ = self.dispatch(experts)
        frac = counts.float() / counts.sum()
        return {**learned_by(self.act, self.act_up, x),
                "moe": {"load_max_over_mean": (frac.max() * self.n_expert).item(),
                        "load_entropy": -(frac * frac.clamp_min(1e-12).log()).sum().item()}}


# ----------------------------------------------------------------------------------------------------------------------
# GPT


class Block(nn.Module):
    def __init__(self, config, use_moe):
        super().__init__()
        self.ln_1, self.ln_2 = make_norm(config), make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ffn = MoE(config) if use_moe else FFN(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        y, aux = self.ffn(self.ln_2(x))
        return x + y, aux


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd) if config.pos == "learned" else None,
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList(
                    [Block(config, config.n_expert > 0 and i % config.moe_every == 0) for i in range(config.n_layer)]
                ),
                ln_f=make_norm(config),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        # residual output projections: N(0, 0.02/√(2·n_layer)), per GPT-2
        for name, p in self.named_parameters():
            if name.endswith(("c_proj.weight", "w_down.weight", "w_down")):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear) and not getattr(module, "zero_init", False):  # MoA's gates stay at zero
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, MoE):
            for w in (module.w_gate, module.w_up, module.w_down):
                if w is not None:
                    torch.nn.init.normal_(w, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        """(logits, loss, terms): terms are the loss's detached terms that the log shows, {'ce', 'aux', 'z'}: the
        cross-entropy and the MoE's load-balance and z-losses, each summed over its MoE layers (0 in a dense GPT).
        Without targets: the last position's logits, None, None."""
        B, T = idx.shape
        assert T <= self.config.block_size, f"sequence of length {T} > block_size {self.config.block_size}"
        x = self.transformer.wte(idx)
        if self.transformer.wpe is not None:
            x = x + self.transformer.wpe(torch.arange(T, device=idx.device))
        x = self.transformer.drop(x)
        aux = x.new_zeros(2, dtype=torch.float32)  # [load-balance loss, z-loss] summed over MoE layers
        for block in self.transformer.h:
            x, block_aux = block(x)
            aux = aux + block_aux
        if targets is None:  # inference: only the last position, and never a padded id
            return self.lm_head(self.transformer.ln_f(x[:, [-1], :]))[..., : self.config.vocab_size], None, None
        logits, ce = self.head(x, targets)
        # training optimises cross-entropy plus the MoE losses; evaluation reports plain cross-entropy
        loss = ce + aux.sum() if self.training else ce
        return logits, loss, {"ce": ce.detach(), "aux": aux[0].detach(), "z": aux[1].detach()}

    def head(self, x, targets):
        """The final norm, the output layer (the padded ids cut off) and the cross-entropy in fp32: (logits, ce). A
        method of its own so that regional compilation (speed.compile_model) fuses it as it fuses the blocks."""
        logits = self.lm_head(self.transformer.ln_f(x))[..., : self.config.vocab_size]
        return logits, F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

    # ------------------------------------------------------------------------------------------------------------------
    # reports

    def activation_parameters(self):
        """Names of the parameters of every Activation module (coefficients, MoA's gates): param_report's extras, and
        the parameters configure_optimizers never decays."""
        return {f"{prefix}.{name}" for prefix, module in self.named_modules() if isinstance(module, Activation)
                for name, _ in module.named_parameters()}

    def param_report(self):
        """Parameter counts: embedding, attention, ffn (W_up/W_gate/W_down, experts), extras (activation coefficients
        and MoA gates), router, norm, total; `active` counts only top_k of n_expert expert weights (per token)."""
        r = dict(embedding=0, attention=0, ffn=0, extras=0, router=0, norm=0)
        inactive, extras = 0, self.activation_parameters()
        for name, p in self.named_parameters():  # tied lm_head/wte appears once
            n = p.numel()
            if name.startswith(("transformer.wte", "transformer.wpe")):
                r["embedding"] += n
            elif ".attn." in name:
                r["attention"] += n
            elif name in extras:
                r["extras"] += n
            elif ".ffn.router" in name:
                r["router"] += n
            elif ".ffn.w_" in name:
                r["ffn"] += n
                if p.dim() == 3:  # expert weights (E, ·, ·): a token uses top_k of them
                    inactive += n - n * self.config.top_k // self.config.n_expert
            else:
                r["norm"] += n
        r["total"] = sum(r.values())
        r["active"] = r["total"] - inactive
        return r

    def flops_per_token(self):
        """Training FLOPs per token, PaLM appendix B: 6N + 12·L·H·Q·T, N the *active* parameters (MoE: top_k of
        n_expert) less the position embedding (the tied token embedding stays: it is the output head's matmul)."""
        cfg = self.config
        wpe = self.transformer.wpe.weight.numel() if self.transformer.wpe is not None else 0
        return 6 * (self.param_report()["active"] - wpe) + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size

    def estimate_mfu(self, tokens_per_iter, dt, peak_flops):
        """Model FLOPs utilisation against `peak_flops` (e.g. 989e12 for H100/H200 bf16 dense, 312e12 for A100)."""
        return self.flops_per_token() * tokens_per_iter / dt / peak_flops

    @torch.no_grad()
    def learned(self, idx):
        """What every layer's FFN learned, from one no-grad pass over idx in eval mode: per layer {'act': ..., 'act_up':
        ..., 'moe': ...}, each part the activation's own report (its `learned`, activations.Activation) or an
        MoE's expert load, empty parts left out. JSON-able; a fixed activation's layers are empty dicts."""
        return {"layers": [block.ffn.learned(x) for block, x in zip(self.transformer.h, self.ffn_inputs(idx))]}

    @torch.no_grad()
    def ffn_inputs(self, idx):
        """Every block's FFN input x (after the block's norm), (B, T, d) per layer, from one no-grad pass over idx in
        eval mode: forward pre-hooks on block.ffn catch them without touching the forward code."""
        ffn_inputs = []
        hooks = [block.ffn.register_forward_pre_hook(lambda module, args: ffn_inputs.append(args[0]))
                 for block in self.transformer.h]
        was_training = self.training
        self.eval()
        try:
            self(idx)
        finally:
            self.train(was_training)
            for hook in hooks:
                hook.remove()
        return ffn_inputs

    # ------------------------------------------------------------------------------------------------------------------
    # training and sampling

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW. Weight decay on matrices (≥2-D) only, and never on activation coefficients or MoA gates: decaying
        α towards 0 would switch the activation off rather than regularise it."""
        decay, no_decay, extras = [], [], self.activation_parameters()
        for name, p in self.named_parameters():
            if p.requires_grad:
                (decay if p.dim() >= 2 and name not in extras else no_decay).append(p)
        groups = [dict(params=decay, weight_decay=weight_decay), dict(params=no_decay, weight_decay=0.0)]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == "cuda")

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Sample max_new_tokens continuations of idx (B, T). Padded vocabulary ids are never produced (forward
        returns logits of the real vocabulary only). temperature 0 is greedy."""
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size :]
            logits, _, _ = self(idx_cond)
            logits = logits[:, -1, :].float()
            if temperature == 0:
                idx_next = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("Inf")
                idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
