"""Counts of (query, key) pairs under a position mask, in closed form.

The FLOP count and the rules' time model ask how many pairs a causal or sliding-window
band keeps, and how many the kernels compute in whole blocks. A sequence may be as long
as the kernels allow (about 2**30 positions) and a problem may be formed from an expanded
tensor that costs no memory, so these counts take O(1) time and memory per sequence: the
band is piecewise linear in the query index, and a block's key range is a floor of one.

Band convention (`AttentionProblem.band`): query i sees key j iff
i + offset - left <= j <= i + offset + right, with -1 for an unbounded side.
"""

from __future__ import annotations


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """sum of floor((a * i + b) / m) for i in [0, n), for any integers a, b and m >= 1.

    The terms are lattice points under a line; counting them by rows instead of columns
    swaps the roles of a and m, so the arguments shrink as in Euclid's algorithm.
    """
    total, sign = 0, 1
    while n > 0:
        qa, a = divmod(a, m)
        qb, b = divmod(b, m)
        total += sign * (qa * n * (n - 1) // 2 + qb * n)
        rows = (a * (n - 1) + b) // m  # 0 <= a, b < m now
        if rows == 0:
            break
        # Row j (1..rows) holds the n - ceil((j * m - b) / a) points with i >= ceil(...): the
        # ceilings are floor((m * j' + m - b + a - 1) / a) for j' in [0, rows).
        total += sign * n * rows
        sign = -sign
        n, m, a, b = rows, a, m, m - b + a - 1
    return total


def _positive_linear_sum(start: int, stop: int, slope: int, intercept: int) -> int:
    """sum of max(0, slope * i + intercept) for integers i in [start, stop); slope in {-1, 0, 1}."""
    if slope > 0:
        start = max(start, 1 - intercept)
    elif slope < 0:
        stop = min(stop, intercept)  # slope * i + intercept >= 1 iff i <= intercept - 1
    elif intercept <= 0:
        return 0
    if stop <= start:
        return 0
    count = stop - start
    return slope * (start + stop - 1) * count // 2 + intercept * count


def band_pairs(seqlen_q: int, seqlen_kv: int, offset: int, left: int, right: int) -> int:
    """Visible (query, key) pairs of one sequence: sum over i of |[max(i + offset - left, 0),
    min(i + offset + right, seqlen_kv - 1)]|, in O(1)."""
    last = seqlen_kv - 1
    low = None if left < 0 else offset - left  # lo(i) = max(i + low, 0)
    high = None if right < 0 else offset + right  # hi(i) = min(i + high, last)
    cuts = {0, seqlen_q}
    if low is not None:
        cuts.add(min(max(-low, 0), seqlen_q))  # lo is 0 before, i + low from here
    if high is not None:
        cuts.add(min(max(last - high, 0), seqlen_q))  # hi is i + high before, last from here
    points = sorted(cuts)
    total = 0
    for start, stop in zip(points, points[1:]):
        lo_slope, lo_at0 = (1, low) if low is not None and start + low >= 0 else (0, 0)
        hi_slope, hi_at0 = (1, high) if high is not None and start + high < last else (0, last)
        total += _positive_linear_sum(start, stop, hi_slope - lo_slope, hi_at0 - lo_at0 + 1)
    return total


def _floor_range(start: int, stop: int, step: int, shift: int, block: int) -> int:
    """sum of floor((t * step + shift) / block) for t in [start, stop)."""
    if stop <= start:
        return 0
    return floor_sum(stop - start, block, step, start * step + shift)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _block_count(m0: int, last: int, seqlen_kv: int, offset: int, left: int, right: int, block_n: int) -> int:
    """Key blocks the kernel steps for the query rows [m0, last]."""
    lo = 0 if left < 0 else max(m0 + offset - left, 0) // block_n * block_n
    hi = seqlen_kv if right < 0 else min(max(last + offset + right + 1, 0), seqlen_kv)
    return _ceil_div(hi - lo, block_n) if hi > lo else 0


def block_pairs(seqlen_q: int, seqlen_kv: int, offset: int, left: int, right: int, block_m: int,
                block_n: int) -> int:
    """(query, key) pairs the kernels compute for one sequence: block_m x block_n for every key
    block a query block steps, whole blocks over its band. O(log) in the lengths.

    Query block t (rows [t * block_m, t * block_m + block_m - 1]) steps the key blocks from
    floor(max(t * bm + a, 0) / bn) (a = offset - left) to ceil(clamp(t * bm + b, 0, Skv) / bn)
    (b = offset + right + bm). Both ends only grow with t: no block sees keys before
    t * bm + b > 0, none after its start passes the last key block, and between those every
    block sees at least one key. The last, partial query block is counted on its own.
    """
    blocks = _ceil_div(seqlen_q, block_m)
    full = blocks - 1  # query blocks of block_m rows
    tail = _block_count(full * block_m, seqlen_q - 1, seqlen_kv, offset, left, right, block_n)
    key_blocks = _ceil_div(seqlen_kv, block_n)
    a, b = offset - left, offset + right + block_m
    start = 0 if right < 0 else min(max(-b // block_m + 1, 0), full)  # first t with t * bm + b > 0
    stop = full if left < 0 else min(max(_ceil_div(key_blocks * block_n - a, block_m), start), full)
    # Sum over [start, stop) of (ceil(hi_t / bn) - floor(lo_t / bn)).
    if right < 0:
        ends = (stop - start) * key_blocks
    else:
        saturated = min(max(_ceil_div(seqlen_kv - b, block_m), start), stop)  # hi_t = Skv from here
        ends = (_floor_range(start, saturated, block_m, b + block_n - 1, block_n)
                + (stop - saturated) * key_blocks)
    starts = 0
    if left >= 0:
        positive = min(max(_ceil_div(-a, block_m), start), stop)  # lo_t = t * bm + a from here
        starts = _floor_range(positive, stop, block_m, a, block_n)
    return block_m * block_n * (ends - starts + tail)
