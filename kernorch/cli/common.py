"""What the subcommands share: their arguments, the options they make, progress bars, orchestration."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernorch.options import Options
    from kernorch.orchestrate import OrchestrationResult
    from kernorch.pipeline import Progress

EXIT_OK, EXIT_MISMATCH, EXIT_BAD_INPUT = 0, 1, 2


def add_model_args(parser: argparse.ArgumentParser, several_shapes: bool = False) -> None:
    parser.add_argument("model", help="path to an ONNX model")
    parser.add_argument(
        "--input-shape", action="append", metavar="NAME=D1xD2x...",
        help="bind a model input to a static shape (a model with symbolic dims needs one per input)"
        + ("; give an input several times for several shapes (the k-th of each input makes the k-th shape "
           "set): a plan per shape set" if several_shapes else ""),
    )  # fmt: skip
    add_strict_arg(parser)


def add_shape_policy_args(parser: argparse.ArgumentParser) -> None:
    """How a model with symbolic dims is specialised (kernorch/shapes/)."""
    parser.add_argument("--dim", action="append", metavar="NAME=SIZES",
                        help="prepare a plan for each size of symbolic dim NAME: 1,2,4,8 or pow2:1..16 (powers of "
                        "two) or x64:64..512 (multiples of 64); several --dim prepare every combination")
    parser.add_argument("--pad", action="append", metavar="NAME",
                        help="let a call whose size of NAME has no plan run padded to the next --dim size, where "
                        "kernorch proves per primitive that padding is exact (otherwise it is specialised)")
    parser.add_argument("--range", action="append", metavar="NAME=LOW..HIGH[:STEP],...",
                        help="plan once for every size in a range (each symbolic dim a size or LOW..HIGH, e.g. "
                        "sequence=1,past=1..256: a decoder's steps; :STEP takes every STEP-th size, e.g. "
                        "height=320..640:32 for a detector's images): one shape-generic plan, checked against "
                        "onnxruntime, runs any size in it at once; where it cannot be one program the log says why")


def shape_sets(args: argparse.Namespace) -> list[dict[str, tuple[int, ...]]]:
    from kernorch.frontend import parse_shape_sets

    return parse_shape_sets(getattr(args, "input_shape", None))


def one_shape_set(args: argparse.Namespace, what: str) -> dict[str, tuple[int, ...]]:
    """The single shape binding a subcommand that shows one plan takes."""
    sets = shape_sets(args)
    if len(sets) > 1:
        from kernorch.errors import ShapeError

        raise ShapeError(f"{what} shows one plan: give each input one --input-shape")
    return sets[0] if sets else {}


def add_strict_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strict", action="store_true", default=None,
                        help="refuse (exit 2) a node kernorch has no rule for, instead of running it through "
                        "onnxruntime as an opaque kernel with a warning")  # fmt: skip


def add_device_args(parser: argparse.ArgumentParser) -> None:
    from kernorch.options import DEVICES, PRECISIONS

    parser.add_argument("--device", default="cpu", choices=DEVICES,
                        help="what the plan is for: cpu (this machine: C and oneDNN, its roofline calibrated), "
                        "cpu-nominal (a CPU plan priced by a fixed roofline), v100/a100/h100 (a GPU plan: Triton "
                        "kernels and cuBLAS/cuDNN through torch, priced by that GPU's preset; runs where a GPU is, "
                        "`check --compiled` runs it in Triton's interpreter here), cuda (the GPU present)")
    parser.add_argument("--tf32", action="store_true", default=None,
                        help="GPU plans: matmuls and convolutions may use TF32 tensor cores (off by default)")
    parser.add_argument("--precision", choices=PRECISIONS, default=None,
                        help="fp32 (default): everything in float32; bf16: matmuls and convolutions multiply in "
                        "bfloat16 (float32 sums) wherever that is measured faster — reductions, normalisation, "
                        "softmax and LSTM state stay float32 (`kernorch explain` prints the policy); needs a CPU "
                        "with AVX512-BF16 or AMX")  # fmt: skip


def add_orchestration_args(parser: argparse.ArgumentParser) -> None:
    from kernorch.options import OrchestrationLimits

    defaults = OrchestrationLimits()

    add_cost_arg(parser, "the cost model the plan is optimized against")
    add_device_args(parser)
    parser.add_argument("--max-kernel-size", type=positive_int, default=defaults.max_kernel_size,
                        help="max primitives per kernel, a region of one-element values (a dynamic "
                             f"quantizer's scale chain) counting as one (default {defaults.max_kernel_size})")
    parser.add_argument("--max-elementwise-kernel-size", type=positive_int,
                        default=defaults.max_elementwise_kernel_size,
                        help="max primitives per kernel of elementwise primitives only (default "
                        f"{defaults.max_elementwise_kernel_size})")
    parser.add_argument("--max-subgraph-size", type=positive_int, default=defaults.max_subgraph_size,
                        help=f"max primitives per subgraph before partitioning (default {defaults.max_subgraph_size})")
    parser.add_argument("--time-limit", type=positive_float, default=defaults.solver_time_limit,
                        help=f"solver seconds per subgraph (default {defaults.solver_time_limit:g})")
    add_threads_arg(parser, "threads for measuring and running")
    parser.add_argument("--workers", default="local", metavar="local|ray|ray://HOST:PORT",
                        help="where candidate kernels are compiled and timed: local (default, this process), ray (a "
                        "local Ray instance, or the cluster RAY_ADDRESS names) or ray://HOST:PORT; results merge "
                        "into the local profile database, keyed by the measuring machine (needs kernorch[ray])")
    add_rewrite_args(parser)
    add_layout_arg(parser)
    add_validate_arg(parser)


def add_validate_arg(parser: argparse.ArgumentParser) -> None:
    from kernorch.options import MAX_IN_PLAN_ROUNDS, MAX_VALIDATED_PLANS

    parser.add_argument("--in-plan", "--in-place", type=non_negative_int, default=None, metavar="ROUNDS",
                        dest="in_plan",
                        help="compile the plan, time each kernel inside whole inferences, and plan again on those "
                        "in-plan times (a kernel never timed in the plan keeps its isolated profile), up to "
                        f"ROUNDS times (at most {MAX_IN_PLAN_ROUNDS}); every plan measured is then timed end to end "
                        "with the others and the fastest kept; prints the prediction error before and after "
                        "(default 0; needs --cost profile; --in-place is its former name)")  # fmt: skip

    parser.add_argument("--validate", type=positive_int, default=None, metavar="K",
                        help="compile the K cheapest distinct plans (the BLP optimum and its K-1 next best, found "
                        "with no-good cuts) and the greedy-fusion plan, time them end to end on this CPU, "
                        "interleaved, and keep the fastest "
                        "(the optimum unless another is 2%% faster); the choice and the tuning time are recorded in "
                        f"the plan (default 1: the optimum, untimed; at most {MAX_VALIDATED_PLANS})")  # fmt: skip


# argparse types: a bad value exits 2 with argparse's one-line error, never a traceback.
def number(text: str, kind: type, minimum: float, what: str, inclusive: bool = True) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not {what}") from None
    if not (value >= minimum if inclusive else value > minimum) or value != value or value in (math.inf, -math.inf):
        bound = f"at least {minimum:g}" if inclusive else f"greater than {minimum:g}"
        raise argparse.ArgumentTypeError(f"{text}: must be {bound}")
    return value


def positive_int(text: str) -> int:
    return int(number(text, int, 1, "a whole number"))


def non_negative_int(text: str) -> int:
    return int(number(text, int, 0, "a whole number"))


def positive_float(text: str) -> float:
    return float(number(text, float, 0, "a number", inclusive=False))


def non_negative_float(text: str) -> float:
    return float(number(text, float, 0, "a number"))


def seconds(text: str) -> float:
    return float(number(text, float, 0, "a number of seconds"))


def add_threads_arg(parser: argparse.ArgumentParser, what: str, default: int | None = None) -> None:
    from kernorch.options import DEFAULT_THREADS

    default = DEFAULT_THREADS if default is None else default
    parser.add_argument("--threads", type=positive_int, default=default,
                        help=f"{what} (default {default})")  # fmt: skip


def add_cost_arg(parser: argparse.ArgumentParser, what: str) -> None:
    from kernorch.options import COST_MODELS

    parser.add_argument("--cost", choices=COST_MODELS, default="profile",
                        help=f"{what}: profile (default) compiles and times candidate kernels on this machine, "
                        "cached in the profile database; analytic uses a roofline model")  # fmt: skip


def make_options(args: argparse.Namespace) -> Options:
    """The one place CLI arguments become compile options; absent arguments keep Options' defaults."""
    from kernorch.options import Options, OrchestrationLimits

    limits = OrchestrationLimits()
    if hasattr(args, "max_kernel_size"):
        limits = OrchestrationLimits(max_kernel_size=args.max_kernel_size,
                                     max_elementwise_kernel_size=args.max_elementwise_kernel_size,
                                     max_subgraph_size=args.max_subgraph_size,
                                     solver_time_limit=args.time_limit)  # fmt: skip
    given = {name: getattr(args, name) for name in ("threads", "cost", "device", "rewrite", "rewrite_budget", "layout",
                                                     "strict", "workers", "screen", "tf32", "precision",
                                                     "validate", "in_plan")
             if getattr(args, name, None) is not None}  # fmt: skip
    options = Options(limits=limits).with_(**given)
    if getattr(args, "dim", None) or getattr(args, "pad", None):
        from kernorch.frontend import parse_dim_buckets

        options = options.with_(buckets=parse_dim_buckets(args.dim), pad=tuple(args.pad or ()))
    if getattr(args, "range", None):
        options = options.with_(ranges=tuple(args.range))
    return options


