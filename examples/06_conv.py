"""Grouped convolution in all three directions, checked against PyTorch, and why a kernel was picked.

    python examples/06_conv.py      (CPU interpreter without a GPU; cuDNN is a candidate on a GPU)
"""

import torch
import torch.nn.functional as F

import tiledispatch
from tiledispatch import arch
from tiledispatch.core.dispatcher import Dispatcher
from tiledispatch.core.registry import Registry
from tiledispatch.ops.conv import ConvProblem, ConvTypes, Direction

device = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.randn(2, 16, 9, 9, device=device).to(memory_format=torch.channels_last)  # N C H W, 4 groups
w = torch.randn(8, 4, 3, 3, device=device).to(memory_format=torch.channels_last)   # K C/G R S
y = tiledispatch.conv(x, w, stride=2, padding=1, groups=4, activation="relu")
dy = torch.randn_like(y)
dx = tiledispatch.conv_backward_data(dy, w, x.shape, stride=2, padding=1, groups=4)
dw = tiledispatch.conv_backward_weight(x, dy, w.shape, stride=2, padding=1, groups=4)
args = {"stride": 2, "padding": 1, "groups": 4}
print("forward   max error", float((y - F.relu(F.conv2d(x, w, **args))).abs().max()))
print("bwd_data  max error", float((dx - torch.nn.grad.conv2d_input(x.shape, w, dy, **args)).abs().max()))
print("bwd_weight max error", float((dw - torch.nn.grad.conv2d_weight(x, w.shape, dy, **args)).abs().max()))

hopper = arch.load("sm_90")
dispatcher = Dispatcher(Registry.from_rule_set("conv", "default", hopper), hopper)
depthwise = ConvProblem(Direction.FORWARD, 32, 384, 384, 384, (28, 28), (7, 7), 1, 3, 1, ConvTypes.parse("bf16"))
for candidate in dispatcher.explain(depthwise).ranked[:4]:
    print(f"  {candidate.score.value:.3f}  {candidate.spec.name}  ~{candidate.score.terms['modelled_us']:.0f} us")
