"""Cost models: `cost(candidate) -> seconds` (inf when the kernel cannot be generated)."""

from kernorch.cost.analytic import DEVICE_PRESETS, AnalyticCostModel, DeviceSpec, calibrate_this_machine
from kernorch.cost.model import CostModel

__all__ = ["DEVICE_PRESETS", "AnalyticCostModel", "CostModel", "DeviceSpec", "calibrate_this_machine"]
