"""What to compile for an attention config, and how to launch it on given operands: the op's
entry points, which ask the config's family (`config.FAMILIES`), and what the families share.

A family's `kernel_units(config, variant, arch)` fixes the compiled signature: the feature
flags of the variant become constexprs, pointers and strides of aligned operands are marked
divisible by 16. Its `plan` binds operands to the stages: one for the forward, three for the
backward (preprocess, dK/dV, then dQ or the dQ conversion); `forward_start` and
`backward_start` make what every Triton forward and backward allocates and binds.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, replace

import torch

from ... import arch as arch_facts
from ...core.arith import cdiv, next_power_of_2
from ...core.dtypes import DType
from ...core.errors import BuildError, InvalidProblemError
from ...core.launch import Launch, Plan
from ...core.op import KernelUnit, UnitKind
from ...core.runtime import Backend, current_backend
from .config import FAMILIES, AnyAttentionConfig, AttentionConfig
from .operands import AttentionOperands
from .problem import FP8_DTYPES, FP8_OUTPUT, AttentionVariant, MaskKind, UserMask

KERNELS = "tiledispatch.ops.attention.kernels"
BACKWARD_MODULE = f"{KERNELS}.backward"  # bwd's kernels, and the preprocess every Triton backward runs
USER_MASK_CODES = {UserMask.NONE: 0, UserMask.BOOLEAN: 1, UserMask.ADDITIVE: 2}
# Arguments whose buffers the plan fills with zeros (the rest it allocates empty): a replay
# of the plan (fastpath.py) must zero them too.
ZEROED_ARGS = frozenset({"DQ_ACC", "DBIAS"})
PREPROCESS_BLOCK_M = 64  # memory-bound row sums: 64 rows of dO and O per program
MAX_GRID_YZ = 65535


@dataclass
class AttentionResult:
    """What a forward plan fills in. Mutable on purpose: a Triton stage writes into the
    tensors allocated here, while the vendor stage hands over the ones it allocated itself
    (copying them would cost a pass over O)."""

    out: torch.Tensor | None
    lse: torch.Tensor | None


@dataclass
class AttentionGrads:
    """What a backward plan fills in; `delta` = rowsum(dO * O) serves the sinks' gradient,
    `dbias` (batch, heads_q, seqlen_q, seqlen_kv) fp32 the bias gradient, when asked for.
    Mutable like `AttentionResult`: a vendor stage fills dq/dk/dv with the tensors it made."""

    dq: torch.Tensor | None
    dk: torch.Tensor | None
    dv: torch.Tensor | None
    delta: torch.Tensor | None
    dbias: torch.Tensor | None


# -- kernel units --------------------------------------------------------------------------------
def pointer(dtype: DType) -> str:
    return f"*{dtype.triton}"


def strides(prefix: str, dims: str = "bhs") -> list[tuple[str, str]]:
    return [(f"stride_{prefix}{d}", "i64") for d in dims]


FEATURE_STRIDES = (strides("b", "bhmn") + strides("m", "bhmn") + strides("s", "bh"))
RUNTIME = [("seqlen_q", "i32"), ("seqlen_kv", "i32"), ("heads_q", "i32"), ("group", "i32"),
           ("sm_scale", "fp32"), ("softcap", "fp32"), ("bottom_right", "i32"), ("window_left", "i32"),
           ("window_right", "i32"), ("dropout_p", "fp32"), ("seed", "i64"), ("rng_offset", "i64")]
# What the descriptor kernels take after their descriptors and pointers: the LSE's strides and the problem's scalars.
DESCRIPTOR_SCALARS = strides("l", "bh") + [("seqlen_q", "i32"), ("seqlen_kv", "i32"), ("group", "i32"),
                                           ("sm_scale", "fp32"), ("softcap", "fp32"), ("bottom_right", "i32"),
                                           ("window_left", "i32"), ("window_right", "i32")]


def block(d: int) -> int:
    return next_power_of_2(d)


def softcap_code(softcap: bool) -> int:
    """HAS_SOFTCAP's value (kernels/scores.py): 0 without a soft-cap, else the tanh the kernel
    computes it with: the hardware's where the kernel is compiled, the sigmoid form under the
    interpreter. The process decides: interpreter processes never compile."""
    if not softcap:
        return 0
    from .kernels.scores import SOFTCAP_MUFU, SOFTCAP_PORTABLE  # the kernels' module: Triton's import comes with it

    return (SOFTCAP_PORTABLE if current_backend() is Backend.INTERPRETER else SOFTCAP_MUFU).value


def feature_constexprs(config: AttentionConfig, v: AttentionVariant) -> dict:
    """The pointer kernels' tile and feature constexprs."""
    return {
        "BLOCK_M": config.block_m, "BLOCK_N": config.block_n,
        "HEAD_QK": config.head_dim_qk, "HEAD_V": config.head_dim_v,
        "BLOCK_QK": block(config.head_dim_qk), "BLOCK_V": block(config.head_dim_v),
        "HAS_BAND": v.band, "USER_MASK": USER_MASK_CODES[v.user_mask], "HAS_BIAS": v.bias,
        "HAS_ALIBI": v.alibi, "HAS_SOFTCAP": softcap_code(v.softcap), "HAS_DROPOUT": v.dropout, "VARLEN": v.varlen,
    }


