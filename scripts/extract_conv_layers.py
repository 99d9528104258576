"""Writes tiledispatch/bench/data/conv_layers.json: every conv layer of a list of torchvision models.

torchvision is not a dependency of tiledispatch, so the layers are read once, here, and the
problem sets (`tiledispatch.bench.problemsets`) read the committed JSON. Each model is built
on the meta device (no weights, no memory, no arithmetic) and run on a meta input at its
reference resolution with a forward pre-hook on every Conv1d/2d/3d, which records the input's
spatial size as the layer sees it. A layer called on several inputs (a detection head shared
by the feature-pyramid levels) gives one entry per distinct input. Detection models run their
convolutional parts only (backbone with FPN, and the RPN or dense heads): their pre- and
post-processing (resizing, anchors, NMS) holds no conv.

Reference resolutions: classification 224x224; Faster R-CNN and RetinaNet 800x1088 (the
transform's shorter side of 800 for a 4:3 image, 1066, padded to a multiple of 32);
SSDlite 320x320; video 16 frames of 112x112.

    PYTHONPATH=/work/benchdeps .venv/bin/python scripts/extract_conv_layers.py [--out PATH]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn

OUT = Path(__file__).resolve().parents[1] / "tiledispatch" / "bench" / "data" / "conv_layers.json"


@dataclass(frozen=True)
class Model:
    name: str  # torchvision's builder name
    task: str  # classification, detection or video
    input: tuple[int, ...]  # the input's (C, *spatial) at the reference resolution
    parts: str = "whole"  # whole: model(x); rpn, dense_head: the detection model's conv parts


MODELS = (
    *(Model(name, "classification", (3, 224, 224)) for name in (
        "resnet18", "resnet50", "resnext50_32x4d", "mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small",
        "efficientnet_b0", "regnet_y_1_6gf", "convnext_tiny", "densenet121", "shufflenet_v2_x1_0",
        "squeezenet1_1")),
    Model("fasterrcnn_resnet50_fpn", "detection", (3, 800, 1088), "rpn"),
    Model("retinanet_resnet50_fpn", "detection", (3, 800, 1088), "dense_head"),
    Model("ssdlite320_mobilenet_v3_large", "detection", (3, 320, 320), "dense_head"),
    *(Model(name, "video", (3, 16, 112, 112)) for name in ("r3d_18", "r2plus1d_18", "mc3_18")),
)


def _build(model: Model) -> nn.Module:
    from torchvision import models

    builder = models.get_model_builder(model.name)
    kwargs = {"weights": None}
    if model.task == "detection":
        kwargs["weights_backbone"] = None
    try:
        with torch.device("meta"):
            return builder(**kwargs).eval()
    except NotImplementedError:  # a builder that computes its widths from tensors (RegNet) needs their data
        return builder(**kwargs).eval().to("meta")


def _runner(model: Model, net: nn.Module) -> Callable[[torch.Tensor], object]:
    """What runs the model's convolutions on an input batch."""
    if model.parts == "whole":
        return net
    if model.parts == "rpn":
        return lambda x: net.rpn.head(list(net.backbone(x).values()))
    return lambda x: net.head(list(net.backbone(x).values()))


def _padding(conv: nn.Module, spatial: tuple[int, ...]) -> list[int]:
    """The padding a side: integers as given, 'valid' none, 'same' half the filter's reach."""
    if conv.padding == "valid":
        return [0] * len(spatial)
    if conv.padding == "same":
        reach = [d * (f - 1) for d, f in zip(conv.dilation, conv.kernel_size)]
        if any(r % 2 for r in reach):
            raise SystemExit(f"{conv}: padding='same' pads unevenly; record it by hand")
        return [r // 2 for r in reach]
    return list(conv.padding)


def layers_of(model: Model) -> list[dict]:
    """One entry per (conv layer, distinct input size) of `model` at its reference resolution."""
    net = _build(model)
    seen: dict[tuple, dict] = {}

    def hook(name: str):
        def record(conv: nn.Module, inputs: tuple) -> None:
            spatial = tuple(inputs[0].shape[2:])
            if conv.padding_mode != "zeros":
                raise SystemExit(f"{model.name}.{name}: padding_mode={conv.padding_mode} is not a plain conv")
            entry = {"model": model.name, "name": name, "c": conv.in_channels,
                     "k": conv.out_channels, "groups": conv.groups, "filter": list(conv.kernel_size),
                     "stride": list(conv.stride), "padding": _padding(conv, spatial),
                     "dilation": list(conv.dilation), "input": list(spatial), "bias": conv.bias is not None}
            seen.setdefault((name, spatial), entry)
        return record

    for name, module in net.named_modules():
        if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            module.register_forward_pre_hook(hook(name))
    with torch.no_grad():
        _runner(model, net)(torch.empty(1, *model.input, device="meta"))
    return list(seen.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    import torchvision

    layers = [layer for model in MODELS for layer in layers_of(model)]
    # One layer a line: compact, and a diff shows which layers changed.
    body = ",\n".join(json.dumps(layer, separators=(",", ":")) for layer in layers)
    header = {"source": f"torchvision {torchvision.__version__}, scripts/extract_conv_layers.py",
              "models": {m.name: {"task": m.task, "input": list(m.input)} for m in MODELS}}
    text = json.dumps(header, separators=(",", ":"))[:-1] + ',"layers":[\n' + body + "\n]}\n"
    json.loads(text)  # the file must parse as one document
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    counts = {m.name: sum(1 for layer in layers if layer["model"] == m.name) for m in MODELS}
    print(json.dumps({"out": str(args.out), "layers": len(layers), "per_model": counts}))


if __name__ == "__main__":
    main()
