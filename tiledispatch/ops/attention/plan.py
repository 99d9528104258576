"""What to compile for an attention config, and how to launch it on given operands.

`kernel_units(config, variant)` fixes the compiled signature: the feature flags of the
variant become constexprs, pointers and strides of aligned operands are marked divisible
by 16. `plan` binds operands to the stages: one for the forward, three for the backward
(preprocess, dK/dV, then dQ or the dQ conversion).
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, replace

import torch
import triton

from ... import arch as arch_facts
from ...core.dtypes import DType
from ...core.errors import BuildError, InvalidProblemError
from ...core.launch import Launch, Plan
from ...core.op import KernelUnit, UnitKind
from ...core.runtime import Backend, current_backend
from .config import AnyAttentionConfig, AttentionConfig, Family, VendorConfig
from .kernels.scores import SOFTCAP_MUFU, SOFTCAP_PORTABLE, UNBOUNDED
from .operands import AttentionOperands
from .problem import FP8_DTYPES, FP8_OUTPUT, AttentionVariant, Direction, MaskKind, UserMask
from .rules import BWD_WS_DQ_ROWS, BWD_WS_WIDE_HEAD_DIMS, bwd_ws_dq_keys, bwd_ws_keys

_FWD = "tiledispatch.ops.attention.kernels.forward"
_FWD_TMA = "tiledispatch.ops.attention.kernels.forward_tma"
_FWD_WS = "tiledispatch.ops.attention.kernels.forward_ws"
_BWD_WS = "tiledispatch.ops.attention.kernels.backward_ws"
_BWD_WS_WIDE = "tiledispatch.ops.attention.kernels.backward_ws_wide"
_BWD = "tiledispatch.ops.attention.kernels.backward"
_VENDOR = "tiledispatch.ops.attention.vendor"
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


def _ptr(dtype: DType) -> str:
    return f"*{dtype.triton}"


def _strides(prefix: str, dims: str = "bhs") -> list[tuple[str, str]]:
    return [(f"stride_{prefix}{d}", "i64") for d in dims]


_FEATURE_STRIDES = (_strides("b", "bhmn") + _strides("m", "bhmn") + _strides("s", "bh"))
_RUNTIME = [("seqlen_q", "i32"), ("seqlen_kv", "i32"), ("heads_q", "i32"), ("group", "i32"),
            ("sm_scale", "fp32"), ("softcap", "fp32"), ("bottom_right", "i32"), ("window_left", "i32"),
            ("window_right", "i32"), ("dropout_p", "fp32"), ("seed", "i64"), ("rng_offset", "i64")]


def _block(d: int) -> int:
    return triton.next_power_of_2(d)


def softcap_code(softcap: bool) -> int:
    """HAS_SOFTCAP's value (kernels/scores.py): 0 without a soft-cap, else the tanh the kernel
    computes it with: the hardware's where the kernel is compiled, the sigmoid form under the
    interpreter. The process decides: interpreter processes never compile."""
    if not softcap:
        return 0
    return (SOFTCAP_PORTABLE if current_backend() is Backend.INTERPRETER else SOFTCAP_MUFU).value


def _feature_constexprs(config: AttentionConfig, v: AttentionVariant) -> dict:
    return {
        "BLOCK_M": config.block_m, "BLOCK_N": config.block_n,
        "HEAD_QK": config.head_dim_qk, "HEAD_V": config.head_dim_v,
        "BLOCK_QK": _block(config.head_dim_qk), "BLOCK_V": _block(config.head_dim_v),
        "HAS_BAND": v.band, "USER_MASK": USER_MASK_CODES[v.user_mask], "HAS_BIAS": v.bias,
        "HAS_ALIBI": v.alibi, "HAS_SOFTCAP": softcap_code(v.softcap), "HAS_DROPOUT": v.dropout, "VARLEN": v.varlen,
    }


def _unit(stage: str, module: str, function: str, args: list, constexprs: dict, config: AttentionConfig,
          variant: AttentionVariant, num_warps: int | None = None, num_stages: int | None = None) -> KernelUnit:
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


def _dot_precision(config: AttentionConfig) -> str:
    return "ieee"  # fp32 inputs are the exact path; half inputs ignore it


_PLAIN = AttentionVariant()


@functools.lru_cache(maxsize=4096)
def kernel_units(config: AnyAttentionConfig, variant: AttentionVariant = _PLAIN,
                 arch: arch_facts.ArchInfo | None = None) -> tuple[KernelUnit, ...]:
    """What `config` compiles and runs for `variant` on `arch` (None: the arch its family is written for)."""
    if isinstance(config, VendorConfig):
        return (_VENDOR_UNITS[config.direction],)
    t = _ptr(config.dtype)
    bias_t = t
    mask_t = "*u8" if variant.user_mask is UserMask.BOOLEAN else t
    features = [("BIAS", bias_t), ("MASK", mask_t), ("SLOPES", "*fp32")]
    cu = [("CU_Q", "*i32"), ("CU_K", "*i32")]
    base = _feature_constexprs(config, variant)
    if config.family is Family.FWD_WS:
        return (_ws_unit(config, variant, arch),)
    if config.family is Family.FWD_TMA:
        return (_tma_unit(config, variant),)
    if config.family is Family.FWD:
        args = ([("Q", t), ("K", t), ("V", t), ("O", t), ("LSE", "*fp32"), *features, ("SINKS", "*fp32"), *cu]
                + _strides("q") + _strides("k") + _strides("v") + _strides("o") + _strides("l", "bh")
                + list(_FEATURE_STRIDES) + _RUNTIME)
        constexprs = {**base, "HAS_SINKS": variant.sinks, "MASKS_ROWS": variant.masks_rows,
                      "DOT_PRECISION": _dot_precision(config)}
        return (_unit("fwd", _FWD, "attention_fwd", args, constexprs, config, variant),)

    preprocess_args = ([("O", t), ("DO", t), ("DELTA", "*fp32")] + _strides("o") + _strides("do")
                       + _strides("l", "bh") + cu + [("seqlen_q", "i32"), ("seqlen_kv", "i32")])
    preprocess = _unit("preprocess", _BWD, "attention_bwd_preprocess", preprocess_args,
                       {"BLOCK_M": PREPROCESS_BLOCK_M, "HEAD_V": config.head_dim_v,
                        "BLOCK_V": _block(config.head_dim_v), "VARLEN": variant.varlen},
                       config, variant, num_warps=4, num_stages=1)
    common = ([("Q", t), ("K", t), ("V", t), ("DO", t), ("LSE", "*fp32"), ("DELTA", "*fp32")])
    inputs_strides = _strides("q") + _strides("k") + _strides("v") + _strides("do") + _strides("l", "bh")
    dbias = [("DBIAS", "*fp32")]
    dbias_strides = _strides("db", "bhm")
    atomic = config.family is Family.BWD_ATOMIC
    dkdv_args = (common + [("DK", t), ("DV", t), ("DQ_ACC", "*fp32")] + dbias + features + cu + inputs_strides
                 + _strides("dk") + _strides("dv") + _strides("dq") + dbias_strides + list(_FEATURE_STRIDES)
                 + _RUNTIME)
    dkdv = _unit("dkdv", _BWD, "attention_bwd_dkdv", dkdv_args,
                 {**base, "ATOMIC_DQ": atomic, "HAS_DBIAS": variant.bias_grad,
                  "DOT_PRECISION": _dot_precision(config)}, config, variant)
    if config.family is Family.BWD_WS:
        return preprocess, _ws_dkdv_unit(config, variant, arch), _ws_dq_unit(config, variant, arch)
    if atomic:
        convert_args = ([("DQ_ACC", "*fp32"), ("DQ", t)] + _strides("a") + _strides("dq") + cu
                        + [("seqlen_q", "i32"), ("seqlen_kv", "i32")])
        convert = _unit("convert", _BWD, "attention_bwd_convert", convert_args,
                        {"BLOCK_M": PREPROCESS_BLOCK_M, "HEAD_QK": config.head_dim_qk,
                         "BLOCK_QK": _block(config.head_dim_qk), "VARLEN": variant.varlen},
                        config, variant, num_warps=4, num_stages=1)
        return preprocess, dkdv, convert
    dq_args = (common + [("DQ", t)] + dbias + features + cu + inputs_strides + _strides("dq") + dbias_strides
               + list(_FEATURE_STRIDES) + _RUNTIME)
    # The dQ kernel owns block_n query rows and steps block_m keys: the long side stays on chip.
    dq = _unit("dq", _BWD, "attention_bwd_dq", dq_args,
               {**base, "BLOCK_M": config.block_n, "BLOCK_N": config.block_m, "HAS_DBIAS": variant.bias_grad,
                "DOT_PRECISION": _dot_precision(config)}, config, variant)
    return preprocess, dkdv, dq


def _descriptor_blocks(config: AttentionConfig) -> dict[str, tuple[int, int, int, int]]:
    """The (batch, head, rows, d) block each 4-D descriptor moves: one head's rows, whole head dims."""
    return {"q_desc": (1, 1, config.block_m, config.head_dim_qk), "k_desc": (1, 1, config.block_n, config.head_dim_qk),
            "v_desc": (1, 1, config.block_n, config.head_dim_v)}