def add_layout_arg(parser: argparse.ArgumentParser) -> None:
    from kernorch.options import LAYOUT_POLICIES

    parser.add_argument("--layout", choices=LAYOUT_POLICIES, default="auto",
                        help="which values are stored channels-last: auto (default) decides for the whole graph "
                        "with a 0-1 program over measured conv and transpose costs; channels-last makes every "
                        "convolution channels-last (torch.compile's rule); nchw keeps every value row-major")


def add_rewrite_args(parser: argparse.ArgumentParser) -> None:
    from kernorch.options import DEFAULT_REWRITE_BUDGET_SECONDS as DEFAULT_REWRITE_BUDGET

    parser.add_argument("--no-rewrite", dest="rewrite", action="store_false",
                        help="skip the primitive-graph rewrites (CSE, simplification, TASO-style substitutions)")
    parser.add_argument("--no-screen", dest="screen", action="store_false", default=None,
                        help="profile every candidate kernel, also the fusions the GIR performance model predicts "
                        "more than 2x slower than their primitives one by one (left out by default)")
    parser.add_argument("--rewrite-budget", type=seconds, default=DEFAULT_REWRITE_BUDGET, metavar="SECONDS",
                        help="time for trying the cost-guided rewrites, each judged by orchestrating its "
                        f"neighbourhood before and after (default {DEFAULT_REWRITE_BUDGET:g})")


