"""The grouped-convolution problem, described without any tensor.

Layouts are channels-last, PyTorch's memory format for a grouped conv: input NWGC /
NHWGC / NDHWGC, weight GKXC / GKYXC / GKZYXC, output NWGK / NHWGK / NDHWGK, where C and
K are totals over the G groups (each group sees C/G input and K/G output channels).
1-D and 2-D problems are 3-D ones with leading spatial dims of size 1, which is how
every kernel reads them.
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass, replace
from typing import ClassVar

from ...core.args import as_int
from ...core.choice import Choice
from ...core.dtypes import DType
from ...core.errors import InvalidArgumentError, InvalidProblemError, UnsupportedError
from ...core.op import OpKind
from ..gemm import Epilogue

KIND = OpKind("conv")  # this op's name: its specs' and problems' `op`, registered in __init__.py

MAX_SPATIAL_DIMS = 3
DTYPES = (DType.FP16, DType.BF16, DType.FP32)
# The first value a 32-bit index cannot hold. The Triton kernels compute pixel indices and
# element offsets in 32 bits: a tensor with an element this far from its first one needs 64-bit
# indexing (`ConvProblem.wide_offsets`), which only the vendor path has.
INDEX_LIMIT = 2**31
# Bounds of the geometry arguments. Backward-data takes t * dilation mod stride for t < stride
# (geometry.phase_taps) and every kernel o * stride - padding + f * dilation, in 32 bits: with
# stride and dilation below 2**15 each product stays under 2**30, and a padded extent under
# INDEX_LIMIT (checked per problem) keeps the sums in range. Any larger value is past every
# input's extent anyway (an output of one pixel).
MAX_STRIDE = MAX_DILATION = 2**15
MAX_PADDING = 2**20


class Direction(Choice):
    """Which of the three convolutions: the roles of its tensors differ (see `ROLES`)."""

    FORWARD = "forward"  # (x, w) -> y
    BWD_DATA = "bwd_data"  # (dy, w) -> dx
    BWD_WEIGHT = "bwd_weight"  # (x, dy) -> dw

    @property
    def short(self) -> str:
        """The spelling in kernel names."""
        return {Direction.FORWARD: "fwd", Direction.BWD_DATA: "bwdd", Direction.BWD_WEIGHT: "bwdw"}[self]


class SourceLayout(enum.Enum):
    """How the caller's tensors were laid out: channels-last, or contiguous and copied into it."""

    CHANNELS_LAST = "channels-last"
    CONVERTED = "converted-from-contiguous"  # one extra copy per converted tensor, said in `explain`


@dataclass(frozen=True)
class ConvTypes:
    """One element type for every tensor, accumulation in fp32; `allow_tf32` lets fp32 use tensor cores."""

    dtype: DType = DType.FP16
    allow_tf32: bool = False

    @property
    def name(self) -> str:
        return "tf32" if self.dtype is DType.FP32 and self.allow_tf32 else self.dtype.value

    @classmethod
    def parse(cls, text: str, allow_tf32: bool = False) -> ConvTypes:
        """From a CLI dtype: fp16, bf16, fp32, tf32."""
        if str(text).lower() == "tf32":
            return cls(DType.FP32, True)
        dtype = DType.parse(text)
        if dtype not in DTYPES:
            raise UnsupportedError(f"conv dtype {dtype.value} is not supported; use fp16, bf16, fp32 or tf32")
        return cls(dtype, allow_tf32)


# Forward only, in this order: bias (per output channel), activation, residual (shaped as y):
# the GEMM's epilogue, the same steps in the same order.
ConvEpilogue = Epilogue


MAX_CHANNEL_MULTIPLE = 128  # the largest block_k: beyond it, a larger multiple changes no code


def channel_multiple(*counts: int) -> int:
    """The largest power of two (at most MAX_CHANNEL_MULTIPLE) that divides every count."""
    multiple = MAX_CHANNEL_MULTIPLE
    while multiple > 1 and any(c % multiple for c in counts):
        multiple //= 2
    return multiple


