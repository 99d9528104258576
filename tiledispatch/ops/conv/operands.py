"""From user tensors to a checked ConvProblem plus channels-last views the kernels read.

This is the one place that inspects the caller's tensors: shapes, dtypes, devices,
layouts and aliasing. A tensor whose channels are not contiguous (PyTorch's default
NC... layout) is copied into channels-last, and the problem records it so that
`explain` can say so. Everything downstream trusts what this returns.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ...core.args import as_bool, as_int
from ...core.dtypes import DType
from ...core.errors import InvalidArgumentError, InvalidProblemError, UnsupportedError
from ...core.tensors import check_no_alias, check_plain, overlaps_itself
from ..gemm import Activation
from .problem import (
    DTYPES,
    INDEX_LIMIT,
    MAX_DILATION,
    MAX_PADDING,
    MAX_STRIDE,
    ConvEpilogue,
    ConvProblem,
    ConvSpecialization,
    ConvTypes,
    Direction,
    SourceLayout,
    channel_multiple,
    positive_int,
    spatial_tuple,
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
    """A conv input as the kernels may read it: a tensor of 3-5 dims whose memory holds its values
    (a negated view, `x.conj().imag`, is resolved into a copy)."""
    if not isinstance(t, torch.Tensor):
        raise InvalidProblemError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not 3 <= t.dim() <= 5:
        raise InvalidProblemError(
            f"{name} has shape {_shape(t)} ({t.dim()} dims); a conv tensor is (N, C, W), (N, C, H, W) or "
            "(N, C, D, H, W), a weight (K, C/G, *filter)")
    return check_plain(t, name)


def _sizes(value, dims: int, what: str) -> tuple[tuple[int, ...] | None, tuple[int, ...]]:
    """A full shape or the spatial sizes only -> (the leading two sizes if given, the spatial sizes).
    Each size is an integer >= 1: a float is refused, not truncated."""
    try:  # a tuple, a list, a torch.Size or a 1-D array of integers
        items = None if isinstance(value, (str, bytes)) else tuple(value)
    except TypeError:
        items = None
    if items is None:
        raise InvalidArgumentError(f"{what} must be a tuple of sizes (a full shape or the {dims} spatial sizes), "
                                   f"got {value!r} ({type(value).__name__})")
    if len(items) not in (dims, dims + 2):
        raise InvalidProblemError(f"{what} {items} must be the full shape ({dims + 2} values) or the "
                                  f"{dims} spatial sizes of a {dims}-D conv")
    sizes = tuple(as_int(v, f"{what}[{i}]", low=1, high=INDEX_LIMIT - 1) for i, v in enumerate(items))
    return (sizes[:2], sizes[2:]) if len(sizes) == dims + 2 else (None, sizes)


def _padding(padding, filt: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...],
             direction: Direction) -> tuple[int, ...]:
    """Padding as integers, or 'valid' (none) or 'same' (the output the input's size, at stride 1), as
    torch.nn.functional.conv2d takes them."""
    dims = len(filt)
    if not isinstance(padding, str):
        return spatial_tuple(padding, dims, "padding", 0, MAX_PADDING)
    if padding == "valid":
        return (0,) * dims
    if padding != "same":
        raise InvalidArgumentError(f"padding={padding!r} must be 'valid', 'same' or {dims} integers")
    if any(s != 1 for s in stride):
        raise InvalidArgumentError(f"padding='same' needs stride 1 (as in torch.nn.functional.conv{dims}d); the "
                                   f"stride is {stride}: give the padding as integers")
    totals = tuple(d * (f - 1) for d, f in zip(dilation, filt))
    if all(t % 2 == 0 for t in totals):
        return tuple(t // 2 for t in totals)
    # PyTorch pads t // 2 before and the rest after: one more zero at the end where t is odd.
    symmetric = tuple(t // 2 for t in totals)
    hint = ""
    if direction is Direction.FORWARD:
        ends = tuple(v for t in reversed(totals) for v in (0, t % 2))
        hint = f"; the same conv is conv(torch.nn.functional.pad(x, {ends}), w, padding={symmetric})"
    raise UnsupportedError(
        f"padding='same' with filter {filt} and dilation {dilation} pads {totals} in all, one more zero after "
        f"than before where that is odd, and tiledispatch's kernels pad both sides alike{hint}")


def _geometry(direction: Direction, tensors: dict, groups: int, input_size, weight_size, dims: int):
    """(N, C, K, spatial sizes, filter sizes) of the call, each tensor's shape checked against the others."""
    x, w, dy = tensors.get("x"), tensors.get("w"), tensors.get("dy")
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
        lead, spatial = _sizes(input_size, dims, "input_size")
        if lead is not None and lead != (n, c):
            raise InvalidProblemError(f"input_size {(*lead, *spatial)} must start with (N, C) = ({n}, {c}) "
                                      f"for dy {_shape(dy)} and w {_shape(w)} with groups={groups}")
        if w.shape[0] != k:
            raise InvalidProblemError(f"w is {_shape(w)} but dy is {_shape(dy)}: w's K={w.shape[0]} must equal "
                                      f"dy's channels {k}")
    else:
        if weight_size is None:
            raise InvalidProblemError("bwd_weight needs weight_size: the shape of w (K, C/G, *filter)")
        n, c, spatial = x.shape[0], x.shape[1], tuple(x.shape[2:])
        k = dy.shape[1]
        lead, filt = _sizes(weight_size, dims, "weight_size")
        if lead is not None and (lead[0] != k or lead[1] * groups != c):
            raise InvalidProblemError(
                f"weight_size {(*lead, *filt)} must start with (K, C/G) = ({k}, {c}/{groups}) for x "
                f"{_shape(x)}, dy {_shape(dy)} and groups={groups}")
        if dy.shape[0] != n:
            raise InvalidProblemError(f"x is {_shape(x)} and dy is {_shape(dy)}: their batch sizes differ")
    return n, c, k, spatial, filt


def _read_tensors(direction: Direction, given: dict) -> dict:
    """The tensors `direction` reads, by role, checked alike: type, rank, device, dtype, plain memory."""
    reads = ROLES[direction][0]
    for role, t in given.items():
        if role not in reads and t is not None:
            raise InvalidProblemError(f"{direction.value} takes {' and '.join(reads)}, not {role}")
    tensors = {role: _tensor(given[role], role) for role in reads}
    first = tensors[reads[0]]
    device, dims = first.device, first.dim() - 2
    for role, t in tensors.items():
        if t.device != device:
            raise InvalidProblemError(f"{role} is on {t.device} but {reads[0]} is on {device}; "
                                      "put every tensor on one device")
        if t.dim() != dims + 2:
            raise InvalidProblemError(f"{reads[0]} is {_shape(first)} ({dims}-D conv) but {role} is {_shape(t)}: "
                                      f"give every tensor {dims + 2} dims")
        if t.numel() == 0:
            raise InvalidProblemError(f"{role} is {_shape(t)}, with no elements: a conv needs at least one "
                                      "image, channel and pixel in every tensor")
    dtype = _dtype(first, reads[0])
    for role, t in tensors.items():
        if _dtype(t, role) is not dtype:
            raise UnsupportedError(f"{reads[0]} is {dtype.value} but {role} is {_dtype(t, role).value}; "
                                   "give every tensor one dtype")
    return tensors


def check_operands(direction, *, x=None, w=None, dy=None, stride=1, padding=0, dilation=1, groups: int = 1,
                   bias=None, activation=None, residual=None, out=None, input_size=None, weight_size=None,
                   allow_tf32: bool = False) -> ConvOperands:
    """Checks a conv call; every mismatch raises InvalidProblemError or UnsupportedError saying the fix.

    forward: x, w (-> y); bwd_data: dy, w and input_size (-> dx); bwd_weight: x, dy and
    weight_size (-> dw). Sizes may be full shapes or spatial sizes only; padding may be
    'valid' or 'same'.
    """
    direction = Direction.parse(direction)
    tensors = _read_tensors(direction, {"x": x, "w": w, "dy": dy})
    first = next(iter(tensors.values()))
    dims, dtype = first.dim() - 2, DType.from_torch(first.dtype)
    groups = positive_int(groups, "groups")
    allow_tf32 = as_bool(allow_tf32, "allow_tf32")
    activation = Activation.of_argument(activation)
    if direction is not Direction.FORWARD and (bias is not None or residual is not None
                                              or activation is not Activation.NONE):
        raise InvalidProblemError(f"bias, activation and residual apply to the forward conv only, "
                                  f"not {direction.value}")
    n, c, k, spatial, filt = _geometry(direction, tensors, groups, input_size, weight_size, dims)
    stride = spatial_tuple(stride, dims, "stride", 1, MAX_STRIDE)
    dilation = spatial_tuple(dilation, dims, "dilation", 1, MAX_DILATION)
    padding = _padding(padding, filt, stride, dilation, direction)
    epilogue = ConvEpilogue(bias is not None, activation, residual is not None)
    probe = ConvProblem(direction, n, c, k, groups, spatial, filt, stride, padding, dilation,
                        ConvTypes(dtype, allow_tf32), epilogue)  # checks groups, sizes and output >= 1
    if direction is not Direction.FORWARD and tuple(tensors["dy"].shape[2:]) != probe.output_size:
        raise InvalidProblemError(
            f"dy is {_shape(tensors['dy'])} but this conv's output is {'x'.join(map(str, probe.output_size))} "
            f"(input {probe.input_size}, filter {probe.filter_size}, stride {probe.stride}, padding "
            f"{probe.padding}, dilation {probe.dilation}); check the sizes and conv arguments")
    return _operands(probe, tensors, bias, residual, out)


def _operands(probe: ConvProblem, tensors: dict, bias, residual, out) -> ConvOperands:
    """The checked tensors of a well-formed problem: views the kernels read, the output checked, and the
    problem specialised on the data (alignment, offsets, layout)."""
    p, direction = probe, probe.direction
    dtype, device = p.types.dtype, next(iter(tensors.values())).device
    converted = []

    def channels_last(t, role):
        if is_channels_last(t):
            return t
        converted.append(role)
        return to_channels_last(t)

    views = {role: channels_last(t, role) for role, t in tensors.items()}
    y_shape = (p.n, p.k, *p.output_size)
    if bias is not None:
        bias = _bias(bias, p.k, dtype, device)
        if bias.stride(0) != 1 and p.k > 1:  # the kernels read bias[k] at k: a strided bias is copied dense
            bias = bias.contiguous()
            converted.append("bias")
    if residual is not None:
        if not isinstance(residual, torch.Tensor):
            raise InvalidProblemError(f"residual must be a torch.Tensor shaped as the output, "
                                      f"{'x'.join(map(str, y_shape))}, got {type(residual).__name__}")
        if tuple(residual.shape) != y_shape:
            raise InvalidProblemError(f"residual is {_shape(residual)}; it must have the output's shape "
                                      f"{'x'.join(map(str, y_shape))}")
        _same(residual, "residual", dtype, device)
        residual = channels_last(check_plain(residual, "residual"), "residual")
    shape_out = {Direction.FORWARD: y_shape, Direction.BWD_DATA: (p.n, p.c, *p.input_size),
                 Direction.BWD_WEIGHT: (p.k, p.c_per_group, *p.filter_size)}[direction]
    if out is not None:
        _check_out(out, ROLES[direction][1], shape_out, dtype, device)
        check_no_alias(out, {**views, "bias": bias}, in_place_ok={"residual": residual})
    return _specialised(p, views, bias, residual, out, tuple(converted))


def _bias(bias, k: int, dtype: DType, device) -> torch.Tensor:
    if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (k,):
        raise InvalidProblemError(f"bias must be a tensor of shape ({k},) (one value per output channel), "
                                  f"got {_shape(bias) if isinstance(bias, torch.Tensor) else type(bias).__name__}")
    _same(bias, "bias", dtype, device)
    return check_plain(bias, "bias")


def _check_out(out, writes: str, shape: tuple[int, ...], dtype: DType, device) -> None:
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape:
        raise InvalidProblemError(f"out ({writes}) must have shape {'x'.join(map(str, shape))}, got "
                                  f"{_shape(out) if isinstance(out, torch.Tensor) else type(out).__name__}")
    _same(out, "out", dtype, device)
    check_plain(out, "out", written=True)
    if out.requires_grad and torch.is_grad_enabled():
        raise InvalidProblemError("out requires grad, and autograd cannot follow a write into it: pass an out "
                                  "that does not require grad, or call under torch.no_grad()")
    if not is_channels_last(out):
        raise InvalidProblemError(
            f"out has strides {tuple(out.stride())}: its channels (dim 1) must be contiguous; pass "
            "out.contiguous(memory_format=torch.channels_last) or let tiledispatch allocate it")
    if overlaps_itself(out):
        raise InvalidProblemError(f"out (strides {tuple(out.stride())}) overlaps itself; pass a dense tensor")


def largest_offset(t: torch.Tensor) -> int:
    """The element offset of `t`'s last element from its first (strides are never negative in PyTorch)."""
    return sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 1)


