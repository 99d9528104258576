"""The replay engine (core/replay.py): each kind of slot, checked with plain-Python stages.

A plan is bound on planning tensors, then replayed on fresh ones: every hole must take the call's
tensor, a fresh buffer (zeroed where planned, one per planned tensor across stages), a rebased
descriptor, a scalar or the operands; a tensor the plan copied on the host makes it unbindable.
"""

from __future__ import annotations

import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from tiledispatch.core.launch import Launch, Plan
from tiledispatch.core.replay import Binding, BoundPlan, Fill, Unbindable


class Recorder:
    """A stage that records the arguments of each launch and applies `effect` to them."""

    def __init__(self, effect=None) -> None:
        self.calls: list[list] = []
        self.effect = effect

    def __call__(self, grid, args, stream) -> None:
        self.calls.append(list(args))
        if self.effect is not None:
            self.effect(*args)


def _add_into(x, y, out, scale):  # out = (x + y) * scale
    torch.add(x, y, out=out).mul_(scale)


def test_roles_buffers_and_scalars_are_filled_per_call():
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    scratch = torch.empty(4, 5)
    flags = torch.full((3,), 7.0)  # planned as zeros: a replay makes them zero again
    out = torch.empty(4, 5)
    first, second = Recorder(_add_into), Recorder(lambda s, f, o, n: o.copy_(s + f.sum()))
    plan = Plan((Launch("first", (1, 1, 1), (x, y, scratch, 2.0)),
                 Launch("second", (1, 1, 1), (scratch, flags, out, 0))), out, zeroed=(flags,), scratch=(scratch,))
    names = {"first": ("x", "y", "out", "scale"), "second": ("src", "flags", "out", "seed")}
    bound = BoundPlan(plan, {"first": first, "second": second},
                      Binding([x, y, out], names=names, scalars=("seed",)), torch.device("cpu")).seal()
    assert [s.fill for s in bound.stages[1].slots] == [Fill.BUFFER, Fill.BUFFER, Fill.SCALAR]
    assert bound.stages[0].template[3] == 2.0 and bound.stages[0].template[0] is None
    for _ in range(2):
        fx, fy, fout = torch.randn(4, 5), torch.randn(4, 5), torch.full((4, 5), float("nan"))
        buffers = bound.run((fx, fy, fout), None, scalars=(11,))
        torch.testing.assert_close(fout, (fx + fy) * 2.0)
        made_scratch, made_flags = buffers
        assert first.calls[-1][2] is made_scratch and second.calls[-1][0] is made_scratch  # one per call, shared
        assert made_scratch is not scratch and made_flags is not flags
        assert torch.equal(made_flags, torch.zeros(3)) and second.calls[-1][3] == 11
        assert first.calls[-1][0] is fx and first.calls[-1][1] is fy


def test_descriptors_views_and_operands():
    a = torch.randn(8, 16)
    out = torch.empty(8, 16)
    descriptor = TensorDescriptor.from_tensor(a, [4, 8])
    python = Recorder()

    class Operands:
        pass

    planned = Operands()
    plan = Plan((Launch("vendor", (1, 1, 1), (descriptor, a, planned, out)),), out)
    from tiledispatch.core import replay

    python.__class__ = type("PythonStage", (Recorder, replay.PythonLauncher), {})  # read as a Python stage
    bound = BoundPlan(plan, {"vendor": python}, Binding([a, out], operands_type=Operands,
                                                        view=lambda t: t.unsqueeze(0)), "cpu").seal()
    assert [s.fill for s in bound.stages[0].slots] == [Fill.ROLE_DESCRIPTOR, Fill.ROLE_VIEW, Fill.OPERANDS,
                                                        Fill.ROLE_VIEW]
    fresh, made = torch.randn(8, 16), Operands()
    bound.run((fresh, torch.empty(8, 16)), None, operands=lambda: made)
    moved, view, operands, _ = python.calls[-1]
    assert moved.base is fresh and moved.block_shape == [4, 8] and moved.strides == descriptor.strides
    assert view.shape == (1, 8, 16) and view.data_ptr() == fresh.data_ptr()
    assert operands is made
    assert descriptor.base is a  # the planned one is left alone


def test_a_host_copy_is_unbindable():
    x = torch.randn(4)
    copy = x.clone()  # made by the plan on the host from x: a replay would not refresh it
    plan = Plan((Launch("main", (1, 1, 1), (copy, x)),), x)
    with pytest.raises(Unbindable, match="copied on the host"):
        BoundPlan(plan, {"main": Recorder()}, Binding([x]), "cpu")


def test_an_input_handed_back_is_unbindable():
    x = torch.randn(4)
    plan = Plan((Launch("main", (1, 1, 1), (x,)),), x)
    bound = BoundPlan(plan, {"main": Recorder()}, Binding([x]), "cpu")
    with pytest.raises(Unbindable, match="input back"):
        bound.buffer_of(x)