def feature_pointers(config: AttentionConfig, variant: AttentionVariant) -> list[tuple[str, str]]:
    """The pointer kernels' bias, mask and ALiBi slopes."""
    t = pointer(config.dtype)
    mask_t = "*u8" if variant.user_mask is UserMask.BOOLEAN else t
    return [("BIAS", t), ("MASK", mask_t), ("SLOPES", "*fp32")]


CU_SEQLENS = [("CU_Q", "*i32"), ("CU_K", "*i32")]


def make_unit(stage: str, module: str, function: str, args: list, constexprs: dict, config: AttentionConfig,
              variant: AttentionVariant, num_warps: int | None = None, num_stages: int | None = None) -> KernelUnit:
    """A Triton stage: `args` (name, type) in any order, checked against the kernel's own."""
    kinds = dict(args) | {name: "constexpr" for name in constexprs}
    order = importlib.import_module(module).__dict__[function].arg_names
    if set(order) != set(kinds):  # a kernel edited without its signature here
        raise BuildError(f"{function} takes {sorted(set(order) ^ set(kinds))} differently from its unit")
    signature = [(name, kinds[name]) for name in order]
    tensors = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV"}
    divisible = tuple(name for name, kind in args if variant.aligned and (
        name in tensors or (name.startswith("stride_") and name[7:-1] in {"q", "k", "v", "o", "do", "dq", "dk", "dv"})))
    return KernelUnit(stage=stage, module=module, function=function, signature=tuple(signature),
                      constexprs=tuple(constexprs.items()), num_warps=num_warps or config.num_warps,
                      num_stages=num_stages or config.num_stages, divisible_by_16=divisible)


def dot_precision(config: AttentionConfig) -> str:
    return "ieee"  # fp32 inputs are the exact path; half inputs ignore it


def preprocess_unit(config: AttentionConfig, variant: AttentionVariant) -> KernelUnit:
    """Every Triton backward's first stage: delta = rowsum(dO * O)."""
    t = pointer(config.dtype)
    args = ([("O", t), ("DO", t), ("DELTA", "*fp32")] + strides("o") + strides("do") + strides("l", "bh")
            + CU_SEQLENS + [("seqlen_q", "i32"), ("seqlen_kv", "i32")])
    return make_unit("preprocess", BACKWARD_MODULE, "attention_bwd_preprocess", args,
                     {"BLOCK_M": PREPROCESS_BLOCK_M, "HEAD_V": config.head_dim_v, "BLOCK_V": block(config.head_dim_v),
                      "VARLEN": variant.varlen}, config, variant, num_warps=4, num_stages=1)


