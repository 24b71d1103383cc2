"""The one options object the CLI and `kernorch.compile` fill in, and the one place the cache lives.

Stages never read this object: the pipeline driver (`kernorch.pipeline`) passes each stage the values it
needs. This module imports nothing from the stages, so every stage may import it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from kernorch.errors import KernorchError

COST_MODELS = ("profile", "analytic")
LAYOUT_POLICIES = ("auto", "channels-last", "nchw")
DEVICES = ("cpu", "cpu-nominal", "v100", "a100", "h100", "cuda")
PRECISIONS = ("fp32", "bf16")  # what linear primitives may multiply in (kernorch/precision/)
GPU_DEVICES = ("v100", "a100", "h100", "cuda")  # a GPU plan (Triton, cuBLAS/cuDNN); "cuda": the GPU present here
DEFAULT_THREADS = 2
MAX_THREADS = 1024  # more would only oversubscribe; a plan asking for more is refused, not obeyed


def check_threads(threads: object) -> int:
    """A thread count a caller or a saved plan gives: an integer in [1, MAX_THREADS], else a one-line refusal."""
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        raise KernorchError(f"threads must be an integer from 1 to {MAX_THREADS}, got {threads!r}")
    return threads


def check_max_workspaces(value: object) -> int | None:
    """None (as many workspaces as callers ran at once, while memory lasts) or a positive integer."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise KernorchError(f"max_workspaces must be a positive integer or None, got {value!r}")
    return value


DEFAULT_REWRITE_BUDGET_SECONDS = 60.0


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where kernorch keeps what it can rebuild: compiled kernels, profiles, calibration, node tests.

    `cache_dir` if given, else `$KERNORCH_CACHE`, else `~/.cache/kernorch`."""
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get("KERNORCH_CACHE") or Path.home() / ".cache" / "kernorch")


def writable_dir(path: Path, purpose: str) -> Path:
    """`path`, created if needed; a directory kernorch cannot write is one line naming it (exit 2)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise KernorchError(f"cannot create the cache directory {path} for {purpose}: {error.strerror or error}"
                            " (set KERNORCH_CACHE to a writable directory)") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise KernorchError(f"the cache directory {path} for {purpose} is not writable "
                            "(set KERNORCH_CACHE to a writable directory)")
    return path


