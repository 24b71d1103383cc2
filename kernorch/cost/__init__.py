"""Cost models: `cost(candidate) -> seconds` (inf when the kernel cannot be generated).

The interface every stage prices against is `cost/interface.py` (it imports no codegen); the cost models
(analytic.py, profile.py, gpu_roofline.py, gpu_profile.py, in_plan.py) are imported where they are made
(pipeline.make_cost_model), and the names below load on first use.
"""

from __future__ import annotations

from typing import Any

from kernorch.cost.interface import CostModel, CostModelBase

__all__ = ["DEVICE_PRESETS", "AnalyticCostModel", "CostModel", "CostModelBase", "DeviceSpec", "calibrate_this_machine"]


def __getattr__(name: str) -> Any:
    if name in ("DEVICE_PRESETS", "AnalyticCostModel", "DeviceSpec", "calibrate_this_machine"):
        from kernorch.cost import analytic

        return getattr(analytic, name)
    raise AttributeError(f"module 'kernorch.cost' has no attribute {name!r}")