def gluon_unit(stage: str, module: str, function: str, blocks: dict, pointers: list, constexprs: dict,
               config: AttentionConfig, variant: AttentionVariant, arch: arch_facts.ArchInfo | None) -> KernelUnit:
    """A Gluon stage. It launches as one warpgroup (the first MMA partition); the second and the
    loader's are added by `warp_specialize`."""
    args = _gluon_descriptor_types(config, blocks) + pointers + DESCRIPTOR_SCALARS
    unit = make_unit(stage, module, function, args, constexprs, config, variant, num_warps=4)
    return replace(unit, kind=UnitKind.GLUON, max_registers=_gluon_register_cap(config, arch))


def _gluon_descriptor_types(config: AttentionConfig, blocks: dict) -> list[tuple[str, str]]:
    """Gluon descriptor types: the block and the shared-memory layout it lands in."""
    from triton.experimental.gluon import language as gl

    dtype = gl.dtype(config.dtype.triton)
    return [(name, f"tensordesc<{config.dtype.triton}[{', '.join(map(str, block))}],"
                   f"{gl.NVMMASharedLayout.get_default_for(list(block), dtype)!r}>") for name, block in blocks.items()]


def _gluon_register_cap(config: AttentionConfig, arch: arch_facts.ArchInfo | None) -> int:
    """The register cap: what `arch`'s multiprocessor registers give the MMA warpgroups and the loader's
    (by warpgroup). No arch: the one the Gluon families are written for (the one with warpgroup MMA)."""
    arch = arch or next(a for a in map(arch_facts.load, arch_facts.available()) if a.has(arch_facts.Feature.WGMMA))
    return arch.registers_per_sm // ((config.num_warps + 4) * 32) // 8 * 8


def python_unit(module: str, function: str, arguments: tuple[str, ...]) -> KernelUnit:
    """A stage that is a Python call (a library's), not a compiled kernel."""
    return KernelUnit(stage="vendor", module=module, function=function,
                      signature=tuple((n, "python") for n in arguments), constexprs=(), num_warps=0, num_stages=0,
                      kind=UnitKind.PYTHON)


_PLAIN = AttentionVariant()


@functools.lru_cache(maxsize=4096)
def kernel_units(config: AnyAttentionConfig, variant: AttentionVariant = _PLAIN,
                 arch: arch_facts.ArchInfo | None = None) -> tuple[KernelUnit, ...]:
    """What `config` compiles and runs for `variant` on `arch` (None: the arch its family is written for)."""
    return FAMILIES.of(config).kernel_units(config, variant, arch)


# -- binding operands ------------------------------------------------------------------------------
def tensor_descriptor(t: torch.Tensor, block: tuple[int, ...]):
    """A 4-D descriptor of a (batch, heads, seq, d) view with a unit-stride head dim (BHSD or BSHD).

    A dim of size one is never stepped over: its stride is set to one the copy engine
    accepts (a 16-byte multiple beyond the inner dims), whatever the view said.
    """
    from triton.tools.tensor_descriptor import TensorDescriptor

    shape, strides = list(t.shape), list(t.stride())
    strides[-1] = 1
    for i in range(len(shape) - 2, -1, -1):
        if shape[i] == 1:
            span = max(s * n for s, n in zip(strides[i + 1:], shape[i + 1:]))
            strides[i] = cdiv(span, 16) * 16
    return TensorDescriptor(t, shape, strides, list(block))


def _positive_scale(ops: AttentionOperands) -> tuple[torch.Tensor, float]:
    """K and the scale with scale >= 0: the forwards take rowmax(qk) * c for rowmax(qk * c),
    which holds for c >= 0 only, so a negative scale is moved into a negated copy of K.
    fp8 inputs keep theirs: their kernel scales every score first (its scales are on the GPU)."""
    if ops.scale >= 0 or ops.problem.dtype in FP8_DTYPES:
        return ops.k, ops.scale
    return -ops.k, -ops.scale


def bound_values(unit: KernelUnit, bound: dict) -> tuple:
    """`unit`'s arguments in its order: the bound ones, and its constexprs."""
    constants = dict(unit.constexprs)
    return tuple(bound[name] if name in bound else constants[name] for name, _ in unit.signature)


