"""Korch's two detectors, built here with random weights (no `yolox` package, no downloads): YOLOX-Nano and YOLOv4,
both at the paper's 416x416 input (Korch's end-to-end figure: YOLOX-Nano 1.6x, YOLOv4 1.3x over the best of
PyTorch, TVM and TensorRT on an A100). Its other three models are in ../shared/models (candy, EfficientViT-B0,
SegFormer-B0 at 512x512). The zoo exports these as the `korch` set (export.py).

Each is the published architecture's layer list (channel widths, depths, kernel sizes, strides, activations,
the SPP pools and the feature-pyramid routes), batch norm included (the exporter folds it into the convolutions),
without the box decoding and NMS that follow the network: the outputs are the raw head maps.

YOLOX-Nano (Ge et al., 2021; depth 0.33, width 0.25, depthwise convolutions): a Focus stem (space-to-depth),
CSPDarknet of four strided stages with CSP blocks and an SPP bottleneck, a PAFPN, and a decoupled head per level
(classification and regression branches of depthwise 3x3 blocks; box, objectness and 80 class maps), SiLU
throughout; its three levels' predictions concatenated as [1, 85, 3549].

YOLOv4 (Bochkovskiy et al., 2020): CSPDarknet-53 with Mish (five strided stages of 1, 2, 8, 8, 4 residual
blocks, each stage's blocks on one half of its channels and the other half routed past them), an SPP of 5, 9 and
13 max pools, a PANet neck and three YOLO heads of 255 maps (3 anchors x 85) at 52x52, 26x26 and 13x13, leaky
relu (0.1) in neck and heads.
"""

from __future__ import annotations

import torch
from torch import nn

DETECTOR_IMAGE = (1, 3, 416, 416)


