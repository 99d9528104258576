"""Convolution problem sets: every conv layer of torchvision's models, and random convolutions.

The layers come from `data/conv_layers.json` (written by scripts/extract_conv_layers.py, so
torchvision is no dependency). Each layer is posed channels-last, as a model converted with
``memory_format=torch.channels_last`` calls it, in the direction asked: forward (with the
layer's bias fused), backward-data and backward-weight, at a few batch sizes per task.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from importlib import resources

import torch

from ...core.jsonio import loads
from ...ops.conv.operands import channels_last_empty, check_operands
from ...ops.conv.problem import ConvTypes, output_size
from .base import ATTEMPTS, Collector, ProblemSet, Request, log_uniform_int, rng_for

DTYPES = ("bf16", "fp16", "fp32", "tf32")
DIRECTIONS = ("forward", "bwd_data", "bwd_weight")
TASKS = ("classification", "detection", "video")
# Inference at batch 1 and training batches; detection and video models train on few images a GPU.
BATCHES = {"classification": (1, 8, 32), "detection": (1, 2), "video": (1, 4)}


@dataclass(frozen=True)
class Layer:
    """One conv layer's geometry, as conv_layers.json records it."""

    model: str
    name: str
    c: int
    k: int
    groups: int
    filter: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    input: tuple[int, ...]
    bias: bool

    @classmethod
    def of(cls, entry: dict) -> "Layer":
        return cls(**{key: tuple(v) if isinstance(v, list) else v for key, v in entry.items()})


@functools.cache
def torchvision_layers() -> tuple[tuple[str, Layer], ...]:
    """(task, layer) of every layer in conv_layers.json, in its order."""
    text = resources.files("tiledispatch.bench").joinpath("data/conv_layers.json").read_text()
    data = loads(text)
    tasks = {name: model["task"] for name, model in data["models"].items()}
    return tuple((tasks[entry["model"]], Layer.of(entry)) for entry in data["layers"])


def conv(layer: Layer, batch: int, dtype: str, direction: str):
    """The problem of `layer` on a batch of `batch` in `direction`, channels-last, as a real call poses it."""
    types = ConvTypes.parse(dtype)
    torch_dtype = types.dtype.torch
    per_group = layer.c // layer.groups if layer.c % layer.groups == 0 else 1
    x_shape = (batch, layer.c, *layer.input)
    w_shape = (layer.k, per_group, *layer.filter)
    out = tuple(output_size(*g) for g in zip(layer.input, layer.filter, layer.stride, layer.padding, layer.dilation))
    y_shape = (batch, layer.k, *out)

    def tensor(shape):
        return channels_last_empty(shape, torch_dtype, "meta")

    geometry = {"stride": layer.stride, "padding": layer.padding, "dilation": layer.dilation,
                "groups": layer.groups, "allow_tf32": types.allow_tf32}
    if direction == "forward":
        bias = torch.empty(layer.k, device="meta", dtype=torch_dtype) if layer.bias else None
        operands = check_operands("forward", x=tensor(x_shape), w=tensor(w_shape), bias=bias, **geometry)
    elif direction == "bwd_data":
        operands = check_operands("bwd_data", dy=tensor(y_shape), w=tensor(w_shape), input_size=x_shape, **geometry)
    else:
        operands = check_operands("bwd_weight", x=tensor(x_shape), dy=tensor(y_shape), weight_size=w_shape,
                                  **geometry)
    return operands.problem


def torchvision(request: Request, out: Collector, tasks: tuple[str, ...], batches: dict | None = None,
                layers: tuple[tuple[str, Layer], ...] | None = None) -> None:
    """Each layer of the models of `tasks` at its task's batch sizes (dedup happens in the caller)."""
    for task, layer in layers if layers is not None else torchvision_layers():
        if task not in tasks:
            continue
        for batch in (batches or BATCHES)[task]:
            out.pose(f"{layer.model}.{layer.name} {list(layer.input)} n={batch}",
                     lambda layer=layer, batch=batch: conv(layer, batch, request.dtype, request.direction))


@dataclass(frozen=True)
class RandomBounds:
    """The largest channel count, spatial size per number of dims, and batch a random conv takes."""

    channels: int = 1024
    sizes: tuple[int, int, int] = (4096, 256, 32)  # 1-D, 2-D, 3-D
    batch: int = 64


