"""Kernel orchestration (Korch §4): execution states, candidate kernels, an optimal BLP selection."""

from kernorch.orchestrate.orchestrator import OrchestrationResult, orchestrate
from kernorch.orchestrate.plan import Plan, PlanError, validate_plan
from kernorch.orchestrate.pruning import OrchestrationLimits

__all__ = ["OrchestrationLimits", "OrchestrationResult", "Plan", "PlanError", "orchestrate", "validate_plan"]
