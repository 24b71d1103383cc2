"""Export the models of the dynamic-shape experiments with symbolic dims: the shared suite's architectures with a
symbolic batch (convolutional networks also a symbolic height and width; BERT a symbolic batch and sequence
length), random weights, no downloads.

Runs in the zoo's virtual environment (`make zoo` creates .zoo-venv), never in kernorch's:

    .zoo-venv/bin/python bench/dynamic/export.py OUT_DIR [--only NAME ...]

The shared models (../shared/models) are static batch-1 exports whose reshapes bake the batch in; these are the
same architectures exported with `dynamic_axes`, so one file serves every batch. Their weights are random and
differ from the shared files': compare kernorch with its peers on the same file, never across files.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

BATCH = {0: "batch"}
IMAGE = {0: "batch", 2: "height", 3: "width"}  # convolutional networks take any resolution


class _ConvNorm(torch.nn.Module):
    """Reflection-padded convolution + instance norm (+ ReLU): the fast-neural-style network's unit."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, relu: bool = True,
                 upsample: int = 1) -> None:  # fmt: skip
        super().__init__()
        self.upsample = upsample
        self.pad = torch.nn.ReflectionPad2d(kernel // 2)
        self.conv = torch.nn.Conv2d(cin, cout, kernel, stride)
        self.norm = torch.nn.InstanceNorm2d(cout, affine=True)
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.upsample > 1:
            x = torch.nn.functional.interpolate(x, scale_factor=self.upsample, mode="nearest")
        y = self.norm(self.conv(self.pad(x)))
        return torch.relu(y) if self.relu else y


class _Residual(torch.nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.first = _ConvNorm(channels, channels, 3)
        self.second = _ConvNorm(channels, channels, 3, relu=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.second(self.first(x))


class Candy(torch.nn.Module):
    """The fast neural style transfer network (Johnson et al.), the architecture of the shared candy.onnx."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            _ConvNorm(3, 32, 9), _ConvNorm(32, 64, 3, 2), _ConvNorm(64, 128, 3, 2),
            *[_Residual(128) for _ in range(5)],
            _ConvNorm(128, 64, 3, upsample=2), _ConvNorm(64, 32, 3, upsample=2))  # fmt: skip
        self.out = torch.nn.Sequential(torch.nn.ReflectionPad2d(4), torch.nn.Conv2d(32, 3, 9))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.net(x))


def _torchvision(name: str) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(weights=None)

    return build


def _timm(name: str) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import timm

        return timm.create_model(name, pretrained=False)

    return build


def _segformer() -> torch.nn.Module:
    import transformers

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            config = transformers.SegformerConfig(num_labels=150)  # the B0 sizes are the config's defaults
            self.net = transformers.SegformerForSemanticSegmentation(config)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(pixel_values=x).logits

    return Logits()


def _bert_mini() -> torch.nn.Module:
    import transformers

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            config = transformers.BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4,
                                             num_attention_heads=4, intermediate_size=1024,
                                             max_position_embeddings=512)  # fmt: skip
            self.net = transformers.BertModel(config, add_pooling_layer=False)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.net(input_ids=ids).last_hidden_state

    return Encoder()


class Detector(torch.nn.Module):
    """A one-stage detector's shape at any image size (a multiple of 32): ResNet-18's trunk, a feature pyramid
    over its stride-8, -16 and -32 maps (1x1 laterals to 128 channels, the coarser map upsampled by nearest
    neighbour and added, a 3x3 smoothing conv), a shared head (3x3 conv + ReLU, then 1x1 to 3 anchors x (4 box
    + 1 objectness + 80 classes)) per level, every position's predictions as rows: [batch, positions, 85]."""

    def __init__(self) -> None:
        super().__init__()
        import torchvision

        trunk = torchvision.models.resnet18(weights=None)
        self.stem = torch.nn.Sequential(trunk.conv1, trunk.bn1, trunk.relu, trunk.maxpool, trunk.layer1)
        self.stages = torch.nn.ModuleList([trunk.layer2, trunk.layer3, trunk.layer4])
        self.laterals = torch.nn.ModuleList([torch.nn.Conv2d(c, 128, 1) for c in (128, 256, 512)])
        self.smooth = torch.nn.ModuleList([torch.nn.Conv2d(128, 128, 3, padding=1) for _ in range(3)])
        self.head = torch.nn.Sequential(torch.nn.Conv2d(128, 128, 3, padding=1), torch.nn.ReLU(),
                                        torch.nn.Conv2d(128, 3 * 85, 1))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        maps = []
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
            maps.append(x)
        merged = [lateral(m) for lateral, m in zip(self.laterals, maps, strict=True)]
        for level in (1, 0):  # top-down: the coarser map upsampled into the finer
            merged[level] = merged[level] + torch.nn.functional.interpolate(merged[level + 1], scale_factor=2,
                                                                            mode="nearest")  # fmt: skip
        rows = []
        for level, feature in enumerate(merged):
            out = self.head(self.smooth[level](feature))
            rows.append(out.reshape(out.shape[0], 3 * 85, -1).transpose(1, 2).reshape(out.shape[0], -1, 85))
        return torch.cat(rows, dim=1)


# name -> (module builder, example input, dynamic axes of the input)
MODELS: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[], torch.Tensor], dict[int, str]]] = {
    "efficientnet_b0": (_torchvision("efficientnet_b0"), lambda: torch.randn(2, 3, 224, 224), IMAGE),
    "shufflenet_v2": (_torchvision("shufflenet_v2_x1_0"), lambda: torch.randn(2, 3, 224, 224), IMAGE),
    "resnet18": (_torchvision("resnet18"), lambda: torch.randn(2, 3, 224, 224), IMAGE),
    "vit_tiny": (_timm("vit_tiny_patch16_224"), lambda: torch.randn(2, 3, 224, 224), BATCH),
    "efficientvit_b0": (_timm("efficientvit_b0"), lambda: torch.randn(2, 3, 224, 224), IMAGE),
    "candy": (Candy, lambda: torch.randn(2, 3, 224, 224), IMAGE),
    "segformer_b0": (_segformer, lambda: torch.randn(2, 3, 256, 256), IMAGE),
    "bert_mini": (_bert_mini, lambda: torch.randint(0, 1000, (2, 64)), {0: "batch", 1: "sequence"}),
    "detector": (Detector, lambda: torch.randn(2, 3, 320, 416), IMAGE),
}
OUTPUT_AXES = {"detector": {0: "batch", 1: "positions"}}  # beyond the batch