@dataclass(frozen=True)
class ConvSpecialization:
    """Facts about the data that the compiled code may assume: the artifact is specialised on them.

    `aligned`: base pointers, every pixel and filter stride, and the C and K totals are
    multiples of 16 bytes, so a run of channels read across groups (the direct family)
    is 16-byte vectors. `groups_aligned`: besides, C/G and K/G are multiples of 16 bytes,
    so a run of one group's channels (the implicit GEMM) is too. `pointwise`: a 1x1
    filter, stride 1, no padding (an output pixel reads its own input pixel: no bounds
    arithmetic). `depthwise`: C/G = K/G = 1 (one channel per lane, no group arithmetic).
    `unit_stride`: stride 1 in every dim, so backward-data finds the output pixel of a
    tap by a subtraction (no division, no divisibility mask). `channel_multiple`: a power
    of two dividing C/G and K/G; an implicit GEMM whose block_k divides it reads whole
    channel blocks and drops the channel mask from its loop. `outputs_aligned`: the
    output-channel side alone (y or dy and the residual: pointers and pixel strides; K and
    K/G) is 16-byte aligned, as in a stem of C=3 and K=64, whose implicit GEMM then moves
    dy and y in vectors though x and w take element loads. `one_row`: the filter is one row
    (1 along D and H: 1-D convs, 1xK filters), so a window kernel runs straight through it
    and frees each output's registers once stored (Mamba's conv1d: 253 -> 142 registers a
    thread). Every kernel serves every specialisation; a problem claiming a fact about its
    shape that it lacks is refused (ConvProblem).
    """

    aligned: bool = True
    groups_aligned: bool = True
    pointwise: bool = False
    depthwise: bool = False
    unit_stride: bool = False
    channel_multiple: int = 1
    outputs_aligned: bool = True
    one_row: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups_aligned", self.groups_aligned and self.aligned)
        object.__setattr__(self, "outputs_aligned", self.outputs_aligned or self.groups_aligned)
        if self.channel_multiple not in {2**i for i in range(MAX_CHANNEL_MULTIPLE.bit_length())}:
            raise InvalidProblemError(f"channel_multiple={self.channel_multiple} must be a power of two "
                                      f"up to {MAX_CHANNEL_MULTIPLE}")

    @property
    def tag(self) -> str:
        return (f"al{int(self.aligned)}{int(self.groups_aligned)}" + ("-pw" if self.pointwise else "")
                + ("-dw" if self.depthwise else "") + ("-s1" if self.unit_stride else "")
                + (f"-c{self.channel_multiple}" if self.channel_multiple > 1 else "")
                + ("-ya" if self.outputs_aligned and not self.groups_aligned else "") + ("-r1" if self.one_row else ""))

    def vector(self, dtype: DType, per_group: bool) -> int:
        """Elements per guaranteed 16-byte run of channels (1: no guarantee), across or within groups."""
        return 16 // dtype.itemsize if (self.groups_aligned if per_group else self.aligned) else 1

    def output_vector(self, dtype: DType) -> int:
        """Elements per guaranteed 16-byte run of one group's output channels (y, dy), 1 if none."""
        return 16 // dtype.itemsize if self.outputs_aligned else 1

    def even_channels(self, block_k: int) -> bool:
        """Whether every channel block of block_k is whole (no channel mask needed)."""
        return self.channel_multiple % block_k == 0

    def channels_padded(self, dtype: DType) -> ConvSpecialization:
        """What a problem of this specialisation becomes with its input channels padded to whole 16-byte
        vectors (ConvProblem.channels_padded): its x and w fresh copies, y / dy its own (16-byte aligned)."""
        vector = 16 // dtype.itemsize
        return ConvSpecialization(True, True, self.pointwise, False, self.unit_stride, vector, True, self.one_row)


