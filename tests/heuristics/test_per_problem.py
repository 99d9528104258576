"""`roofline.per_problem`: a ranking's scores read a problem's facts once, by identity."""

from tiledispatch.heuristics.roofline import per_problem


def test_the_last_arguments_are_kept_by_identity():
    calls = []

    @per_problem
    def area(shape, scale):
        calls.append(shape)
        return shape[0] * shape[1] * scale

    first, equal = (2, 3), tuple([2, 3])
    assert area(first, 1) == area(first, 1) == 6 and calls == [first]
    assert area(equal, 1) == 6 and len(calls) == 2  # equal but another object: computed again
    assert area(equal, 2) == 12 and len(calls) == 3