def _tma_unit(config: AttentionConfig, variant: AttentionVariant) -> KernelUnit:
    t = config.dtype.triton
    descriptors = [(name, f"tensordesc<{t}[{','.join(map(str, block))}]>")
                   for name, block in _descriptor_blocks(config).items()]
    fp8 = config.dtype in FP8_DTYPES
    args = (descriptors + [("O", _ptr(FP8_OUTPUT if fp8 else config.dtype)), ("LSE", "*fp32"), ("SINKS", "*fp32"),
                           ("SCALE_Q", "*fp32"), ("SCALE_K", "*fp32"), ("SCALE_V", "*fp32")] + _strides("o")
            + _strides("l", "bh") + [("seqlen_q", "i32"), ("seqlen_kv", "i32"), ("group", "i32"),
                                     ("sm_scale", "fp32"), ("softcap", "fp32"), ("bottom_right", "i32"),
                                     ("window_left", "i32"), ("window_right", "i32")])
    constexprs = {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "HEAD_QK": config.head_dim_qk,
                  "HEAD_V": config.head_dim_v, "HAS_BAND": variant.band, "HAS_SOFTCAP": softcap_code(variant.softcap),
                  "HAS_SINKS": variant.sinks, "MASKS_ROWS": variant.masks_rows, "FP8": fp8}
    return _unit("fwd", _FWD_TMA, "attention_fwd_tma", args, constexprs, config, variant)