def _specialised(probe: ConvProblem, views: dict, bias, residual, out, converted: tuple[str, ...]) -> ConvOperands:
    """The problem with the facts of its data: alignment (ConvSpecialization), the source layout and
    whether an offset needs 64 bits."""
    p, direction, itemsize = probe, probe.direction, probe.types.dtype.itemsize
    written = [t for t in (out,) if t is not None]
    # Activations (x, y, dx, dy, residual, bias) are read in channel runs across groups; weights
    # only within a group, so their alignment belongs with the per-group channel counts.
    weights = [views[r] for r in views if r == "w"] + (written if direction is Direction.BWD_WEIGHT else [])
    activations = [views[r] for r in views if r != "w"] + ([] if direction is Direction.BWD_WEIGHT else written)
    activations += [t for t in (residual, bias) if t is not None]
    aligned = _aligned(activations, (p.c, p.k), itemsize)
    groups_aligned = _aligned(weights, (p.c_per_group, p.k_per_group), itemsize)
    output_side = [views["dy"]] if "dy" in views else written + ([residual] if residual is not None else [])
    outputs_aligned = _aligned(output_side, (p.k, p.k_per_group), itemsize)
    wide = any(largest_offset(t) >= INDEX_LIMIT for t in (*views.values(), bias, residual, out) if t is not None)
    layout = SourceLayout.CONVERTED if any(role != "bias" for role in converted) else SourceLayout.CHANNELS_LAST
    specialization = ConvSpecialization(aligned, groups_aligned, p.pointwise, p.one_channel_per_group,
                                        p.unit_stride, channel_multiple(p.c_per_group, p.k_per_group),
                                        outputs_aligned, p.one_row)
    problem = replace(p, specialization=specialization, source_layout=layout, wide_offsets=wide)
    return ConvOperands(problem, views.get("x"), views.get("w"), views.get("dy"), bias, residual, out, converted)


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
    if t.dtype != dtype.torch:
        try:
            name = DType.from_torch(t.dtype).value
        except UnsupportedError:
            name = str(t.dtype)
        raise InvalidProblemError(f"{role} is {name}; it must be {dtype.value} like the inputs")
