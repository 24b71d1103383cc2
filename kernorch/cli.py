"""The `kernorch` command line. Exit codes: 0 ok, 1 check/mismatch failed, 2 bad input."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from kernorch.errors import KernorchError
from kernorch.frontend import parse_input_shapes

EXIT_OK, EXIT_MISMATCH, EXIT_BAD_INPUT = 0, 1, 2


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="path to an ONNX model")
    parser.add_argument(
        "--input-shape", action="append", metavar="NAME=D1xD2x...",
        help="bind a model input to a static shape (needed when the model has symbolic dims); repeatable",
    )  # fmt: skip


def cmd_check(args: argparse.Namespace) -> int:
    from kernorch.tools.check import check_model

    report, _ = check_model(args.model, parse_input_shapes(args.input_shape), seed=args.seed, rtol=args.rtol)
    print("\n".join(report.lines()))
    return EXIT_OK if report.passed else EXIT_MISMATCH


def cmd_conformance(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tqdm import tqdm

    from kernorch.tools.conformance import default_cache_dir, generate_node_tests, run_conformance, summarize

    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    print(f"ONNX node tests: {cache} (generated from the installed onnx package on first use)", flush=True)
    generate_node_tests(cache)
    results = run_conformance(cache, args.filter,
                              progress=lambda it: tqdm(it, desc="cases", unit="case", disable=args.quiet,
                                                       file=sys.stderr, leave=False))  # fmt: skip
    per_op = summarize(results)
    width = max((len(op) for op in per_op), default=2)
    print(f"{'operator':<{width}}  passed  failed  unsupported")
    for op, counts in sorted(per_op.items()):
        print(f"{op:<{width}}  {counts['passed']:>6}  {counts['failed']:>6}  {counts['unsupported']:>11}")
    shown = [r for r in results if r.status == "failed" or (args.verbose and r.status == "unsupported")]
    for result in shown:
        print(f"{result.status.upper()} {result.name}: {result.detail}")
    totals = {status: sum(1 for r in results if r.status == status) for status in ("passed", "failed", "unsupported")}
    print(f"{totals['passed']} passed, {totals['failed']} failed, {totals['unsupported']} unsupported")
    return EXIT_MISMATCH if totals["failed"] else EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from kernorch.tools.check import check_model
    from kernorch.tools.demo_models import DEMO_MODELS

    status = EXIT_OK
    for name, build in DEMO_MODELS.items():
        print(f"== built-in model: {name}")
        report, graph = check_model(build())
        print("primitive graph:")
        for node in graph.nodes:
            inputs = ", ".join("const" if v in graph.constants else v.rsplit("/", 1)[-1] for v in node.inputs)
            print(f"  {node.prim:<16} ({inputs}) <- {node.origin}")
        print("check against onnxruntime:")
        print("\n".join(report.lines()))
        status = max(status, EXIT_OK if report.passed else EXIT_MISMATCH)
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernorch",
        description="Optimal kernel orchestration for ONNX inference graphs (Korch-style, CPU). "
        "Exit codes: 0 ok, 1 check failed, 2 bad input (unsupported op, malformed model, wrong shape).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = commands.add_parser(
        "check", help="fission a model, run it with the reference interpreter and compare with onnxruntime",
        description="Import MODEL, fission it into primitives, run the primitive graph with the reference "
        "interpreter on seeded random inputs (integer token ids drawn in range) and compare with onnxruntime. "
        "Prints primitive counts by kind and the max abs / relative error (relative to the output's max "
        "magnitude). Exit 0 when the relative error is within --rtol, else 1.",
    )  # fmt: skip
    _add_model_args(check)
    check.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    check.add_argument("--rtol", type=float, default=1e-4, help="relative error tolerance (default 1e-4)")
    check.set_defaults(handler=cmd_check)

    conformance = commands.add_parser(
        "conformance", help="run the ONNX backend node tests through import, fission and reference execution",
        description="Regenerate the ONNX backend node tests from the installed onnx package into a cache "
        "directory (once), run each case and print a per-operator summary; the last line is "
        "'N passed, N failed, N unsupported'. Exit 1 if any case failed.",
    )  # fmt: skip
    conformance.add_argument("--cache-dir", help="where the generated tests live (default ~/.cache/kernorch/...)")
    conformance.add_argument("-k", "--filter", default="", help="only cases whose name contains this text")
    conformance.add_argument("-v", "--verbose", action="store_true", help="also list every unsupported case")
    conformance.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    conformance.set_defaults(handler=cmd_conformance)

    demo = commands.add_parser(
        "demo", help="fission and check the built-in models (self-attention, conv-norm-act)",
        description="Build two small models with onnx.helper, print their primitive graphs and check them "
        "against onnxruntime.",
    )  # fmt: skip
    demo.set_defaults(handler=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KernorchError as error:
        print(f"kernorch: error: {error}", file=sys.stderr)
        return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