def spatial_tuple(value, dims: int, what: str, low: int, high: int) -> tuple[int, ...]:
    """One integer for every spatial dim, or a sequence of `dims` (or 1) integers, each in [low, high].

    Python and NumPy integers (and 0-d integer tensors) are integers; bools, floats and strings
    are refused, not converted.
    """
    if isinstance(value, (str, bytes)):
        raise InvalidArgumentError(f"{what} must be an integer or {dims} integers, got the string {value!r}")
    try:
        if isinstance(value, int):  # tested first: torch.compile's tracer cannot follow tuple(int)'s TypeError
            raise TypeError
        items = tuple(value)
        names = [f"{what}[{i}]" for i in range(len(items))]
    except TypeError:  # a scalar: as_int below says what is wrong with it, if anything
        items, names = (value,) * dims, [what] * dims
    if len(items) == 1 and dims > 1:
        names = names * dims
        items = items * dims
    if len(items) != dims:
        raise InvalidArgumentError(
            f"{what} has {len(items)} values ({items}) for a {dims}-D convolution; give {dims}")
    out = tuple(as_int(v, name) for v, name in zip(items, names))
    if any(v < low for v in out):
        raise InvalidArgumentError(f"{what} {out} must hold integers >= {low}")
    if any(v > high for v in out):
        raise InvalidArgumentError(f"{what} {out} must hold integers <= {high} (the kernels index in 32 bits)")
    return out


def positive_int(value, what: str, high: int = INDEX_LIMIT - 1) -> int:
    """A count (N, C, K, groups): an integer in [1, high]; a bool, a float or a string is refused."""
    try:
        number = as_int(value, what)
    except InvalidArgumentError:
        number = 0
    if not 1 <= number <= high:
        raise InvalidArgumentError(f"{what}={value!r} must be a positive integer"
                                   + (f" below {high + 1}" if number > high else ""))
    return number


def output_size(size: int, filt: int, stride: int, pad: int, dilation: int) -> int:
    """PyTorch's formula: floor((size + 2*pad - dilation*(filt-1) - 1) / stride) + 1."""
    return (size + 2 * pad - dilation * (filt - 1) - 1) // stride + 1


