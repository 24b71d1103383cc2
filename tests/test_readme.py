"""The README cannot drift from the code: its examples marked as tests run as written (in one directory, in order,
on a small convolution model named model.onnx with an input named "input"), every Python block compiles, every
`kernorch` command names a subcommand and options the CLI has, and every `make` target it names exists."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kernorch
from kernorch.cli import main as cli_main
from kernorch.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MARK = "<!-- README test:"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)


def blocks() -> Iterator[tuple[str, str, bool]]:
    """(language, code, marked to run) of every fenced block, in order."""
    for match in FENCE.finditer(README):
        before = README[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        yield match[1], match[2], before.startswith(MARK)


def commands() -> list[tuple[str, str]]:
    """(subcommand, the command with its continuation lines) of every `kernorch ...` line in a block."""
    found: list[tuple[str, str]] = []
    for _, code, _ in blocks():
        for line in code.splitlines():
            stripped = line.split("  #")[0].strip()
            if stripped.startswith("kernorch "):
                found.append((stripped.split()[1], stripped))
            elif found and stripped.startswith("[") and line.startswith(" "):  # a synopsis continued
                found[-1] = (found[-1][0], found[-1][1] + " " + stripped)
    return found


def small_model(path: Path) -> None:
    w = np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.2
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "readme", [helper.make_tensor_value_info("input", TensorProto.FLOAT, (1, 3, 16, 16))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, 16, 16))], [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_the_marked_examples_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERNORCH_CACHE", str(tmp_path / "cache"))
    small_model(tmp_path / "model.onnx")
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    namespace: dict[str, object] = {"x": x}
    ran = 0
    for language, code, marked in blocks():
        if not marked:
            continue
        ran += 1
        if language == "python":
            if "torch" in code:
                pytest.importorskip("torch")
            exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's own example
            if "outputs" in namespace:
                assert isinstance(namespace.pop("outputs"), dict)
            namespace["x"] = x  # the torch example rebinds x to a tensor
            continue
        for line in code.splitlines():
            argv = shlex.split(line.split("  #")[0])
            assert argv[0] == "kernorch", line
            assert cli_main(argv[1:]) == 0, line
    assert ran >= 5
    assert (tmp_path / "plan.svg").exists() and (tmp_path / "report.html").exists()
    assert isinstance(namespace["model"], kernorch.CompiledModel)


def test_every_python_block_compiles() -> None:
    python = [code for language, code, _ in blocks() if language == "python"]
    assert len(python) >= 5
    for code in python:
        compile(code, "README.md", "exec")


def _options(subcommand: str) -> set[str]:
    parser = build_parser()
    sub = next(action for action in parser._actions if action.dest == "command")  # the subparsers
    return {option for action in sub.choices[subcommand]._actions for option in action.option_strings}  # type: ignore[attr-defined]


def test_every_command_uses_options_the_cli_has() -> None:
    found = commands()
    assert {subcommand for subcommand, _ in found} >= {"check", "optimize", "run", "explain", "conformance", "bench",
                                                        "demo"}  # fmt: skip
    for subcommand, command in found:
        options = _options(subcommand)
        for option in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", command):
            assert option in options, f"README: `{command}` uses {option}, which `kernorch {subcommand}` lacks"


def test_every_make_target_named_exists() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, re.M))
    named = set(re.findall(r"^make ([a-z][a-z0-9-]*)", "\n".join(code for _, code, _ in blocks()), re.M))
    assert named >= {"demo", "test", "mutate", "sanitize", "zoo"}
    assert named <= targets, named - targets