def _ws_blocks(config: AttentionConfig) -> dict[str, tuple[int, int, int, int]]:
    """fwd-ws's descriptor blocks: Q and O by warpgroup (64 rows each), K and V by key block."""
    rows = config.block_m // 2
    return {"q_desc": (1, 1, rows, config.head_dim_qk), "k_desc": (1, 1, config.block_n, config.head_dim_qk),
            "v_desc": (1, 1, config.block_n, config.head_dim_v), "o_desc": (1, 1, rows, config.head_dim_v)}


def _ws_unit(config: AttentionConfig, variant: AttentionVariant, arch: arch_facts.ArchInfo | None) -> KernelUnit:
    """The Gluon forward."""
    constexprs = {"HAS_BAND": variant.band, "HAS_SOFTCAP": variant.softcap, "HAS_SINKS": variant.sinks,
                  "STAGES": config.num_stages}
    return _gluon_unit("fwd", _FWD_WS, "attention_fwd_ws", _ws_blocks(config), [("LSE", "*fp32"), ("SINKS", "*fp32")],
                       constexprs, config, variant, arch)


# What every Gluon stage takes after its descriptors and pointers: the LSE's strides and the problem's scalars.
_GLUON_SCALARS = _strides("l", "bh") + [("seqlen_q", "i32"), ("seqlen_kv", "i32"), ("group", "i32"),
                                        ("sm_scale", "fp32"), ("softcap", "fp32"), ("bottom_right", "i32"),
                                        ("window_left", "i32"), ("window_right", "i32")]