@dataclass(frozen=True)
class ConvProblem:
    op: ClassVar[OpKind] = KIND

    direction: Direction
    n: int
    c: int  # input channels, all groups
    k: int  # output channels, all groups
    groups: int
    input_size: tuple[int, ...]  # spatial: (W,), (H, W) or (D, H, W)
    filter_size: tuple[int, ...]
    stride: tuple[int, ...] = ()  # () means 1 in every dim; likewise padding 0, dilation 1
    padding: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    types: ConvTypes = ConvTypes()
    epilogue: ConvEpilogue = ConvEpilogue()
    specialization: ConvSpecialization = ConvSpecialization()
    source_layout: SourceLayout = SourceLayout.CHANNELS_LAST
    # Some tensor has an element offset of INDEX_LIMIT or more (a strided view over a large
    # buffer): the Triton kernels' 32-bit indexing cannot reach it, so only the vendor path runs it.
    wide_offsets: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "direction", Direction.parse(self.direction))
        for name in ("n", "c", "k", "groups"):
            object.__setattr__(self, name, positive_int(getattr(self, name), f"conv {name}"))
        if not isinstance(self.wide_offsets, bool):
            raise InvalidProblemError(f"wide_offsets must be True or False, got {self.wide_offsets!r}")
        self._set_geometry()
        self._check_sizes()

    def _set_geometry(self) -> None:
        """The spatial tuples as tuples of ints, each in its bounds; () is the default of stride,
        padding and dilation."""
        try:
            dims = len(tuple(self.input_size))
        except TypeError:
            raise InvalidArgumentError(f"input_size must be a sequence of 1-3 sizes, got {self.input_size!r}") from None
        if not 1 <= dims <= MAX_SPATIAL_DIMS:
            raise InvalidProblemError(
                f"input_size {tuple(self.input_size)} has {dims} spatial dims; conv takes 1, 2 or 3")
        fields = {"input_size": (None, 1, INDEX_LIMIT - 1), "filter_size": (None, 1, INDEX_LIMIT - 1),
                  "stride": (1, 1, MAX_STRIDE), "padding": (0, 0, MAX_PADDING), "dilation": (1, 1, MAX_DILATION)}
        for name, (default, low, high) in fields.items():
            value = getattr(self, name)
            if default is not None and isinstance(value, tuple) and value == ():
                value = default
            object.__setattr__(self, name, spatial_tuple(value, dims, name, low, high))
        for size, pad in zip(self.input_size, self.padding):
            if size + 2 * pad >= INDEX_LIMIT:
                raise InvalidProblemError(f"input size {size} padded by {pad} a side reaches 2**31, past the "
                                          "kernels' 32-bit indices; use less padding")

    def _check_sizes(self) -> None:
        if self.c % self.groups or self.k % self.groups:
            raise InvalidProblemError(
                f"C={self.c} and K={self.k} must both be divisible by groups={self.groups} "
                f"(each group takes C/G input and K/G output channels); pick G dividing both, e.g. "
                f"{math.gcd(self.c, self.k)}")
        out = self.output_size
        if min(out) < 1:
            raise InvalidProblemError(
                f"the output would be {out} for input {self.input_size}, filter {self.filter_size}, stride "
                f"{self.stride}, padding {self.padding}, dilation {self.dilation}: every output size must be >= 1; "
                "use a larger input or padding, or a smaller filter or dilation")
        if self.types.dtype not in DTYPES:
            raise UnsupportedError(f"conv dtype {self.types.dtype.value} is not supported; use fp16, bf16 or fp32")
        if self.types.allow_tf32 and self.types.dtype is not DType.FP32:
            raise InvalidProblemError(f"allow_tf32 applies to fp32 only, but the conv is {self.types.dtype.value}")
        if self.direction is not Direction.FORWARD and not self.epilogue.plain:
            raise InvalidProblemError(
                f"bias, activation and residual apply to the forward conv only, not {self.direction.value}")
        sizes = (self.n * self.c * math.prod(self.input_size), self.n * self.k * math.prod(out),
                 self.k * self.c_per_group * math.prod(self.filter_size))
        if max(sizes) >= INDEX_LIMIT:
            raise InvalidProblemError(f"a conv tensor has {max(sizes)} elements; stay below 2**31 (split the batch)")
        claimed = {"pointwise": self.pointwise, "depthwise": self.one_channel_per_group,
                   "unit_stride": self.unit_stride, "one_row": self.one_row}
        false = [name for name, holds in claimed.items() if getattr(self.specialization, name) and not holds]
        if false:
            raise InvalidProblemError(
                f"the specialization claims {', '.join(false)}, which this conv is not (filter {self.filter_size}, "
                f"stride {self.stride}, C/G={self.c_per_group}, K/G={self.k_per_group}): kernels built on it would "
                "skip work this conv needs; use problem.dense_specialization() or drop the claim")

    # -- derived sizes -------------------------------------------------------------------
    @property
    def spatial_dims(self) -> int:
        return len(self.input_size)

    @functools.cached_property  # read by every candidate's score and refusal: computed once a problem
    def output_size(self) -> tuple[int, ...]:
        return tuple(output_size(*args) for args in zip(self.input_size, self.filter_size, self.stride,
                                                          self.padding, self.dilation))

    @property
    def c_per_group(self) -> int:
        return self.c // self.groups

    @property
    def k_per_group(self) -> int:
        return self.k // self.groups

    @property
    def depthwise(self) -> bool:
        return self.groups == self.c and self.c_per_group == 1

    @property
    def one_channel_per_group(self) -> bool:
        """C/G = K/G = 1: depthwise with no channel multiplier, what the direct family's DEPTHWISE path assumes."""
        return self.c_per_group == 1 and self.k_per_group == 1

    @property
    def pointwise(self) -> bool:
        """1x1 filter, stride 1, no padding: a plain GEMM over pixels."""
        return (all(f == 1 for f in self.filter_size) and all(s == 1 for s in self.stride)
                and all(p == 0 for p in self.padding))

    @property
    def unit_stride(self) -> bool:
        return all(s == 1 for s in self.stride)

    @property
    def one_row(self) -> bool:
        """The filter is one row: 1 along every dim but W (1-D convs, 1xK filters)."""
        return all(f == 1 for f in self.filter_size[:-1])

    def dense_specialization(self) -> ConvSpecialization:
        """The specialisation of freshly allocated (dense channels-last) tensors for this problem."""
        item = self.types.dtype.itemsize
        aligned = (self.c * item) % 16 == 0 and (self.k * item) % 16 == 0
        per_group = (self.c_per_group * item) % 16 == 0 and (self.k_per_group * item) % 16 == 0
        outputs = (self.k * item) % 16 == 0 and (self.k_per_group * item) % 16 == 0
        return ConvSpecialization(aligned, per_group, self.pointwise, self.one_channel_per_group,
                                  self.unit_stride, channel_multiple(self.c_per_group, self.k_per_group), outputs,
                                  self.one_row)

    def channels_padded(self) -> ConvProblem:
        """The same conv with C rounded up to whole 16-byte vectors (zero channels in x and w add nothing).

        A C=3 stem's x and w then load as vectors instead of one element at a time: for
        one group, whose output side is already aligned (rules.supports checks both).
        """
        vector = 16 // self.types.dtype.itemsize
        return replace(self, c=-(-self.c // vector) * vector,
                       specialization=self.specialization.channels_padded(self.types.dtype))

    @property
    def flipped_padding(self) -> tuple[int, ...]:
        """Backward-data at stride 1 as a forward conv over dy: its padding a side, dilation x (filter - 1) -
        padding (negative where the padding passes the filter's reach: that forward does not exist)."""
        return tuple(d * (f - 1) - p for d, f, p in zip(self.dilation, self.filter_size, self.padding))

    def data_gradient_as_forward(self) -> ConvProblem:
        """This stride-1 backward-data as the forward conv that computes it: dx = dy correlated with the
        filter turned by 180 degrees, K and C swapped within each group, padded by `flipped_padding`."""
        return ConvProblem(Direction.FORWARD, self.n, self.k, self.c, self.groups, self.output_size, self.filter_size,
                           self.stride, self.flipped_padding, self.dilation, self.types,
                           specialization=self.specialization, source_layout=self.source_layout,
                           wide_offsets=self.wide_offsets)

    def padded3(self, values: tuple[int, ...], fill: int) -> tuple[int, int, int]:
        """A spatial tuple as 3-D (D, H, W): leading dims of size `fill`, as the kernels read it."""
        return (fill,) * (MAX_SPATIAL_DIMS - len(values)) + tuple(values)

    def key(self) -> ConvProblem:
        return self

    def flops(self) -> int:
        """2 * N * K * (output pixels) * C/G * (filter taps): the same in every direction."""
        return self._flops

    @functools.cached_property
    def _flops(self) -> int:
        return 2 * self.n * self.k * math.prod(self.output_size) * self.c_per_group * math.prod(self.filter_size)

    def bytes(self) -> int:
        """The fewest bytes moved: each tensor read or written once (and y read, as residual)."""
        return self._bytes

    @functools.cached_property
    def _bytes(self) -> int:
        item = self.types.dtype.itemsize
        x = self.n * self.c * math.prod(self.input_size)
        y = self.n * self.k * math.prod(self.output_size)
        w = self.k * self.c_per_group * math.prod(self.filter_size)
        extra = y * int(self.epilogue.residual) + self.k * int(self.epilogue.bias)
        return (x + y + w + extra) * item

    def selection_slice(self) -> tuple[str, str]:
        """(direction, dtype) as `describe` names them: the slice a learned model ranks, read on every
        first sight without describing the whole problem."""
        return self.direction.value, self.types.name

    def describe(self) -> dict:
        layout = ("channels-last" if self.source_layout is SourceLayout.CHANNELS_LAST else
                  "contiguous (NC...) tensors converted to channels-last: one extra copy each, "
                  "pass channels-last tensors to avoid it")
        return {
            "op": "conv",
            "direction": self.direction.value,
            "n": self.n, "c": self.c, "k": self.k, "groups": self.groups,
            "input": list(self.input_size), "filter": list(self.filter_size), "output": list(self.output_size),
            "stride": list(self.stride), "padding": list(self.padding), "dilation": list(self.dilation),
            "dtype": self.types.name,
            "epilogue": self.epilogue.name,
            "specialization": self.specialization.tag,
            "layout": layout,
            "flops": self.flops(),
            "bytes": self.bytes(),
            **({"wide_offsets": True} if self.wide_offsets else {}),
        }
