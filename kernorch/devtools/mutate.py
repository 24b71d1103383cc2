"""Do the tests catch broken code? Mutants, each a one-line change to the source that a real bug could make, and
the tests that must then fail. Each test module declares the mutants its tests must kill (`MUTANTS = [here(...)]`
beside them: a kernel family's in its test, like its sanitizer marker); this module collects them, with the few
whose tests are a whole directory (below).

For each mutant the source file is changed in place, the named tests run (pytest, `-x`), and the file is
restored (also on Ctrl-C). A mutant is *killed* when the tests fail, *survived* when they pass. Run on
demand (`make mutate`, hours for all; `-k TEXT` for those whose name contains TEXT); the table lists every
mutant, its verdict and the tests used.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from kernorch import machine

ROOT = Path(__file__).resolve().parents[2]
# the mutants whose tests are a directory; the rest live beside their tests
REWRITES = "kernorch/rewrite"
VALIDATE = "kernorch/validate"


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # the source file changed (relative to the repository)
    original: str  # the text changed: exactly one place of the file
    mutated: str
    tests: tuple[str, ...]  # pytest arguments (files, directories, `file::test`) that must then fail
    # a CPU flag (/proc/cpuinfo's name) without which the mutated code never runs here: an AVX-512 path of a kernel
    # that compiles for the machine's ISA, whose tests pass on AVX2 because they run the AVX2 path
    needs: str = ""


def here(name: str, original: str, mutated: str, *, file: str = "", tests: tuple[str, ...] = (),
         needs: str = "") -> Mutant:  # fmt: skip
    """A mutant declared in a test module's `MUTANTS`, beside the tests that kill it: of the module that test module
    tests (x_test.py tests x.py) unless `file` names another, killed by that test module unless `tests` says which
    (collected() fills both in); `needs`: the CPU flag its code runs with."""
    return Mutant(name, file, original, mutated, tests, needs)


def testing_modules() -> list[Path]:
    """Every test module of the repository (pytest's naming: kernorch/**/*_test.py, tests/test_*.py)."""
    return sorted([*ROOT.glob("kernorch/**/*_test.py"), *ROOT.glob("tests/test_*.py")])


def collected() -> tuple[Mutant, ...]:
    """The mutants below (those whose tests span a directory), then every test module's `MUTANTS`, resolved."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    found = list(MUTANTS)
    for path in testing_modules():
        if "\nMUTANTS = [" not in path.read_text():
            continue
        test = path.relative_to(ROOT).as_posix()
        module = importlib.import_module(test.removesuffix(".py").replace("/", "."))
        for mutant in module.MUTANTS:
            if not mutant.file and not test.endswith("_test.py"):  # tests/test_x.py tests no one module
                raise ValueError(f"{test}: the mutant {mutant.name!r} must name its file")
            file = mutant.file or test.removesuffix("_test.py") + ".py"
            found.append(replace(mutant, file=file, tests=mutant.tests or (test,)))
    return tuple(found)


MUTANTS: tuple[Mutant, ...] = (
    # rewrites (every rule's test in kernorch/rewrite)
    Mutant("neutral-operand treats sub as commutative", "kernorch/rewrite/rules/cleanup.py", '"sub": (0, False)',
           '"sub": (0, True)', (REWRITES,)),
    Mutant("div-by-constant forgets the reciprocal", "kernorch/rewrite/rules/algebra.py",
           'ctx.emit("mul", numerator, ctx.emit("reciprocal", denominator))', 'ctx.emit("mul", numerator, denominator)',
           (REWRITES,)),
    Mutant("a pointwise conv moves before a downsample", "kernorch/rewrite/rules/linear.py",
           "if pixels_before > pixels_after or (pixels_before == pixels_after and outputs > channels):",
           "if pixels_before == pixels_after and outputs > channels:", (REWRITES,)),
    Mutant("a folded pointwise conv multiplies its weights the wrong way round", "kernorch/rewrite/rules/linear.py",
           "folded = ctx.constant((matrix.astype(np.float64) @ a.astype(np.float64)).astype(a.dtype))",
           "folded = ctx.constant((matrix.astype(np.float64).T @ a.astype(np.float64)).astype(a.dtype))",
           (REWRITES,)),
    Mutant("a bias moves through a reshape onto an axis of the same size elsewhere", "kernorch/rewrite/rules/linear.py",
           "if source[a] == shape[axis] and int(np.prod(source[:a])) == before),", "if source[a] == shape[axis]),",
           (REWRITES,)),
    Mutant("sub-constant forgets the negation", "kernorch/rewrite/rules/algebra.py",
           'ctx.emit("add", left, ctx.emit("neg", right))', 'ctx.emit("add", left, right)', (REWRITES,)),
    Mutant("scales out of a product add up instead of multiplying", "kernorch/rewrite/rules/algebra.py",
           'ctx.emit("mul", ctx.emit("mul", x, y), ctx.emit("mul", c1, c2))',
           'ctx.emit("mul", ctx.emit("mul", x, y), ctx.emit("add", c1, c2))', (REWRITES,)),
    Mutant("stack keeps a lower layer whose h is used", "kernorch/rewrite/rules/recurrent.py",
           "any(ctx.consumers(v) or ctx.is_output(v)", "any(ctx.consumers(v) and ctx.is_output(v)", (REWRITES,)),
    Mutant("validation keeps a plan faster by less than the margin", "kernorch/validate/plans.py",
           "chosen = fastest if medians[fastest] < medians[0] * (1 - MARGIN) else 0", "chosen = fastest",
           (VALIDATE,)),
    Mutant("validation keeps a plan whose outputs differ", "kernorch/validate/plans.py",
           "agrees = [True] + [_same_outputs(expected, model.run(feeds), bf16) for model in models[1:]]",
           "agrees = [True] * len(models)", (VALIDATE,)),
    Mutant("in-plan costs keep the per-launch dispatch", "kernorch/validate/in_plan.py",
           "    if excess <= 0:\n        return times", "    if True:\n        return times", (VALIDATE,)),
)  # fmt: skip


def run_mutant(mutant: Mutant, timeout: float) -> tuple[str, float]:
    path = ROOT / mutant.file
    source = path.read_text()
    if source.count(mutant.original) != 1:
        return f"stale ({source.count(mutant.original)} matches)", 0.0
    if mutant.needs and mutant.needs not in machine.isa_flags():
        return f"not run here (its code runs with {mutant.needs} only)", 0.0
    started = time.monotonic()
    try:
        path.write_text(source.replace(mutant.original, mutant.mutated))
        # no -q of its own: with the project's addopts (-q) it would be -qq, which drops the "N passed" summary
        # that tells a survivor from a mutant whose tests all skipped here
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-p", "no:cacheprovider", *mutant.tests],
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip
        summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        if done.returncode != 0:
            verdict = "killed"
        elif " passed" not in summary:  # every test skipped here (no AMX tiles, no shared models): not a survivor
            verdict = f"not run here ({summary.split(' in ')[0] or 'no tests ran'})"
        else:
            verdict = "SURVIVED"
    except subprocess.TimeoutExpired:
        verdict = "killed (timeout)"
    finally:
        path.write_text(source)
    return verdict, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", "--filter", default="", help="only mutants whose name contains this text")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant's tests")
    args = parser.parse_args(argv)
    chosen = [m for m in collected() if args.filter in m.name]
    print("| # | mutant | file | verdict | seconds | tests |\n|---|---|---|---|---|---|", flush=True)
    survived = not_run = 0
    for index, mutant in enumerate(chosen, 1):
        verdict, seconds = run_mutant(mutant, args.timeout)
        survived += verdict == "SURVIVED" or verdict.startswith("stale")
        not_run += verdict.startswith("not run")
        tests = ", ".join(t.split("::")[-1].removesuffix(".py").split("/")[-1] for t in mutant.tests)
        print(f"| {index} | {mutant.name} | {mutant.file} | {verdict} | {seconds:.0f} | {tests} |", flush=True)
    print(f"\n{len(chosen) - survived - not_run} of {len(chosen)} mutants killed, {survived} survived or stale, "
          f"{not_run} not run here (their tests skip, or their code does not run, on this machine)")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