@dataclass(frozen=True)
class OrchestrationLimits:
    """Bounds on the orchestration search (Korch §4); see `kernorch optimize --help`."""

    max_kernel_size: int = 12  # primitives per kernel (a region of one-element values counts as one)
    # primitives per kernel of elementwise primitives only: a chain's candidates grow linearly with it, and a
    # static-QDQ model's activation is one (GELU's eight steps, each quantized: 32 primitives)
    max_elementwise_kernel_size: int = 24
    max_subgraph_size: int = 32  # primitives per subgraph before partitioning
    max_states: int = 4000  # execution states per subgraph before it is split
    max_candidates: int = 30000  # candidate node sets per subgraph
    max_optional_outputs: int = 3  # all subsets of optional outputs up to this many, else none/all
    solver_time_limit: float = 60.0  # seconds per subgraph BLP

    def __post_init__(self) -> None:
        for name in ("max_kernel_size", "max_elementwise_kernel_size", "max_subgraph_size", "max_states",
                     "max_candidates"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise KernorchError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not (isinstance(self.max_optional_outputs, int) and self.max_optional_outputs >= 0):
            raise KernorchError(f"max_optional_outputs must be a non-negative integer, "
                                f"got {self.max_optional_outputs!r}")
        if not self.solver_time_limit > 0:
            raise KernorchError(f"solver_time_limit must be positive, got {self.solver_time_limit!r}")

    @property
    def elementwise_kernel_size(self) -> int:
        """Primitives a kernel of elementwise primitives only may hold: never fewer than any kernel."""
        return max(self.max_kernel_size, self.max_elementwise_kernel_size)


RUNTIMES = ("kernels", "rprogram")
NEW_SHAPE_POLICIES = ("specialise", "serve", "refuse")
# fields renamed, by their former names: kernorch.compile(..., in_place=2) and plans saved with them keep working
# (in_place: "timed inside the running plan", read as buffer reuse)
RENAMED = {"in_place": "in_plan"}
MAX_IN_PLAN_ROUNDS = 8  # re-planning rounds on in-plan costs; each compiles and measures a plan
MAX_VALIDATED_PLANS = 8  # plans compiled and timed end to end by `validate`; each is a full compile
MAX_BUCKETED_SHAPES = 64  # prepared shapes the buckets' combinations may make; more is refused, not compiled


def _shape_sets(value: object) -> tuple[tuple[tuple[str, tuple[int, ...]], ...], ...]:
    """`shapes` as given (dicts of input name -> shape, or their normal form) in normal form: sorted tuples."""
    try:
        items = [value] if isinstance(value, dict) else list(value)  # type: ignore[call-overload]
        sets = tuple(tuple(sorted((str(name), tuple(int(d) for d in shape)) for name, shape in dict(item).items()))
                     for item in items)  # fmt: skip
    except (TypeError, ValueError):
        raise KernorchError("shapes must be a list of {input name: shape} mappings, e.g. "
                            "[{'input': (1, 3, 224, 224)}, {'input': (8, 3, 224, 224)}]") from None
    return tuple(dict.fromkeys(sets))  # each once, in the order given


def _buckets(value: object) -> tuple[tuple[str, tuple[int, ...]], ...]:
    try:
        pairs = dict(value)  # type: ignore[call-overload]
        normal = tuple(sorted((str(dim), tuple(sorted({int(s) for s in sizes}))) for dim, sizes in pairs.items()))
    except (TypeError, ValueError):
        raise KernorchError("buckets must map a symbolic dim to its sizes, e.g. {'batch': (1, 2, 4, 8)}") from None
    for dim, sizes in normal:
        if not sizes or sizes[0] < 1:
            raise KernorchError(f"the buckets of '{dim}' must be positive sizes, got {list(sizes)}")
    return normal


# every symbolic dim: (name, smallest, largest, step) — the sizes smallest, smallest + step, ..., largest; equal
# bounds: a fixed size
SizeBounds = tuple[tuple[str, int, int, int], ...]


def parse_size_range(spec: object) -> SizeBounds:
    """A range of sizes for a shape-generic plan (shapes/generic.py): `sequence=1,past=1..256` (each symbolic dim
    a size or an inclusive range), `height=224..640:32` (every 32nd size: the multiples of 32 from 224 to 640, the
    sizes a network that halves its image five times takes), or its normal form."""
    usage = "a range must be 'NAME=SIZE,NAME=LOW..HIGH[:STEP],...', e.g. 'sequence=1,past=1..256'"
    if not isinstance(spec, str):
        try:
            bounds = tuple((str(b[0]), int(b[1]), int(b[2]), int(b[3]) if len(b) > 3 else 1)  # type: ignore[index]
                           for b in spec)  # type: ignore[attr-defined]  # fmt: skip
        except (TypeError, ValueError, IndexError):
            raise KernorchError(usage) from None
        spec = ",".join(f"{name}={lo}..{hi}:{step}" for name, lo, hi, step in bounds)
    parsed = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, _, sizes = part.partition("=")
        low, _, rest = sizes.partition("..")
        high, _, every = rest.partition(":")
        try:
            lo, hi, step = int(low), int(high or low), int(every or 1)
        except ValueError:
            raise KernorchError(f"range {spec!r}: {part!r} is not NAME=SIZE or NAME=LOW..HIGH[:STEP]") from None
        if not name.strip() or lo < 1 or hi < lo or step < 1:
            raise KernorchError(f"range {spec!r}: {part!r} needs a name, 1 <= LOW <= HIGH and STEP >= 1")
        if lo % step or hi % step:
            raise KernorchError(f"range {spec!r}: {part!r} has a step, so LOW and HIGH must be multiples of it")
        parsed.append((name.strip(), lo, hi, step if lo < hi else 1))
    if not parsed or len({name for name, _, _, _ in parsed}) != len(parsed):
        raise KernorchError(f"range {spec!r} names no dim, or one dim twice")
    return tuple(parsed)


@dataclass(frozen=True)
class Options:
    """Everything that shapes a compiled plan. Frozen: derive variants with `with_(...)`."""

    threads: int = DEFAULT_THREADS  # threads for measuring and running the plan
    cost: str = "profile"  # "profile": time candidate kernels here; "analytic": roofline of `device`
    # what the plan is for: "cpu" (this machine, calibrated), "cpu-nominal" (a CPU plan priced by a fixed roofline:
    # deterministic, no calibration), or a GPU: "v100"/"a100"/"h100" presets, "cuda" the GPU present here
    device: str = "cpu"
    interpret: bool = False  # GPU plans without a GPU: run their Triton kernels in Triton's interpreter on the CPU
    tf32: bool = False  # GPU plans: matmuls and convolutions may use TF32 tensor cores (Korch's A100 figures do)
    precision: str = "fp32"  # "bf16": CPU linear primitives may multiply in bfloat16 where measured faster
    limits: OrchestrationLimits = field(default_factory=OrchestrationLimits)
    rewrite: bool = True  # primitive-graph rewrites before orchestration
    rewrite_budget: float = DEFAULT_REWRITE_BUDGET_SECONDS  # seconds for the cost-guided rewrite search
    screen: bool = True  # profiling: leave out fusions the GIR performance model predicts far slower than their parts
    layout: str = "auto"  # which values are channels-last: "auto" (whole-graph 0-1 program), "channels-last"
    # (every conv channels-last, torch.compile's rule), "nchw" (everything row-major)
    cache_dir: Path | None = None  # None: $KERNORCH_CACHE or ~/.cache/kernorch
    workers: str = "local"  # where candidate kernels are compiled and timed: "local" (this process), "ray" (a local
    # Ray instance or the cluster RAY_ADDRESS names) or "ray://HOST:PORT"; results merge into the local database
    runtime: str = "kernels"  # how a compiled plan runs: "kernels" (kernel by kernel, each its own parallel loops)
    # or "rprogram" (rTasks on one persistent region's threads, scheduled from in-plan times; schedule/)
    strict: bool = False  # refuse a node no fission rule takes (UnsupportedOperator) instead of running it through
    # onnxruntime as an opaque kernel (with a FallbackWarning naming the operators)
    # Models with symbolic dims (kernorch/shapes/dynamic.py): one plan per concrete shape, made ahead or on first use.
    shapes: tuple[tuple[tuple[str, tuple[int, ...]], ...], ...] = ()  # shape sets to prepare ahead of time
    buckets: tuple[tuple[str, tuple[int, ...]], ...] = ()  # symbolic dim -> sizes prepared (every combination)
    pad: tuple[str, ...] = ()  # symbolic dims a call may be padded along, to the next bucket, where that is exact
    # ranges of sizes each served by one shape-generic plan, made when the model is compiled (shapes/generic.py):
    # a call inside one runs at once on it (`sequence=1,past=1..256`: a decoder's steps)
    ranges: tuple[SizeBounds, ...] = ()
    # a shape not prepared: "serve" it at once by onnxruntime and plan it in the background once it is called
    # again and again (shapes/serving.py; "specialise" where onnxruntime is not installed), "specialise" it on
    # the spot (planned and compiled on the caller's thread, logged), or "refuse" it
    new_shapes: str = "serve"
    background_tuning: bool = False  # cost "profile": a new shape runs first on an analytic plan while its
    # measured plan is tuned in a background thread and swapped in when ready
    # plans compiled and timed end to end before one is kept (kernorch/validate/): 1 = the BLP optimum, untimed;
    # k = the optimum and the k - 1 next cheapest distinct plans, the fastest kept
    validate: int = 1
    # rounds of planning on costs measured in place (kernorch/validate/in_plan.py): 0 = isolated profiles only;
    # r = the plan compiled, its kernels timed inside whole inferences, re-planned on those times, up to r times
    in_plan: int = 0
    # workspaces one plan may hold for concurrent calls (None: one per caller running at once, while memory
    # lasts); callers beyond it wait for an idle one (runtime/executor.py)
    max_workspaces: int | None = None

    def __post_init__(self) -> None:
        check_threads(self.threads)
        if self.cost not in COST_MODELS:
            raise KernorchError(f"unknown cost model '{self.cost}' (choose {' or '.join(COST_MODELS)})")
        if self.device not in DEVICES:
            raise KernorchError(f"unknown device '{self.device}' (choose {', '.join(DEVICES)})")
        if self.cost == "profile" and self.device not in ("cpu", "cuda"):
            raise KernorchError(f"cost 'profile' measures this machine; device '{self.device}' needs --cost analytic")
        if self.tf32 and self.device not in GPU_DEVICES:
            raise KernorchError("tf32 is a GPU option (a CPU plan computes in float32)")
        if self.precision not in PRECISIONS:
            raise KernorchError(f"unknown precision '{self.precision}' (choose {' or '.join(PRECISIONS)})")
        if self.precision == "bf16" and self.device in GPU_DEVICES:
            raise KernorchError("precision bf16 is a CPU option (a GPU plan may use TF32: --tf32)")
        if not self.rewrite_budget >= 0:
            raise KernorchError(f"rewrite_budget must be a non-negative number of seconds, got {self.rewrite_budget!r}")
        if self.layout not in LAYOUT_POLICIES:
            raise KernorchError(f"unknown layout policy '{self.layout}' (choose {', '.join(LAYOUT_POLICIES)})")
        if not (self.workers in ("local", "ray") or (self.workers.startswith("ray://") and len(self.workers) > 6)):
            raise KernorchError(f"unknown workers '{self.workers}' (choose local, ray, or ray://HOST:PORT)")
        if self.runtime not in RUNTIMES:
            raise KernorchError(f"unknown runtime '{self.runtime}' (choose {' or '.join(RUNTIMES)})")
        object.__setattr__(self, "shapes", _shape_sets(self.shapes))
        object.__setattr__(self, "buckets", _buckets(self.buckets))
        ranges = [self.ranges] if isinstance(self.ranges, str) else self.ranges
        object.__setattr__(self, "ranges", tuple(dict.fromkeys(parse_size_range(r) for r in ranges)))
        object.__setattr__(self, "pad", tuple(sorted({str(d) for d in ([self.pad] if isinstance(self.pad, str)
                                                                       else self.pad)})))
        bucketed = {dim for dim, _ in self.buckets}
        unbucketed = [dim for dim in self.pad if dim not in bucketed]
        if unbucketed:
            raise KernorchError(f"dim '{unbucketed[0]}' is marked paddable but has no buckets to pad to "
                                "(give them with --dim NAME=SIZES)")
        combinations = 1
        for _, sizes in self.buckets:
            combinations *= len(sizes)
        if combinations > MAX_BUCKETED_SHAPES:
            raise KernorchError(f"the buckets make {combinations} shape combinations to prepare (at most "
                                f"{MAX_BUCKETED_SHAPES}); give fewer sizes")
        if self.new_shapes not in NEW_SHAPE_POLICIES:
            raise KernorchError(f"unknown new_shapes policy '{self.new_shapes}' (choose "
                                f"{' or '.join(NEW_SHAPE_POLICIES)})")
        if isinstance(self.validate, bool) or not isinstance(self.validate, int) or not \
                1 <= self.validate <= MAX_VALIDATED_PLANS:  # fmt: skip
            raise KernorchError(f"validate must be a number of plans from 1 to {MAX_VALIDATED_PLANS}, got "
                                f"{self.validate!r}")  # fmt: skip
        if self.validate > 1 and self.device != "cpu":
            raise KernorchError(f"validate times plans on this CPU; device '{self.device}' plans are not validated")
        if isinstance(self.in_plan, bool) or not isinstance(self.in_plan, int) or not \
                0 <= self.in_plan <= MAX_IN_PLAN_ROUNDS:  # fmt: skip
            raise KernorchError(f"in_plan must be a number of rounds from 0 to {MAX_IN_PLAN_ROUNDS}, got "
                                f"{self.in_plan!r}")  # fmt: skip
        if self.in_plan and (self.cost != "profile" or self.device != "cpu"):
            raise KernorchError("in_plan corrects measured profiles with times measured on this CPU: it needs "
                                "cost 'profile' and device 'cpu'")  # fmt: skip
        check_max_workspaces(self.max_workspaces)
        if not isinstance(self.limits, OrchestrationLimits):
            raise KernorchError(f"limits must be an OrchestrationLimits, got {type(self.limits).__name__}")

    @property
    def gpu(self) -> bool:
        """Whether the plan is for a GPU."""
        return self.device in GPU_DEVICES

    @property
    def ray_address(self) -> str | None:
        """None: measure here; "": a local Ray instance or RAY_ADDRESS; else the cluster's ray:// address."""
        return None if self.workers == "local" else "" if self.workers == "ray" else self.workers

    @property
    def cache(self) -> Path:
        return cache_root(self.cache_dir)

    def with_(self, **changes: Any) -> Options:
        """A copy with some fields changed (a field's former name, RENAMED, still accepted); an unknown field name
        is refused in one line."""
        changes = {RENAMED.get(name, name): value for name, value in changes.items()}
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise KernorchError(f"unknown option(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        return replace(self, **changes)


# Options that decide nothing about one plan's content: how shapes are dispatched, where caches live, how a plan is
# run. Left out of what a plan records as its options (runtime/origin.py) and of the specialisation cache's key.
SHAPE_POLICY_FIELDS = ("shapes", "buckets", "pad", "ranges", "new_shapes", "background_tuning")
NOT_PLAN_SHAPING = (*SHAPE_POLICY_FIELDS, "cache_dir", "workers", "runtime", "interpret", "max_workspaces")


def options_to_json(options: Options) -> dict[str, Any]:
    """Every field but the cache directory and the workers (where, not what), as JSON values."""
    values = {f.name: getattr(options, f.name) for f in fields(options) if f.name not in ("cache_dir", "workers")}
    values["limits"] = asdict(options.limits)
    result: dict[str, Any] = json.loads(json.dumps(values))  # tuples become lists: the form it is read back from
    return result


def options_from_json(values: Any, cache_dir: Path | None) -> Options:
    if not isinstance(values, dict):
        raise ValueError("options must be an object")
    values = {RENAMED.get(name, name): value for name, value in values.items()}  # a plan saved before a rename
    known = {f.name for f in fields(Options)} - {"cache_dir", "workers", "limits"}
    given = {name: values[name] for name in known if name in values}
    limits = OrchestrationLimits(**values.get("limits", {}))
    return Options(limits=limits, cache_dir=cache_dir, **given)


def plan_shaping(options: Options) -> dict[str, Any]:
    """The options that shape a plan, as JSON values: what a plan records of how it was made."""
    return {k: v for k, v in options_to_json(options).items() if k not in NOT_PLAN_SHAPING}