def _conv(inputs: int, outputs: int, kernel: int, stride: int, activation: nn.Module, groups: int = 1) -> nn.Module:
    """Convolution (no bias), batch norm, activation: the unit both detectors are made of."""
    return nn.Sequential(nn.Conv2d(inputs, outputs, kernel, stride, kernel // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(outputs), activation)  # fmt: skip


# ---------------------------------------------------------------------------------------------------- YOLOX-Nano

def _silu(inputs: int, outputs: int, kernel: int = 1, stride: int = 1) -> nn.Module:
    return _conv(inputs, outputs, kernel, stride, nn.SiLU())


def _depthwise(inputs: int, outputs: int, kernel: int = 3, stride: int = 1) -> nn.Module:
    """A depthwise kxk convolution then a pointwise one (YOLOX's DWConv)."""
    return nn.Sequential(_conv(inputs, inputs, kernel, stride, nn.SiLU(), groups=inputs), _silu(inputs, outputs))


class _CspBlock(nn.Module):
    """Two 1x1 branches of half the width; `depth` bottlenecks (1x1, depthwise 3x3, optional shortcut) on one."""

    def __init__(self, inputs: int, outputs: int, depth: int, shortcut: bool = True) -> None:
        super().__init__()
        hidden = outputs // 2
        self.main, self.side = _silu(inputs, hidden), _silu(inputs, hidden)
        self.blocks = nn.ModuleList(nn.Sequential(_silu(hidden, hidden), _depthwise(hidden, hidden))
                                    for _ in range(depth))  # fmt: skip
        self.shortcut = shortcut
        self.merge = _silu(2 * hidden, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        main = self.main(x)
        for block in self.blocks:
            main = main + block(main) if self.shortcut else block(main)
        return self.merge(torch.cat([main, self.side(x)], dim=1))


class _Pyramid(nn.Module):
    """Spatial pyramid pooling as both detectors have it: the input beside its 5x5, 9x9 and 13x13 stride-1 max
    pools, four times the channels."""

    def __init__(self) -> None:
        super().__init__()
        self.pools = nn.ModuleList(nn.MaxPool2d(k, 1, k // 2) for k in (5, 9, 13))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, *(pool(x) for pool in self.pools)], dim=1)


def _spp(inputs: int, outputs: int) -> nn.Module:
    """YOLOX's SPP bottleneck: halve the channels, pool them as a pyramid, project."""
    hidden = inputs // 2
    return nn.Sequential(_silu(inputs, hidden), _Pyramid(), _silu(4 * hidden, outputs))


class YoloxNano(nn.Module):
    def __init__(self, classes: int = 80) -> None:
        super().__init__()
        self.stem = _silu(12, 16, 3)  # after the Focus space-to-depth: 3 x 4 channels at half the size
        self.dark2 = nn.Sequential(_depthwise(16, 32, 3, 2), _CspBlock(32, 32, 1))
        self.dark3 = nn.Sequential(_depthwise(32, 64, 3, 2), _CspBlock(64, 64, 3))
        self.dark4 = nn.Sequential(_depthwise(64, 128, 3, 2), _CspBlock(128, 128, 3))
        self.dark5 = nn.Sequential(_depthwise(128, 256, 3, 2), _spp(256, 256), _CspBlock(256, 256, 1, False))
        self.lateral5, self.top_down4 = _silu(256, 128), _CspBlock(256, 128, 1, False)
        self.lateral4, self.top_down3 = _silu(128, 64), _CspBlock(128, 64, 1, False)
        self.down3, self.bottom_up4 = _depthwise(64, 64, 3, 2), _CspBlock(128, 128, 1, False)
        self.down4, self.bottom_up5 = _depthwise(128, 128, 3, 2), _CspBlock(256, 256, 1, False)
        self.heads = nn.ModuleList(_DecoupledHead(width, 64, classes) for width in (64, 128, 256))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        focus = torch.cat([image[..., ::2, ::2], image[..., 1::2, ::2], image[..., ::2, 1::2],
                           image[..., 1::2, 1::2]], dim=1)  # fmt: skip
        c3 = self.dark3(self.dark2(self.stem(focus)))
        c4 = self.dark4(c3)
        c5 = self.dark5(c4)
        p5 = self.lateral5(c5)
        p4 = self.lateral4(self.top_down4(torch.cat([_upsample(p5), c4], dim=1)))
        n3 = self.top_down3(torch.cat([_upsample(p4), c3], dim=1))
        n4 = self.bottom_up4(torch.cat([self.down3(n3), p4], dim=1))
        n5 = self.bottom_up5(torch.cat([self.down4(n4), p5], dim=1))
        return torch.cat([head(level).flatten(2) for head, level in zip(self.heads, (n3, n4, n5), strict=True)],
                         dim=2)  # fmt: skip


class _DecoupledHead(nn.Module):
    """1x1 to the head's width, then a classification branch and a regression branch of two depthwise blocks
    each; box (4), objectness (1, sigmoid) and class (sigmoid) maps concatenated."""

    def __init__(self, inputs: int, width: int, classes: int) -> None:
        super().__init__()
        self.stem = _silu(inputs, width)
        self.classify = nn.Sequential(_depthwise(width, width), _depthwise(width, width), nn.Conv2d(width, classes, 1))
        self.regress = nn.Sequential(_depthwise(width, width), _depthwise(width, width))
        self.box, self.objectness = nn.Conv2d(width, 4, 1), nn.Conv2d(width, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        features = self.regress(x)
        return torch.cat([self.box(features), self.objectness(features).sigmoid(), self.classify(x).sigmoid()],
                         dim=1)  # fmt: skip


def _upsample(x: torch.Tensor) -> torch.Tensor:
    return nn.functional.interpolate(x, scale_factor=2.0, mode="nearest")


# -------------------------------------------------------------------------------------------------------- YOLOv4

def _mish(inputs: int, outputs: int, kernel: int = 1, stride: int = 1) -> nn.Module:
    return _conv(inputs, outputs, kernel, stride, nn.Mish())


def _leaky(inputs: int, outputs: int, kernel: int = 1, stride: int = 1) -> nn.Module:
    return _conv(inputs, outputs, kernel, stride, nn.LeakyReLU(0.1))


class _CspStage(nn.Module):
    """Downsample (3x3/2), then `blocks` residual blocks (1x1, 3x3) on one 1x1 half while the other 1x1 half
    is routed past them, concatenated and projected. The first stage keeps the full width on both halves."""

    def __init__(self, inputs: int, outputs: int, blocks: int) -> None:
        super().__init__()
        half = outputs if blocks == 1 else outputs // 2
        self.down = _mish(inputs, outputs, 3, 2)
        self.route, self.main = _mish(outputs, half), _mish(outputs, half)
        inner = half // 2 if blocks == 1 else half
        self.blocks = nn.ModuleList(nn.Sequential(_mish(half, inner), _mish(inner, half, 3)) for _ in range(blocks))
        self.close = _mish(half, half)
        self.merge = _mish(2 * half, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.down(x)
        main = self.main(x)
        for block in self.blocks:
            main = main + block(main)
        return self.merge(torch.cat([self.close(main), self.route(x)], dim=1))


def _five(inputs: int, width: int) -> nn.Module:
    """The neck's 1x1, 3x3, 1x1, 3x3, 1x1 sequence at `width` (3x3s at twice it)."""
    return nn.Sequential(_leaky(inputs, width), _leaky(width, 2 * width, 3), _leaky(2 * width, width),
                         _leaky(width, 2 * width, 3), _leaky(2 * width, width))  # fmt: skip


class YoloV4(nn.Module):
    def __init__(self, classes: int = 80, anchors: int = 3) -> None:
        super().__init__()
        maps = anchors * (5 + classes)
        self.stem = _mish(3, 32, 3)
        self.stages = nn.ModuleList(_CspStage(i, o, n) for i, o, n in
                                    ((32, 64, 1), (64, 128, 2), (128, 256, 8), (256, 512, 8), (512, 1024, 4)))
        self.before_spp = nn.Sequential(_leaky(1024, 512), _leaky(512, 1024, 3), _leaky(1024, 512))
        self.pyramid = _Pyramid()
        self.after_spp = nn.Sequential(_leaky(2048, 512), _leaky(512, 1024, 3), _leaky(1024, 512))
        self.lateral5, self.route4, self.top_down4 = _leaky(512, 256), _leaky(512, 256), _five(512, 256)
        self.lateral4, self.route3, self.top_down3 = _leaky(256, 128), _leaky(256, 128), _five(256, 128)
        self.down3, self.bottom_up4 = _leaky(128, 256, 3, 2), _five(512, 256)
        self.down4, self.bottom_up5 = _leaky(256, 512, 3, 2), _five(1024, 512)
        self.heads = nn.ModuleList(nn.Sequential(_leaky(width, 2 * width, 3), nn.Conv2d(2 * width, maps, 1))
                                   for width in (128, 256, 512))  # fmt: skip

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.stem(image)
        features = []
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        c3, c4 = features[2], features[3]
        x = self.before_spp(x)
        p5 = self.after_spp(self.pyramid(x))
        p4 = self.top_down4(torch.cat([self.route4(c4), _upsample(self.lateral5(p5))], dim=1))
        n3 = self.top_down3(torch.cat([self.route3(c3), _upsample(self.lateral4(p4))], dim=1))
        n4 = self.bottom_up4(torch.cat([self.down3(n3), p4], dim=1))
        n5 = self.bottom_up5(torch.cat([self.down4(n4), p5], dim=1))
        small, medium, large = (head(level) for head, level in zip(self.heads, (n3, n4, n5), strict=True))
        return small, medium, large


def _keep_the_signal(model: nn.Module) -> nn.Module:
    """He-normal convolutions and batch norms near identity (random, so that folding them changes the weights):
    with torch's default initialisation YOLOv4's head maps came out constant per channel (their spatial spread
    1e-9 of their values: the input's signal gone after a hundred layers), and a check against onnxruntime then
    compares biases only."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
        elif isinstance(module, nn.BatchNorm2d):
            for tensor, low, high in ((module.weight, 0.8, 1.2), (module.bias, -0.1, 0.1),
                                      (module.running_mean, -0.1, 0.1), (module.running_var, 0.8, 1.2)):
                if tensor is not None:  # the running statistics exist: track_running_stats is the default
                    nn.init.uniform_(tensor, low, high)
    return model


def yolox_nano() -> tuple[nn.Module, tuple[torch.Tensor, ...], list[str]]:
    return _keep_the_signal(YoloxNano()), (torch.randn(DETECTOR_IMAGE),), ["input"]


def yolov4() -> tuple[nn.Module, tuple[torch.Tensor, ...], list[str]]:
    return _keep_the_signal(YoloV4()), (torch.randn(DETECTOR_IMAGE),), ["input"]