def _gluon_unit(stage: str, module: str, function: str, blocks: dict, pointers: list, constexprs: dict,
                config: AttentionConfig, variant: AttentionVariant, arch: arch_facts.ArchInfo | None) -> KernelUnit:
    """A Gluon stage. It launches as one warpgroup (the first MMA partition); the second and the
    loader's are added by `warp_specialize`."""
    args = _ws_descriptor_types(config, blocks) + pointers + _GLUON_SCALARS
    unit = _unit(stage, module, function, args, constexprs, config, variant, num_warps=4)
    return replace(unit, kind=UnitKind.GLUON, max_registers=_ws_cap(config, arch))


def _ws_descriptor_types(config: AttentionConfig, blocks: dict) -> list[tuple[str, str]]:
    """Gluon descriptor types: the block and the shared-memory layout it lands in."""
    from triton.experimental.gluon import language as gl

    dtype = gl.dtype(config.dtype.triton)
    return [(name, f"tensordesc<{config.dtype.triton}[{', '.join(map(str, block))}],"
                   f"{gl.NVMMASharedLayout.get_default_for(list(block), dtype)!r}>") for name, block in blocks.items()]


def _ws_cap(config: AttentionConfig, arch: arch_facts.ArchInfo | None) -> int:
    """The register cap: what `arch`'s multiprocessor registers give the MMA warpgroups and the loader's
    (by warpgroup). No arch: the one the Gluon families are written for (the one with warpgroup MMA)."""
    arch = arch or next(a for a in map(arch_facts.load, arch_facts.available()) if a.has(arch_facts.Feature.WGMMA))
    return arch.registers_per_sm // ((config.num_warps + 4) * 32) // 8 * 8


_WS_BACKWARD_POINTERS = [("LSE", "*fp32"), ("DELTA", "*fp32")]


def _ws_dkdv_blocks(config: AttentionConfig) -> dict[str, tuple[int, int, int, int]]:
    """bwd-ws's descriptor blocks: K, V, dK and dV by warpgroup (64 keys; at wide heads the
    program's 64, shared), Q and dO by query block."""
    rows = 64
    return {"q_desc": (1, 1, config.block_m, config.head_dim_qk), "k_desc": (1, 1, rows, config.head_dim_qk),
            "v_desc": (1, 1, rows, config.head_dim_v), "do_desc": (1, 1, config.block_m, config.head_dim_v),
            "dk_desc": (1, 1, rows, config.head_dim_qk), "dv_desc": (1, 1, rows, config.head_dim_v)}


def _ws_dkdv_unit(config: AttentionConfig, variant: AttentionVariant, arch: arch_facts.ArchInfo | None) -> KernelUnit:
    """bwd-ws's dK/dV stage; at wide heads the role-split kernel, which shares the narrow one's helpers."""
    wide = config.head_dim_qk in BWD_WS_WIDE_HEAD_DIMS
    module, function = (_BWD_WS_WIDE, "attention_bwd_dkdv_ws_wide") if wide else (_BWD_WS, "attention_bwd_dkdv_ws")
    return _gluon_unit("dkdv", module, function, _ws_dkdv_blocks(config), _WS_BACKWARD_POINTERS,
                       {"HAS_SOFTCAP": variant.softcap, "STAGES": config.num_stages}, config, variant, arch)


def _ws_dq_blocks(config: AttentionConfig) -> dict[str, tuple[int, int, int, int]]:
    """bwd-ws's dQ blocks: Q, dO and dQ by warpgroup (64 rows), K and V by key block."""
    rows, keys = BWD_WS_DQ_ROWS // 2, bwd_ws_dq_keys(config)
    return {"q_desc": (1, 1, rows, config.head_dim_qk), "k_desc": (1, 1, keys, config.head_dim_qk),
            "v_desc": (1, 1, keys, config.head_dim_v), "do_desc": (1, 1, rows, config.head_dim_v),
            "dq_desc": (1, 1, rows, config.head_dim_qk)}