def bhs(t: torch.Tensor | None, varlen: bool) -> tuple[int, int, int]:
    """(batch, head, sequence) strides of a 4-D tensor, or of a (tokens, heads, d) varlen one."""
    if t is None:
        return 0, 0, 0
    if varlen:
        return 0, t.stride(1), t.stride(0)
    return t.stride(0), t.stride(1), t.stride(2)


def named(prefix: str, strides: tuple, dims: str = "bhs") -> dict:
    return {f"stride_{prefix}{d}": s for d, s in zip(dims, strides)}


def lse_strides(lse: torch.Tensor, varlen: bool) -> dict:
    # (batch, heads, seqlen_q), or (heads, tokens) for varlen
    return named("l", (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1)), "bh")


def _lse_buffer(ops: AttentionOperands) -> torch.Tensor:
    p = ops.problem
    shape = (p.heads_q, ops.q.shape[0]) if p.variant.varlen else (p.batch, p.heads_q, p.seqlen_q)
    return torch.empty(shape, dtype=torch.float32, device=ops.device)


def like_layout(t: torch.Tensor, last: int, dtype=None) -> torch.Tensor:
    """A new tensor of t's shape but head dim `last`, in t's layout (BSHD stays BSHD)."""
    shape = (*t.shape[:-1], last)
    order = sorted(range(t.dim()), key=lambda i: -t.stride(i) if t.shape[i] > 1 else -1 << 62)
    if t.dim() == 4 and order[:3] == [0, 2, 1]:
        return torch.empty((shape[0], shape[2], shape[1], last), dtype=dtype or t.dtype,
                           device=t.device).transpose(1, 2)
    return torch.empty(shape, dtype=dtype or t.dtype, device=t.device)


def runtime_args(ops: AttentionOperands) -> dict:
    """The problem's scalars as the kernels take them."""
    from .kernels.scores import UNBOUNDED

    p = ops.problem
    # -1 (unbounded) and sides past every key as UNBOUNDED: an i32 the kernels add to positions (MAX_SEQLEN)
    left, right = (UNBOUNDED if side < 0 else min(side, UNBOUNDED) for side in p.band(p.seqlen_q, p.seqlen_kv)[1:])
    return {
        "seqlen_q": p.seqlen_q, "seqlen_kv": p.seqlen_kv, "heads_q": p.heads_q, "group": p.group,
        "sm_scale": ops.scale, "softcap": ops.softcap or 1.0, "window_left": left, "window_right": right,
        "bottom_right": 0 if p.mask in (MaskKind.CAUSAL_TOP_LEFT, MaskKind.NONE) else 1,
        "dropout_p": ops.dropout_p, "seed": ops.dropout_seed, "rng_offset": ops.dropout_offset,
    }


def features(ops: AttentionOperands, dummy: torch.Tensor) -> dict:
    """The pointer kernels' optional tensors (`dummy` where absent) and their strides."""
    bias, mask, slopes = ops.bias, ops.mask, ops.alibi_slopes
    out = {"BIAS": bias if bias is not None else dummy, "MASK": mask if mask is not None else dummy,
           "SLOPES": slopes if slopes is not None else dummy,
           "CU_Q": ops.cu_seqlens_q if ops.cu_seqlens_q is not None else dummy,
           "CU_K": ops.cu_seqlens_k if ops.cu_seqlens_k is not None else dummy}
    out.update(named("b", bias.stride() if bias is not None else (0,) * 4, "bhmn"))
    out.update(named("m", mask.stride() if mask is not None else (0,) * 4, "bhmn"))
    out.update(named("s", slopes.stride() if slopes is not None else (0, 0), "bh"))
    return out


