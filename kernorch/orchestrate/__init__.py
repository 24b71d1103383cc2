"""Kernel orchestration (Korch §4): execution states, candidate kernels, an optimal BLP selection."""

from kernorch.ir.plan import Plan, PlanError, validate_plan
from kernorch.options import OrchestrationLimits
from kernorch.orchestrate.orchestrator import OrchestrationResult, add_next_best, orchestrate

__all__ = ["OrchestrationLimits", "OrchestrationResult", "Plan", "PlanError", "add_next_best", "orchestrate",
           "validate_plan"]
