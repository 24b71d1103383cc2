"""Runtime: executes primitive graphs (today: the reference interpreter)."""

from kernorch.runtime.reference import check_feeds, run_plan_reference, run_reference

__all__ = ["check_feeds", "run_plan_reference", "run_reference"]
