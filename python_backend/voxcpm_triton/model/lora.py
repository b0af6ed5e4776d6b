"""Many LoRA adapters in one network: a fixed table of slots per adapted layer, and the LoRA product
for a batch whose rows use different adapters (or none).

Each adapted layer (a "site") has two tables, allocated once:

    A [slots, n * r_max, in]     the n fused targets' A matrices stacked (q, k, v for the fused QKV;
                                 gate, up for the fused gate/up; n = 1 elsewhere), zero-padded to r_max
    B [slots, out, r_max]        the targets' B matrices along the fused output, times alpha / r

Slot 0 stays zero: the base model. A row's slot id selects its adapter, so a batch mixes adapters
freely, and since the tables never move, CUDA graphs captured over them stay valid while adapters
are written into free slots. The delta of a fused projection is the concatenation of its targets'
deltas; a target an adapter does not have has zero weights.

Three ways to apply them (`LoraOp.mode`), for tokens that come as `halves` blocks of G rows of T
tokens each, row g on slot rows[g] (LocDiT: the CFG batch is [conditional rows; unconditional rows];
the LMs in a decode step: one block of one token per request; a prefill: one row):

- "token": each token gathers its row's weights: `(x * A[slot]).sum(-1)` and the same for B. Under
  torch.compile the gathers fold into the two reductions: two kernels, nothing materialised, each
  weight read from memory once per row (and from cache by the row's other tokens). For few tokens
  per row or few rows: the LMs' decode step, and LocDiT at small batches.
- "group": A and B gathered per row (by the caller, once per decode step for LocDiT's nine
  evaluations, or here from `rows`), the tokens regrouped by row, and batched matmuls do the rest:
  more kernels, but each weight read once per row whatever the token count (LocDiT at large
  batches, prefills).
- "kernel" (CUDA with triton): `kernels.lora`, one launch per site that does the shrink, the expand
  and the add for every row on its own slot, straight from the tables. Every decode op on the GPU
  (the step is bound by kernel count at small batches); prefills stay "group".

With no adapters (`lora=None` everywhere) none of this runs: the network is exactly the plain one.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ..kernels import lora as lora_kernel

# Fused projections: (parent module kind) -> (their targets, in fused order; the site's name).
FUSED = {"self_attn": (("q_proj", "k_proj", "v_proj"), "qkv"), "mlp": (("gate_proj", "up_proj"), "gate_up")}
DIT = "feat_decoder.estimator"
DIT_TOP = ("in_proj", "cond_proj", "out_proj", "time_mlp.linear_1", "time_mlp.linear_2",
           "delta_time_mlp.linear_1", "delta_time_mlp.linear_2")


class LoraSite(NamedTuple):
    name: str  # "base_lm.layers.0.self_attn.qkv", "base_lm.layers.0.self_attn.o_proj", "lm_to_dit_proj", ...
    targets: tuple  # the official module names it covers, in output order
    in_features: int
    splits: tuple  # each target's output width


class LoraOp(NamedTuple):
    """One site's LoRA for one call, over `halves` blocks of G rows. mode "token" and "kernel": a, b
    are the tables, rows [G] the rows' slots. mode "group": a [G, n*r, in], b [G, out, r] per row,
    or the tables with rows [G] to gather."""

    mode: str
    a: torch.Tensor
    b: torch.Tensor
    rows: torch.Tensor | None
    seg: torch.Tensor | None  # [out]: the target each output column belongs to (fused sites, token mode)
    splits: tuple
    halves: int = 1


class LayerLora(NamedTuple):
    """A transformer layer's ops (None: that projection has no LoRA)."""

    qkv: LoraOp | None
    o: LoraOp | None
    gate_up: LoraOp | None
    down: LoraOp | None


class DitLora(NamedTuple):
    """LocDiT's ops for one decode step: its own projections by name, and its layers'."""

    top: dict
    layers: list


def site_of(module: str) -> tuple[str, tuple]:
    """The site a linear belongs to -> (site name, all the site's targets)."""
    parent, _, short = module.rpartition(".")
    kind = parent.rpartition(".")[2]
    if kind in FUSED and short in FUSED[kind][0]:
        return f"{parent}.{FUSED[kind][1]}", tuple(f"{parent}.{t}" for t in FUSED[kind][0])
    return module, (module,)


