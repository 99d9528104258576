"""From user tensors to a checked ConvProblem plus channels-last views the kernels read.

This is the one place that inspects the caller's tensors: shapes, dtypes, devices,
layouts and aliasing. A tensor whose channels are not contiguous (PyTorch's default
NC... layout) is copied into channels-last, and the problem records it so that
`explain` can say so. Everything downstream trusts what this returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.dtypes import DType
from ...core.errors import InvalidProblemError, UnsupportedError
from ...core.tensors import check_no_alias, overlaps_itself
from ..gemm.problem import Activation
from .problem import (
    DTYPES,
    ConvEpilogue,
    ConvProblem,
    ConvSpecialization,
    ConvTypes,
    Direction,
    SourceLayout,
    channel_multiple,
)

ROLES = {  # the tensors each direction reads, and the one it writes
    Direction.FORWARD: (("x", "w"), "y"),
    Direction.BWD_DATA: (("dy", "w"), "dx"),
    Direction.BWD_WEIGHT: (("x", "dy"), "dw"),
}


@dataclass(frozen=True)
class ConvOperands:
    problem: ConvProblem
    x: torch.Tensor | None  # (N, C, *spatial), channel stride 1; forward and bwd_weight
    w: torch.Tensor | None  # (K, C/G, *filter), channel stride 1; forward and bwd_data
    dy: torch.Tensor | None  # (N, K, *out spatial), channel stride 1; bwd_data and bwd_weight
    bias: torch.Tensor | None  # (K,)
    residual: torch.Tensor | None  # shaped as y, channel stride 1
    out: torch.Tensor | None  # the caller's output (channel stride 1), else None: allocate
    converted: tuple[str, ...] = ()  # roles copied from a contiguous layout into channels-last

    @property
    def device(self) -> torch.device:
        return next(t for t in (self.x, self.w, self.dy) if t is not None).device

    def output_shape(self) -> tuple[int, ...]:
        p = self.problem
        if p.direction is Direction.FORWARD:
            return (p.n, p.k, *p.output_size)
        if p.direction is Direction.BWD_DATA:
            return (p.n, p.c, *p.input_size)
        return (p.k, p.c_per_group, *p.filter_size)


def _shape(t: torch.Tensor) -> str:
    return "x".join(map(str, t.shape))


def channels_last_empty(shape: tuple[int, ...], dtype, device) -> torch.Tensor:
    """An uninitialised tensor of logical shape (A, B, *spatial) with B contiguous (channels-last)."""
    perm = (0, *range(2, len(shape)), 1)
    storage = torch.empty([shape[i] for i in perm], dtype=dtype, device=device)
    inverse = [perm.index(i) for i in range(len(shape))]
    return storage.permute(*inverse)


def to_channels_last(t: torch.Tensor) -> torch.Tensor:
    """A channels-last copy of t (any rank 3..5): channel stride 1, then W, H, D, N outermost."""
    out = channels_last_empty(tuple(t.shape), t.dtype, t.device)
    out.copy_(t)
    return out


def is_channels_last(t: torch.Tensor) -> bool:
    """Channel dim (dim 1) contiguous; the other strides are free (they are kernel arguments)."""
    return t.shape[1] == 1 or t.stride(1) == 1


def _aligned(tensors, counts, itemsize: int) -> bool:
    """Whether base pointers, strides of non-unit dims and `counts` (channels) are all multiples of 16 bytes."""
    return all(t.data_ptr() % 16 == 0 and all((s * itemsize) % 16 == 0 for s, n in zip(t.stride(), t.shape)
                                              if n > 1 and s != 1) for t in tensors) and all(
        (c * itemsize) % 16 == 0 for c in counts)


def _tensor(t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise InvalidProblemError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not 3 <= t.dim() <= 5:
        raise InvalidProblemError(
            f"{name} has shape {_shape(t)} ({t.dim()} dims); a conv tensor is (N, C, W), (N, C, H, W) or "
            "(N, C, D, H, W), a weight (K, C/G, *filter)")
    return t


def _sizes(value, dims: int, what: str) -> tuple[int, ...]:
    """A full shape (leading 2 dims given) or spatial sizes only -> spatial sizes."""
    value = tuple(int(v) for v in value)
    if len(value) == dims + 2:
        return value[2:]
    if len(value) == dims:
        return value
    raise InvalidProblemError(f"{what} {value} must be the full shape ({dims + 2} values) or the "
                              f"{dims} spatial sizes of a {dims}-D conv")


def check_operands(direction, *, x=None, w=None, dy=None, stride=1, padding=0, dilation=1, groups: int = 1,
                   bias=None, activation=None, residual=None, out=None, input_size=None, weight_size=None,
                   allow_tf32: bool = False) -> ConvOperands:
    """Checks a conv call; every mismatch raises InvalidProblemError or UnsupportedError saying the fix.

    forward: x, w (-> y); bwd_data: dy, w and input_size (-> dx); bwd_weight: x, dy and
    weight_size (-> dw). Sizes may be full shapes or spatial sizes only.
    """
    direction = Direction.parse(direction)
    reads, writes = ROLES[direction]
    given = {"x": x, "w": w, "dy": dy}
    for role, t in given.items():
        if role not in reads and t is not None:
            raise InvalidProblemError(f"{direction.value} takes {' and '.join(reads)}, not {role}")
    for role in reads:
        _tensor(given[role], role)
    tensors = {role: given[role] for role in reads}
    first = tensors[reads[0]]
    device, dims = first.device, first.dim() - 2
    for role, t in tensors.items():
        if t.device != device:
            raise InvalidProblemError(f"{role} is on {t.device} but {reads[0]} is on {device}; "
                                      "put every tensor on one device")
        if t.dim() != dims + 2:
            raise InvalidProblemError(f"{reads[0]} is {_shape(first)} ({dims}-D conv) but {role} is {_shape(t)}: "
                                      f"give every tensor {dims + 2} dims")
    dtype = _dtype(first, reads[0])
    for role, t in tensors.items():
        if _dtype(t, role) is not dtype:
            raise UnsupportedError(f"{reads[0]} is {dtype.value} but {role} is {_dtype(t, role).value}; "
                                   "give every tensor one dtype")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise InvalidProblemError(f"groups={groups!r} must be a positive integer")
    if direction is not Direction.FORWARD and (bias is not None or residual is not None
                                              or Activation.parse(activation) is not Activation.NONE):
        raise InvalidProblemError(f"bias, activation and residual apply to the forward conv only, "
                                  f"not {direction.value}")

    if direction is Direction.FORWARD:
        n, c, spatial = x.shape[0], x.shape[1], tuple(x.shape[2:])
        k, filt = w.shape[0], tuple(w.shape[2:])
        if w.shape[1] * groups != c:
            raise InvalidProblemError(
                f"w is {_shape(w)}: its C/G={w.shape[1]} times groups={groups} must equal x's C={c} "
                f"(x is {_shape(x)}); a weight for this x is ({k}, {c // groups if c % groups == 0 else '?'}, ...)")
    elif direction is Direction.BWD_DATA:
        if input_size is None:
            raise InvalidProblemError("bwd_data needs input_size: the shape of x (N, C, *spatial)")
        n, k = dy.shape[0], dy.shape[1]
        c, filt = w.shape[1] * groups, tuple(w.shape[2:])
        spatial = _sizes(input_size, dims, "input_size")
        if len(input_size) == dims + 2 and tuple(input_size[:2]) != (n, c):
            raise InvalidProblemError(f"input_size {tuple(input_size)} must start with (N, C) = ({n}, {c}) "
                                      f"for dy {_shape(dy)} and w {_shape(w)} with groups={groups}")
        if w.shape[0] != k:
            raise InvalidProblemError(f"w is {_shape(w)} but dy is {_shape(dy)}: w's K={w.shape[0]} must equal "
                                      f"dy's channels {k}")
    else:
        if weight_size is None:
            raise InvalidProblemError("bwd_weight needs weight_size: the shape of w (K, C/G, *filter)")
        n, c, spatial = x.shape[0], x.shape[1], tuple(x.shape[2:])
        k = dy.shape[1]
        filt = _sizes(weight_size, dims, "weight_size")
        if len(weight_size) == dims + 2 and (weight_size[0] != k or weight_size[1] * groups != c):
            raise InvalidProblemError(
                f"weight_size {tuple(weight_size)} must start with (K, C/G) = ({k}, {c}/{groups}) for x "
                f"{_shape(x)}, dy {_shape(dy)} and groups={groups}")
        if dy.shape[0] != n:
            raise InvalidProblemError(f"x is {_shape(x)} and dy is {_shape(dy)}: their batch sizes differ")

    epilogue = ConvEpilogue(bias is not None, Activation.parse(activation), residual is not None)
    probe = ConvProblem(direction, n, c, k, groups, spatial, filt, stride, padding, dilation,
                        ConvTypes(dtype, allow_tf32), epilogue)  # checks groups, sizes and output >= 1
    if direction is not Direction.FORWARD:
        want = probe.output_size
        if tuple(dy.shape[2:]) != want:
            raise InvalidProblemError(
                f"dy is {_shape(dy)} but this conv's output is {'x'.join(map(str, want))} (input "
                f"{probe.input_size}, filter {probe.filter_size}, stride {probe.stride}, padding {probe.padding}, "
                f"dilation {probe.dilation}); check the sizes and conv arguments")

    converted = []

    def channels_last(t, role):
        if is_channels_last(t):
            return t
        converted.append(role)
        return to_channels_last(t)

    views = {role: channels_last(t, role) for role, t in tensors.items()}
    y_shape = (n, k, *probe.output_size)
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (k,):
            raise InvalidProblemError(f"bias must be a tensor of shape ({k},) (one value per output channel), "
                                      f"got {_shape(bias) if isinstance(bias, torch.Tensor) else type(bias).__name__}")
        _same(bias, "bias", dtype, device)
    if residual is not None:
        if not isinstance(residual, torch.Tensor) or tuple(residual.shape) != y_shape:
            raise InvalidProblemError(f"residual must have the output's shape {'x'.join(map(str, y_shape))}")
        _same(residual, "residual", dtype, device)
        residual = channels_last(residual, "residual")
    shape_out = {Direction.FORWARD: y_shape, Direction.BWD_DATA: (n, c, *spatial),
                 Direction.BWD_WEIGHT: (k, c // groups, *filt)}[direction]
    if out is not None:
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape_out:
            raise InvalidProblemError(f"out ({writes}) must have shape {'x'.join(map(str, shape_out))}, got "
                                      f"{_shape(out) if isinstance(out, torch.Tensor) else type(out).__name__}")
        _same(out, "out", dtype, device)
        if not is_channels_last(out):
            raise InvalidProblemError(
                f"out has strides {tuple(out.stride())}: its channels (dim 1) must be contiguous; pass "
                "out.contiguous(memory_format=torch.channels_last) or let tiledispatch allocate it")
        if overlaps_itself(out):
            raise InvalidProblemError(f"out (strides {tuple(out.stride())}) overlaps itself; pass a dense tensor")
        check_no_alias(out, {**views, "bias": bias})

    written = [t for t in (out,) if t is not None]
    # Activations (x, y, dx, dy, residual, bias) are read in channel runs across groups; weights
    # only within a group, so their alignment belongs with the per-group channel counts.
    weights = [views[r] for r in views if r == "w"] + (written if direction is Direction.BWD_WEIGHT else [])
    activations = [views[r] for r in views if r != "w"] + ([] if direction is Direction.BWD_WEIGHT else written)
    activations += [t for t in (residual, bias) if t is not None]
    aligned = _aligned(activations, (c, k), dtype.itemsize)
    groups_aligned = _aligned(weights, (probe.c_per_group, probe.k_per_group), dtype.itemsize)
    output_side = [views["dy"]] if "dy" in views else written + ([residual] if residual is not None else [])
    outputs_aligned = _aligned(output_side, (k, probe.k_per_group), dtype.itemsize)
    problem = ConvProblem(direction, n, c, k, groups, spatial, filt, probe.stride, probe.padding, probe.dilation,
                          probe.types, epilogue,
                          ConvSpecialization(aligned, groups_aligned, probe.pointwise,
                                             probe.one_channel_per_group, probe.unit_stride,
                                             channel_multiple(probe.c_per_group, probe.k_per_group),
                                             outputs_aligned, probe.one_row),
                          SourceLayout.CONVERTED if converted else SourceLayout.CHANNELS_LAST)
    return ConvOperands(problem, views.get("x"), views.get("w"), views.get("dy"), bias, residual, out,
                        tuple(converted))


def _dtype(t: torch.Tensor, role: str) -> DType:
    try:
        dtype = DType.from_torch(t.dtype)
    except UnsupportedError as e:
        raise UnsupportedError(f"{role}: {e}") from None
    if dtype not in DTYPES:
        raise UnsupportedError(f"{role} is {dtype.value}; conv takes fp16, bf16 or fp32 (tf32 with allow_tf32)")
    return dtype


def _same(t: torch.Tensor, role: str, dtype: DType, device) -> None:
    if t.device != device:
        raise InvalidProblemError(f"{role} is on {t.device}, the conv's tensors on {device}; use one device")
    if _dtype(t, role) is not dtype:
        raise InvalidProblemError(f"{role} is {_dtype(t, role).value}; it must be {dtype.value} like the inputs")