def _ws_dq_unit(config: AttentionConfig, variant: AttentionVariant, arch: arch_facts.ArchInfo | None) -> KernelUnit:
    """bwd-ws's dQ stage."""
    return _gluon_unit("dq", _BWD_WS, "attention_bwd_dq_ws", _ws_dq_blocks(config), _WS_BACKWARD_POINTERS,
                       {"HAS_SOFTCAP": variant.softcap, "STAGES": config.num_stages}, config, variant, arch)


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
            strides[i] = triton.cdiv(span, 16) * 16
    return TensorDescriptor(t, shape, strides, list(block))


def _positive_scale(ops: AttentionOperands) -> tuple[torch.Tensor, float]:
    """K and the scale with scale >= 0: the forwards take rowmax(qk) * c for rowmax(qk * c),
    which holds for c >= 0 only, so a negative scale is moved into a negated copy of K.
    fp8 inputs keep theirs: their kernel scales every score first (its scales are on the GPU)."""
    if ops.scale >= 0 or ops.problem.dtype in FP8_DTYPES:
        return ops.k, ops.scale
    return -ops.k, -ops.scale


_VENDOR_UNITS = {
    Direction.FORWARD: KernelUnit(
        stage="vendor", module=_VENDOR, function="forward",
        signature=tuple((n, "python") for n in ("family", "q", "k", "v", "result", "scale", "causal", "needs_lse")),
        constexprs=(), num_warps=0, num_stages=0, kind=UnitKind.PYTHON),
    Direction.BACKWARD: KernelUnit(
        stage="vendor", module=_VENDOR, function="backward",
        signature=tuple((n, "python") for n in ("family", "grads", "grad_out", "q", "k", "v", "out", "lse",
                                                 "scale", "causal")),
        constexprs=(), num_warps=0, num_stages=0, kind=UnitKind.PYTHON),
}


def _values(unit: KernelUnit, bound: dict) -> tuple:
    constants = dict(unit.constexprs)
    return tuple(bound[name] if name in bound else constants[name] for name, _ in unit.signature)


def _bhs(t: torch.Tensor | None, varlen: bool) -> tuple[int, int, int]:
    """(batch, head, sequence) strides of a 4-D tensor, or of a (tokens, heads, d) varlen one."""
    if t is None:
        return 0, 0, 0
    if varlen:
        return 0, t.stride(1), t.stride(0)
    return t.stride(0), t.stride(1), t.stride(2)


def _named(prefix: str, strides: tuple, dims: str = "bhs") -> dict:
    return {f"stride_{prefix}{d}": s for d, s in zip(dims, strides)}


def _lse_strides(lse: torch.Tensor, varlen: bool) -> dict:
    # (batch, heads, seqlen_q), or (heads, tokens) for varlen
    return _named("l", (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1)), "bh")


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


def _runtime(ops: AttentionOperands) -> dict:
    p = ops.problem
    # -1 (unbounded) and sides past every key as UNBOUNDED: an i32 the kernels add to positions (MAX_SEQLEN)
    left, right = (UNBOUNDED if side < 0 else min(side, UNBOUNDED) for side in p.band(p.seqlen_q, p.seqlen_kv)[1:])
    return {
        "seqlen_q": p.seqlen_q, "seqlen_kv": p.seqlen_kv, "heads_q": p.heads_q, "group": p.group,
        "sm_scale": ops.scale, "softcap": ops.softcap or 1.0, "window_left": left, "window_right": right,
        "bottom_right": 0 if p.mask in (MaskKind.CAUSAL_TOP_LEFT, MaskKind.NONE) else 1,
        "dropout_p": ops.dropout_p, "seed": ops.dropout_seed, "rng_offset": ops.dropout_offset,
    }