def _random_layer(rng, bounds: RandomBounds) -> tuple[Layer, int]:
    dims = rng.choices((1, 2, 3), weights=(1, 8, 1))[0]
    c, k = log_uniform_int(rng, 1, bounds.channels), log_uniform_int(rng, 1, bounds.channels)
    kind = rng.choices(("dense", "depthwise", "grouped"), weights=(6, 2, 2))[0]
    groups = 1
    if kind == "depthwise":
        k, groups = c * rng.choice((1, 1, 2)), c
    elif kind == "grouped":
        common = math.gcd(c, k)
        groups = rng.choice([g for g in range(1, min(common, 64) + 1) if common % g == 0])
    size = tuple(log_uniform_int(rng, 2, bounds.sizes[dims - 1]) for _ in range(dims))
    f = rng.choice((1, 3, 3, 5, 7)) if dims > 1 else rng.choice((2, 3, 4, 7))
    stride, dilation = rng.choice((1, 1, 2)), rng.choice((1, 1, 1, 2))
    padding = rng.choice((0, dilation * (f - 1) // 2))
    layer = Layer("random", kind, c, k, groups, (f,) * dims, (stride,) * dims, (padding,) * dims,
                  (dilation,) * dims, size, rng.random() < 0.3)
    return layer, log_uniform_int(rng, 1, bounds.batch)


def random_convs(request: Request, out: Collector, count: int, max_flops: float,
                 bounds: RandomBounds = RandomBounds()) -> None:
    """`count` random convolutions: channels, sizes and batch log-uniform; dense, depthwise and grouped; 1-3-D."""
    rng = rng_for(request, "conv-random")
    start = len(out.problems)
    for _ in range(ATTEMPTS * count):
        if len(out.problems) - start >= count:
            break
        layer, batch = _random_layer(rng, bounds)
        outs = [output_size(*g) for g in zip(layer.input, layer.filter, layer.stride, layer.padding, layer.dilation)]
        flops = 2 * batch * layer.k * math.prod(outs) * (layer.c // layer.groups) * math.prod(layer.filter)
        if min(outs) < 1 or flops > max_flops:
            continue
        out.pose(f"random {layer} n={batch}", lambda: conv(layer, batch, request.dtype, request.direction))


# Tiny layers of the same kinds as the models': a C=3 stem, a 3x3, a pointwise, a depthwise, a
# grouped 3x3, a 3-D conv and a biased head.
TINY_LAYERS = tuple(("tiny", Layer("tiny", name, *geometry)) for name, geometry in (
    ("stem", (3, 8, 1, (3, 3), (2, 2), (1, 1), (1, 1), (9, 9), False)),
    ("conv3x3", (8, 8, 1, (3, 3), (1, 1), (1, 1), (1, 1), (6, 6), False)),
    ("pointwise", (16, 8, 1, (1, 1), (1, 1), (0, 0), (1, 1), (5, 5), False)),
    ("depthwise", (8, 8, 8, (3, 3), (2, 2), (1, 1), (1, 1), (7, 7), False)),
    ("grouped", (16, 16, 4, (3, 3), (1, 1), (1, 1), (1, 1), (5, 5), True)),
    ("conv3d", (4, 8, 1, (3, 3, 3), (1, 2, 2), (1, 1, 1), (1, 1, 1), (3, 6, 6), False)),
))


def _set(name: str, description: str, generate) -> ProblemSet:
    return ProblemSet(name, "conv", DIRECTIONS, DTYPES, description, generate)


SETS = (
    _set("conv-torchvision", "every conv layer of 18 torchvision classification, detection and video models, "
         "channels-last, at batch 1/8/32 (classification), 1/2 (detection), 1/4 (video)",
         functools.partial(torchvision, tasks=TASKS)),
    *(_set(f"conv-{task}", f"conv-torchvision's {task} models only", functools.partial(torchvision, tasks=(task,)))
      for task in TASKS),
    _set("conv-torchvision-small", "six tiny layers of the models' kinds (stem, 3x3, 1x1, depthwise, grouped, "
         "3-D) at batch 1 and 2", functools.partial(torchvision, tasks=("tiny",), batches={"tiny": (1, 2)},
                                                    layers=TINY_LAYERS)),
    _set("conv-random", "400 random convolutions: log-uniform channels, sizes and batch; dense, depthwise and "
         "grouped; 1-D, 2-D and 3-D", functools.partial(random_convs, count=400, max_flops=2.0**40)),
    _set("conv-random-small", "5 tiny random convolutions",
         functools.partial(random_convs, count=5, max_flops=2.0**20, bounds=RandomBounds(16, (24, 10, 5), 2))),
)
