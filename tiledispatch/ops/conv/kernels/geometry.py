"""Index helpers every conv kernel shares: pixel coordinates and taps in 3-D.

1-D and 2-D convolutions arrive as 3-D ones with leading sizes of 1, so one set of
helpers (and one kernel per direction) serves every dimensionality.
"""

import triton
import triton.language as tl


@triton.jit
def split_pixel(offs, D, H, W):
    """Flat pixel index over (N, D, H, W) -> (n, d, h, w)."""
    w = offs % W
    rest = offs // W
    h = rest % H
    rest = rest // H
    d = rest % D
    n = rest // D
    return n, d, h, w


@triton.jit
def split_tap(tap, FY, FX):
    """Flat filter tap over (Z, Y, X) -> (z, y, x)."""
    fx = tap % FX
    rest = tap // FX
    return rest // FY, rest % FY, fx


@triton.jit
def source_of(o, f, size, STRIDE, PAD, DIL):
    """Input index read by output index `o` at filter offset `f`, and whether it is inside the input."""
    i = o * STRIDE - PAD + f * DIL
    return i, (i >= 0) & (i < size)


@triton.jit
def target_of(i, f, size, STRIDE, PAD, DIL):
    """Output index that reads input index `i` at filter offset `f` (backward-data), and whether one does.

    The division is done on a non-negative value only, so it means the same in
    compiled code and in the interpreter.
    """
    num = i + PAD - f * DIL
    ok = num >= 0
    num = tl.where(ok, num, 0)
    o = num // STRIDE
    return o, ok & (num % STRIDE == 0) & (o < size)


@triton.jit
def phase_taps(phase, F, STRIDE, PAD, DIL):
    """The taps that reach an output pixel from the input indices i = i' * STRIDE + phase (backward-data).

    Those are f = f0 + t * period for t < count, and they reach o = i' + base - t * step:
    no division and no divisibility mask per row, where asking every tap of every index
    (`target_of`) wastes all but 1 in STRIDE of them. period is the least t >= 1 with
    t * DIL a multiple of STRIDE; f0 the least f below it with phase + PAD - f * DIL one
    (count 0 if none: no output pixel reads these indices). Scalars, once per program.
    """
    period = STRIDE
    for t in range(1, STRIDE):  # the first match wins: later ones find period already set
        period = tl.where((t * DIL % STRIDE == 0) & (period == STRIDE), t, period)
    f0 = F  # none yet (a first match at or past F leaves no taps either)
    for f in range(0, period):
        f0 = tl.where(((phase + PAD - f * DIL) % STRIDE == 0) & (f0 == F), f, f0)
    count = tl.where(f0 < F, (F - f0 + period - 1) // period, 0)
    base = (phase + PAD - f0 * DIL) // STRIDE  # exact where count > 0: a multiple of STRIDE, of any sign
    return f0, period, count, base, period * DIL // STRIDE


@triton.jit
def inside(i, size):
    """0 <= i < size, in one unsigned compare (a negative i wraps to a huge unsigned value)."""
    return i.to(tl.uint32, bitcast=True) < size.to(tl.uint32, bitcast=True)


@triton.jit
def next_tap(fz, fy, fx, FY, FX):
    """The filter tap after (fz, fy, fx), x fastest: carried from step to step by compares and selects."""
    fx += 1
    wrap = fx == FX
    fx = tl.where(wrap, 0, fx)
    fy = tl.where(wrap, fy + 1, fy)
    wrap = fy == FY
    fy = tl.where(wrap, 0, fy)
    fz = tl.where(wrap, fz + 1, fz)
    return fz, fy, fx


@triton.jit
def next_step(cb, fz, fy, fx, c_tiles, FY, FX):
    """The (channel block, tap) after (cb, fz, fy, fx) in a flat reduction loop, channel blocks innermost.

    Carried from step to step with compares and selects: the implicit GEMM's loop would
    otherwise divide its step counter by c_tiles, FX and FY at every step.
    """
    cb += 1
    wrap = cb == c_tiles
    cb = tl.where(wrap, 0, cb)
    nz, ny, nx = next_tap(fz, fy, fx, FY, FX)
    return cb, tl.where(wrap, nz, fz), tl.where(wrap, ny, fy), tl.where(wrap, nx, fx)


@triton.jit
def advance_pixel(d, h, w, step_d, step_h, step_w, D, H, W):
    """(d, h, w) + a step written as digits (step_d, step_h, step_w) over (D, H, W), and which digits wrapped.

    Each digit is below its radix and the carry in is at most 1, so one compare and
    one subtraction a digit make the sum: no division, unlike `split_pixel` of the new
    index. The batch index is not carried: the caller's offsets move by the wraps.
    """
    w += step_w
    wrap_w = w >= W
    w = tl.where(wrap_w, w - W, w)
    h += step_h + wrap_w.to(tl.int32)
    wrap_h = h >= H
    h = tl.where(wrap_h, h - H, h)
    d += step_d + wrap_h.to(tl.int32)
    wrap_d = d >= D
    d = tl.where(wrap_d, d - D, d)
    return d, h, w, wrap_d, wrap_h, wrap_w


@triton.jit
def linear_walk(coef, n, d, h, w, step_n, step_d, step_h, step_w, D, H, W):
    """An offset linear in (n, d, h, w) with coefficients `coef`, carried along `advance_pixel`:
    its value at the first pixel, the step's offset, and the correction for each digit that
    wraps (one more of the next dim, W (H, D) fewer of this one), as (w, h, d)."""
    start = n.to(tl.int64) * coef[0] + d * coef[1] + h * coef[2] + w * coef[3]
    step = step_n * coef[0] + step_d * coef[1] + step_h * coef[2] + step_w * coef[3]
    wraps = (coef[2] - W * coef[3], coef[1] - H * coef[2], coef[0] - D * coef[1])
    return start, step, wraps


@triton.jit
def walk(offset, step, wraps, wrap_d, wrap_h, wrap_w):
    """A `linear_walk` offset moved by one `advance_pixel` step that wrapped as it says."""
    return (offset + step + tl.where(wrap_w, wraps[0], 0) + tl.where(wrap_h, wraps[1], 0)
            + tl.where(wrap_d, wraps[2], 0))
