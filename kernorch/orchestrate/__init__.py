"""Kernel orchestration (Korch §4): execution states, candidate kernels, an optimal BLP selection."""

from kernorch.ir.plan import Plan, PlanError, validate_plan
from kernorch.options import OrchestrationLimits
from kernorch.orchestrate.orchestrator import OrchestrationResult, orchestrate

__all__ = ["OrchestrationLimits", "OrchestrationResult", "Plan", "PlanError", "orchestrate", "validate_plan"]