def _features(ops: AttentionOperands, dummy: torch.Tensor) -> dict:
    bias, mask, slopes = ops.bias, ops.mask, ops.alibi_slopes
    out = {"BIAS": bias if bias is not None else dummy, "MASK": mask if mask is not None else dummy,
           "SLOPES": slopes if slopes is not None else dummy,
           "CU_Q": ops.cu_seqlens_q if ops.cu_seqlens_q is not None else dummy,
           "CU_K": ops.cu_seqlens_k if ops.cu_seqlens_k is not None else dummy}
    out.update(_named("b", bias.stride() if bias is not None else (0,) * 4, "bhmn"))
    out.update(_named("m", mask.stride() if mask is not None else (0,) * 4, "bhmn"))
    out.update(_named("s", slopes.stride() if slopes is not None else (0, 0), "bh"))
    return out


def _check_grid(p) -> None:
    if p.heads_q > MAX_GRID_YZ or p.batch > MAX_GRID_YZ:
        raise InvalidProblemError(f"batch {p.batch} or heads {p.heads_q} exceeds the grid limit {MAX_GRID_YZ}")


def plan(config: AnyAttentionConfig, ops: AttentionOperands) -> Plan:
    p = ops.problem
    _check_grid(p)
    if p.direction is Direction.FORWARD:
        return _forward(config, ops)
    return _backward(config, ops)


def _forward(config: AnyAttentionConfig, ops: AttentionOperands) -> Plan:
    p = ops.problem
    if isinstance(config, VendorConfig):
        result = AttentionResult(None, None)
        args = (config.family, ops.q, ops.k, ops.v, result, ops.scale, p.mask is not MaskKind.NONE, p.needs_lse)
        return Plan((Launch("vendor", (1, 1, 1), args),), result)
    varlen = p.variant.varlen
    out = like_layout(ops.q, p.head_dim_v, dtype=FP8_OUTPUT.torch if p.dtype in FP8_DTYPES else None)
    lse = _lse_buffer(ops)
    unit = kernel_units(config, p.variant)[0]
    k, scale = _positive_scale(ops)
    grid = (triton.cdiv(p.seqlen_q, config.block_m), p.heads_q, p.batch)
    if config.family is Family.FWD_WS:
        blocks = _ws_blocks(config)
        bound = {**{name: tensor_descriptor(t, blocks[name])
                    for name, t in (("q_desc", ops.q), ("k_desc", k), ("v_desc", ops.v), ("o_desc", out))},
                 "LSE": lse, "SINKS": ops.sinks if ops.sinks is not None else lse, **_lse_strides(lse, False),
                 **_runtime(ops), "sm_scale": scale}
        return Plan((Launch("fwd", grid, _values(unit, bound)),), AttentionResult(out, lse))
    if config.family.uses_tma:
        blocks = _descriptor_blocks(config)
        bound = {"q_desc": tensor_descriptor(ops.q, blocks["q_desc"]), "k_desc": tensor_descriptor(k, blocks["k_desc"]),
                 "v_desc": tensor_descriptor(ops.v, blocks["v_desc"]), "O": out, "LSE": lse,
                 "SINKS": ops.sinks if ops.sinks is not None else lse, **_named("o", _bhs(out, False)),
                 **{name: getattr(ops, name.lower()) if ops.scale_q is not None else lse
                    for name in ("SCALE_Q", "SCALE_K", "SCALE_V")},
                 **_lse_strides(lse, False), **_runtime(ops), "sm_scale": scale}
        return Plan((Launch("fwd", grid, _values(unit, bound)),), AttentionResult(out, lse))
    bound = {"Q": ops.q, "K": k, "V": ops.v, "O": out, "LSE": lse,
             "SINKS": ops.sinks if ops.sinks is not None else lse, **_features(ops, lse),
             **_named("q", _bhs(ops.q, varlen)), **_named("k", _bhs(k, varlen)),
             **_named("v", _bhs(ops.v, varlen)), **_named("o", _bhs(out, varlen)), **_lse_strides(lse, varlen),
             **_runtime(ops), "sm_scale": scale}
    return Plan((Launch("fwd", grid, _values(unit, bound)),), AttentionResult(out, lse))