def progress_bars(show: bool, rewrite_site: Callable[[str], None] | None = None) -> Progress:
    """Progress bars on stderr for the long stages (hidden when `show` is False or stderr is not a terminal)."""
    from tqdm import tqdm

    from kernorch.pipeline import Progress

    hidden = not show or None  # None: tqdm hides itself when stderr is not a terminal
    return Progress(
        subgraphs=lambda items: tqdm(items, desc="subgraphs", unit="subgraph", file=sys.stderr, leave=False,
                                     disable=hidden),
        tuning=lambda items, total: iter(tqdm(items, total=total, desc="measuring kernels", unit="kernel-round",
                                              file=sys.stderr, leave=False, disable=hidden)),
        rewrite_site=rewrite_site,
    )  # fmt: skip


def orchestrate_model(args: argparse.Namespace, show_progress: bool) -> OrchestrationResult:
    from tqdm import tqdm

    from kernorch.pipeline import plan_model

    options = make_options(args)
    shapes = one_shape_set(args, f"kernorch {args.command}")
    sites = tqdm(desc="cost-guided rewrites", unit="site", file=sys.stderr, leave=False,
                 disable=not show_progress or None)  # fmt: skip

    def site_judged(message: str) -> None:
        sites.update(1)
        sites.set_postfix_str(message[-70:])

    try:
        return plan_model(args.model, shapes, options, progress_bars(show_progress, site_judged))
    finally:
        sites.close()


def median_ms(function: Callable[[], object], runs: int) -> float:
    from kernorch.runtime.timing import time_call

    return time_call(function, runs=runs).median * 1e3