@dataclass(frozen=True)
class ForwardStart:
    """What every Triton forward allocates and reads before binding: O, the LSE, its one unit,
    K and the scale made non-negative (`_positive_scale`), and the grid over query blocks."""

    out: torch.Tensor
    lse: torch.Tensor
    unit: KernelUnit
    k: torch.Tensor
    scale: float
    grid: tuple[int, int, int]

    def plan(self, bound: dict) -> Plan:
        """The one launch with `bound` (the scale as made non-negative)."""
        args = bound_values(self.unit, {**bound, "sm_scale": self.scale})
        return Plan((Launch("fwd", self.grid, args),), AttentionResult(self.out, self.lse))


def forward_start(config: AttentionConfig, ops: AttentionOperands) -> ForwardStart:
    p = ops.problem
    out = like_layout(ops.q, p.head_dim_v, dtype=FP8_OUTPUT.torch if p.dtype in FP8_DTYPES else None)
    lse = _lse_buffer(ops)
    unit = kernel_units(config, p.variant)[0]
    k, scale = _positive_scale(ops)
    return ForwardStart(out, lse, unit, k, scale, (cdiv(p.seqlen_q, config.block_m), p.heads_q, p.batch))


@dataclass(frozen=True)
class BackwardStart:
    """What every Triton backward allocates and binds: the gradients (`grads`), the arguments its
    pointer stages share (`common`), its units by stage, and its first launch (the preprocess)."""

    grads: AttentionGrads
    common: dict
    units: dict
    preprocess: Launch

    def plan(self, *launches: Launch) -> Plan:
        return Plan((self.preprocess, *launches), self.grads)


def backward_start(config: AttentionConfig, ops: AttentionOperands, dq_acc: torch.Tensor | None = None
                   ) -> BackwardStart:
    """`dq_acc`: the fp32 dQ a family accumulates into (DQ_ACC, and the dQ strides its stages read)."""
    p = ops.problem
    dq = like_layout(ops.q, p.head_dim_qk)
    dk = like_layout(ops.k, p.head_dim_qk)
    dv = like_layout(ops.v, p.head_dim_v)
    varlen = p.variant.varlen
    lse = ops.lse
    delta = torch.empty_like(lse)
    # Zeros: pairs in skipped (fully masked) blocks are never written, and their gradient is 0.
    dbias = (torch.zeros((p.batch, p.heads_q, p.seqlen_q, p.seqlen_kv), dtype=torch.float32, device=ops.device)
             if p.variant.bias_grad else None)
    units = {u.stage: u for u in kernel_units(config, p.variant)}
    common = {"Q": ops.q, "K": ops.k, "V": ops.v, "DO": ops.grad_out, "LSE": lse, "DELTA": delta,
              "O": ops.out, "DK": dk, "DV": dv, "DQ": dq, "DQ_ACC": dq_acc if dq_acc is not None else lse,
              "DBIAS": dbias if dbias is not None else lse, **features(ops, lse),
              **named("q", bhs(ops.q, varlen)), **named("k", bhs(ops.k, varlen)),
              **named("v", bhs(ops.v, varlen)), **named("o", bhs(ops.out, varlen)),
              **named("do", bhs(ops.grad_out, varlen)), **lse_strides(lse, varlen),
              **named("dk", bhs(dk, varlen)), **named("dv", bhs(dv, varlen)),
              **named("dq", bhs(dq_acc if dq_acc is not None else dq, varlen)),
              **named("db", dbias.stride()[:3] if dbias is not None else (0, 0, 0), "bhm"),
              **runtime_args(ops)}
    q_blocks = cdiv(p.seqlen_q, PREPROCESS_BLOCK_M)
    preprocess = Launch("preprocess", (q_blocks, p.heads_q, p.batch), bound_values(units["preprocess"], common))
    return BackwardStart(AttentionGrads(dq, dk, dv, delta, dbias), common, units, preprocess)


def _check_grid(p) -> None:
    if p.heads_q > MAX_GRID_YZ or p.batch > MAX_GRID_YZ:
        raise InvalidProblemError(f"batch {p.batch} or heads {p.heads_q} exceeds the grid limit {MAX_GRID_YZ}")


def plan(config: AnyAttentionConfig, ops: AttentionOperands) -> Plan:
    _check_grid(ops.problem)
    return FAMILIES.of(config).plan(config, ops)
