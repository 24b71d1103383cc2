"""Runtime: runs plans — the executor (executor.py: the plan's native library and Python kernels, per-call
workspaces, rPrograms through rprogram.py), compiled models (compiled.py) and their saved form (artifact.py),
memory planning and checks (memory.py), input checks and the reference interpreter (reference.py)."""

from kernorch.runtime.reference import check_feeds, run_plan_reference, run_reference

__all__ = ["check_feeds", "run_plan_reference", "run_reference"]