def linear_shapes(model: nn.Module) -> dict:
    """module name -> (in, out) of every linear layer of `model` (what adapters are checked against)."""
    return {name: (m.in_features, m.out_features) for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def sites_for(linears: dict, modules) -> list:
    """The sites that cover `modules` (official linear names), with every target of a fused site."""
    sites = {}
    for m in modules:
        name, targets = site_of(m)
        if name not in sites:
            sites[name] = LoraSite(name, targets, linears[targets[0]][0], tuple(linears[t][1] for t in targets))
    return [sites[k] for k in sorted(sites)]


def lora_delta(x: torch.Tensor, op: LoraOp) -> torch.Tensor:
    """x [N, in] -> the LoRA delta [N, out] (scale included), in x's dtype."""
    if op.mode == "token":
        r, rows, n = op.b.size(-1), op.rows, x.size(0)
        if op.halves > 1:  # each token's slot: its row's, in every block
            rows = rows.view(1, -1, 1).expand(op.halves, -1, n // (op.halves * rows.size(0))).reshape(n)
        # fp32 products and sums (a matmul's accumulation); under torch.compile both gathers fuse.
        u = (x.float()[:, None, :] * op.a[rows].float()).sum(-1)  # [N, n * r]
        u = u.view(n, -1, r)
        if op.seg is not None:
            u = u[:, op.seg]  # [N, out, r]: each output column with its target's r values
        return (u * op.b[rows].float()).sum(-1).to(x.dtype)
    a, b = op.a, op.b
    if op.rows is not None:
        a, b = a[op.rows], b[op.rows]
    G, h, n_in = a.size(0), op.halves, x.size(-1)
    xg = x.reshape(h, G, -1, n_in).transpose(0, 1).reshape(G, -1, n_in)  # [G, h * T, in]
    u = torch.bmm(xg, a.transpose(1, 2))  # [G, h * T, n * r]
    r = b.size(-1)
    outs, o = [], 0
    for i, width in enumerate(op.splits):
        outs.append(torch.bmm(u[..., i * r:(i + 1) * r], b[:, o:o + width].transpose(1, 2)))
        o += width
    y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)  # [G, h * T, out]
    return y.reshape(G, h, -1, y.size(-1)).transpose(0, 1).reshape(x.size(0), y.size(-1))


def lora_add(y: torch.Tensor, x: torch.Tensor, op: LoraOp | None) -> torch.Tensor:
    """A projection's output y [..., out] plus the LoRA delta of its input x [..., in]."""
    if op is None:
        return y
    if op.mode == "kernel":
        return lora_kernel.lora_add(y, x, op.a, op.b, op.rows, op.splits, op.halves)
    return y + lora_delta(x.reshape(-1, x.size(-1)), op).view(y.shape)


def lora_linear(linear, x: torch.Tensor, op: LoraOp | None) -> torch.Tensor:
    """`linear(x)` plus its LoRA delta: x [..., in] -> [..., out]."""
    return lora_add(linear(x), x, op)


# LocDiT's formulation per decode graph: "token" up to this many rows (padding included), "group"
# above. Its evaluations see each row's 2 x 11 tokens nine times: reading the weights per token
# costs cache bandwidth that grows with the rows, the batched matmuls cost kernels (latency)
# that does not (benchmarks/bench_lora.py measures both).
DIT_TOKEN_MAX_ROWS = 8


def _static(t: torch.Tensor) -> nn.Parameter:
    # Parameters: torch.compile treats their shapes as static, so kernels stay specialised.
    return nn.Parameter(t, requires_grad=False)


class LoraTables:
    """The slot tables of every site (slot 0: zeros, the base model; slots 1..max_loras: adapters).
    Writes go through `write`, between steps, on the stream the steps run on."""

    def __init__(self, sites: list, max_loras: int, max_rank: int, dtype, device, kernel: bool | None = None):
        """kernel: decode ops in the "kernel" formulation (None: wherever `kernels.lora` runs compiled)."""
        if max_loras < 1 or max_rank < 1:
            raise ValueError(f"max_loras and max_lora_rank must be positive, got {max_loras}, {max_rank}")
        if kernel is None:
            kernel = lora_kernel.available() and torch.device(device).type == "cuda"
        self.kernel = kernel and all(lora_kernel.supports(s.splits, max_rank) for s in sites)
        self.sites = {s.name: s for s in sites}
        self.max_loras, self.max_rank = max_loras, max_rank
        self.modules = {t for s in sites for t in s.targets}
        self.dtype, self.device = dtype, torch.device(device)
        S, r = max_loras + 1, max_rank
        self.a, self.b, self.seg = {}, {}, {}
        for s in sites:
            self.a[s.name] = _static(torch.zeros(S, len(s.targets) * r, s.in_features, dtype=dtype, device=device))
            self.b[s.name] = _static(torch.zeros(S, sum(s.splits), r, dtype=dtype, device=device))
            if len(s.targets) > 1:
                seg = torch.repeat_interleave(torch.arange(len(s.targets)), torch.tensor(s.splits))
                self.seg[s.name] = _static(seg.to(device))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for d in (self.a, self.b) for t in d.values())

    def uncovered(self, modules) -> list:
        """Of `modules`, those no site here covers."""
        return sorted(set(modules) - self.modules)

    @torch.no_grad()
    def write(self, slot: int, weights: dict, scale: float):
        """Slot `slot` <- an adapter: weights[module] = (A [r, in], B [out, r]); every site is written
        (zeros for the targets it lacks), so a reused slot keeps nothing of its previous adapter."""
        if not 1 <= slot <= self.max_loras:
            raise ValueError(f"slot {slot} is outside 1..{self.max_loras}")
        extra = self.uncovered(weights)
        if extra:
            raise ValueError(f"no slot table for {', '.join(extra[:4])}")
        r_max = self.max_rank
        for name, s in self.sites.items():
            a = torch.zeros(len(s.targets) * r_max, s.in_features)
            b = torch.zeros(sum(s.splits), r_max)
            o = 0
            for i, (t, width) in enumerate(zip(s.targets, s.splits)):
                if t in weights:
                    A, B = weights[t]
                    r = A.size(0)
                    if r > r_max:
                        raise ValueError(f"{t}: rank {r} is above the tables' {r_max}")
                    a[i * r_max:i * r_max + r] = A.float()
                    b[o:o + width, :r] = B.float() * scale
                o += width
            self.a[name][slot].copy_(a)
            self.b[name][slot].copy_(b)