def _backward(config: AnyAttentionConfig, ops: AttentionOperands) -> Plan:
    p = ops.problem
    if isinstance(config, VendorConfig):
        # The library allocates dQ/dK/dV itself (in Q's and K/V's layouts) and the stage hands
        # them over; the LSE goes as ours, (batch, heads_q, seqlen_q), from whichever forward.
        grads = AttentionGrads(None, None, None, None, None)
        args = (config.family, grads, ops.grad_out, ops.q, ops.k, ops.v, ops.out, ops.lse, ops.scale,
                p.mask is not MaskKind.NONE)
        return Plan((Launch("vendor", (1, 1, 1), args),), grads)
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
    atomic = config.family is Family.BWD_ATOMIC
    dq_acc = None
    if atomic:
        shape = (*ops.q.shape[:-1], p.head_dim_qk)
        dq_acc = torch.zeros(shape, dtype=torch.float32, device=ops.device)
    common = {"Q": ops.q, "K": ops.k, "V": ops.v, "DO": ops.grad_out, "LSE": lse, "DELTA": delta,
              "O": ops.out, "DK": dk, "DV": dv, "DQ": dq, "DQ_ACC": dq_acc if atomic else lse,
              "DBIAS": dbias if dbias is not None else lse, **_features(ops, lse),
              **_named("q", _bhs(ops.q, varlen)), **_named("k", _bhs(ops.k, varlen)),
              **_named("v", _bhs(ops.v, varlen)), **_named("o", _bhs(ops.out, varlen)),
              **_named("do", _bhs(ops.grad_out, varlen)), **_lse_strides(lse, varlen),
              **_named("dk", _bhs(dk, varlen)), **_named("dv", _bhs(dv, varlen)),
              **_named("dq", _bhs(dq_acc if atomic else dq, varlen)),
              **_named("db", dbias.stride()[:3] if dbias is not None else (0, 0, 0), "bhm"),
              **_runtime(ops)}
    q_blocks = triton.cdiv(p.seqlen_q, PREPROCESS_BLOCK_M)
    launches = [Launch("preprocess", (q_blocks, p.heads_q, p.batch), _values(units["preprocess"], common))]
    if config.family is Family.BWD_WS:
        # TMA takes no zero stride: an expanded dO (a loss's sum broadcast) is made dense first
        grad_out = ops.grad_out
        if any(s == 0 and n > 1 for s, n in zip(grad_out.stride(), grad_out.shape)):
            grad_out = grad_out.contiguous()
        tensors = {"q_desc": ops.q, "k_desc": ops.k, "v_desc": ops.v, "do_desc": grad_out, "dk_desc": dk,
                   "dv_desc": dv, "dq_desc": dq}
        dkdv = {**common, **{name: tensor_descriptor(tensors[name], block)
                             for name, block in _ws_dkdv_blocks(config).items()}}
        dq_stage = {**common, **{name: tensor_descriptor(tensors[name], block)
                                 for name, block in _ws_dq_blocks(config).items()}}
        launches.append(Launch("dkdv", (triton.cdiv(p.seqlen_kv, bwd_ws_keys(config)), p.heads_kv, p.batch),
                               _values(units["dkdv"], dkdv)))
        launches.append(Launch("dq", (triton.cdiv(p.seqlen_q, BWD_WS_DQ_ROWS), p.heads_q, p.batch),
                               _values(units["dq"], dq_stage)))
        return Plan(tuple(launches), AttentionGrads(dq, dk, dv, delta, dbias))
    launches.append(Launch("dkdv", (triton.cdiv(p.seqlen_kv, config.block_n), p.heads_kv, p.batch),
                           _values(units["dkdv"], common)))
    if atomic:
        convert = {**common, **_named("a", _bhs(dq_acc, varlen)), **_named("dq", _bhs(dq, varlen))}
        launches.append(Launch("convert", (q_blocks, p.heads_q, p.batch), _values(units["convert"], convert)))
    else:
        launches.append(Launch("dq", (triton.cdiv(p.seqlen_q, config.block_n), p.heads_q, p.batch),
                               _values(units["dq"], common)))
    return Plan(tuple(launches), AttentionGrads(dq, dk, dv, delta, dbias))
