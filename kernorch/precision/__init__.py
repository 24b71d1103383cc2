"""The precision stage (stage.py): which linear primitives multiply in bfloat16, priced per primitive against the
cost model, and the written policy of what stays float32 (`POLICY`, printed by `kernorch explain`)."""

from kernorch.precision.stage import (
    POLICY,
    PRECISIONS,
    PrecisionReport,
    bf16_supported,
    check_bf16_supported,
    choose_precision,
    kernel_precision,
    policy_lines,
    with_conversions,
    with_precision,
)

__all__ = ["POLICY", "PRECISIONS", "PrecisionReport", "bf16_supported", "check_bf16_supported", "choose_precision",
           "kernel_precision", "policy_lines", "with_conversions", "with_precision"]  # fmt: skip