class LoraBatch:
    """The adapters of one call: each request row's slot (`slots`, a device tensor; padding rows 0).

    single: a prefill, every token of the call on slots[0] (one adapter per call: the engine prefills
    prompts of different adapters separately). Otherwise a decode step: one token per row in the LMs
    and projections, and LocDiT's rows gathered once for its evaluations (`dit`)."""

    def __init__(self, tables: LoraTables, slots: torch.Tensor, single: bool = False):
        # detach(): no view (compiled code guards on a view's base), same memory
        self.tables, self.slots, self.single = tables, slots.detach(), single

    def op(self, site: str) -> LoraOp | None:
        t = self.tables
        if site not in t.sites:
            return None
        mode = "group" if self.single else "kernel" if t.kernel else "token"
        return LoraOp(mode, t.a[site], t.b[site], self.slots, t.seg.get(site), t.sites[site].splits)

    def layers(self, prefix: str, n: int) -> list | None:
        """Per layer of the transformer at `prefix` (e.g. "base_lm"), its ops; None if it has none."""
        out = []
        for i in range(n):
            p = f"{prefix}.layers.{i}"
            ops = LayerLora(self.op(f"{p}.self_attn.qkv"), self.op(f"{p}.self_attn.o_proj"),
                            self.op(f"{p}.mlp.gate_up"), self.op(f"{p}.mlp.down_proj"))
            out.append(None if all(o is None for o in ops) else ops)
        return None if all(o is None for o in out) else out

    def dit(self, n_layers: int) -> DitLora | None:
        """LocDiT's ops for this decode step (its CFG batch holds every row twice: `halves` 2). The
        kernel where the tables have it; otherwise up to DIT_TOKEN_MAX_ROWS rows, "token" ops on the
        tables; above, each row's A and B gathered here, once, for all the CFM evaluations ("group")."""
        t = self.tables
        per_token = self.slots.size(0) <= DIT_TOKEN_MAX_ROWS

        def gathered(site):
            if site not in t.sites:
                return None
            if t.kernel:
                return LoraOp("kernel", t.a[site], t.b[site], self.slots, None, t.sites[site].splits, 2)
            if per_token:
                return LoraOp("token", t.a[site], t.b[site], self.slots, t.seg.get(site), t.sites[site].splits, 2)
            return LoraOp("group", t.a[site].index_select(0, self.slots), t.b[site].index_select(0, self.slots),
                          None, None, t.sites[site].splits, 2)

        top = {k: op for k in DIT_TOP if (op := gathered(f"{DIT}.{k}")) is not None}
        layers = []
        for i in range(n_layers):
            p = f"{DIT}.decoder.layers.{i}"
            ops = LayerLora(gathered(f"{p}.self_attn.qkv"), gathered(f"{p}.self_attn.o_proj"),
                            gathered(f"{p}.mlp.gate_up"), gathered(f"{p}.mlp.down_proj"))
            layers.append(None if all(o is None for o in ops) else ops)
        if not top and all(x is None for x in layers):
            return None
        return DitLora(top, None if all(x is None for x in layers) else layers)