def export(name: str, target: Path) -> None:
    build, example, axes = MODELS[name]
    torch.manual_seed(0)
    module = build().eval()
    with torch.no_grad():
        torch.onnx.export(module, (example(),), str(target), input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": axes, "output": OUTPUT_AXES.get(name, {0: "batch"})}, opset_version=17,
                          dynamo=False)  # fmt: skip


def export_all(description: str | None, names: list[str], export_one: Callable[[str, Path], None]) -> int:
    """The command line of an exporter: OUT_DIR [--only NAME ...]; each model not yet in OUT_DIR exported, a
    failure reported without stopping the others (exit 1 if any failed)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", nargs="*", choices=sorted(names))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in args.only or sorted(names):
        target = args.out / f"{name}.onnx"
        if target.exists():
            continue
        start = time.perf_counter()
        try:
            export_one(name, target)
        except Exception as error:  # noqa: BLE001 - one architecture failing must not stop the others
            failed += 1
            print(f"{name}: FAILED {type(error).__name__}: {str(error).splitlines()[0][:200]}", file=sys.stderr)
            continue
        print(f"{name}: {target.stat().st_size / 1e6:.1f} MB in {time.perf_counter() - start:.1f} s")
    return 1 if failed else 0


def main() -> int:
    return export_all(__doc__, list(MODELS), export)


if __name__ == "__main__":
    sys.exit(main())

