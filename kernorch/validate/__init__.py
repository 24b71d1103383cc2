"""Whole-plan validation (plans.py): the orchestrator's cheapest plans compiled, checked against each other and
timed end to end, the fastest kept; in-plan kernel costs (in_plan.py): kernels re-timed inside the running plan."""

from kernorch.validate.plans import MARGIN, ROUNDS, PlanTiming, ValidationReport, plan_differences, validate_plans

__all__ = ["MARGIN", "ROUNDS", "PlanTiming", "ValidationReport", "plan_differences", "validate_plans"]
