"""Bad input: one line naming the cause, exit code 2. Failed check: exit code 1."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from kernorch.cli import main
from kernorch.errors import InputMismatch, UnsupportedOperator
from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.runtime import run_reference
from kernorch.testing import random_array, single_op_model
from kernorch.tools.demo_models import conv_norm_act_block


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    return code, err


def save(model: onnx.ModelProto, path: Path) -> str:
    path.write_bytes(model.SerializeToString())
    return str(path)


def test_truncated_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = conv_norm_act_block().SerializeToString()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 3])
    code, err = run_cli(["check", str(path)], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and "truncated" in err


def test_not_onnx(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.onnx"
    path.write_text("this is a text file, not a protobuf\n" * 10)
    code, err = run_cli(["check", str(path)], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and "not" in err


def test_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(["check", "/nonexistent/model.onnx"], capsys)
    assert code == 2 and "not found" in err


def test_unknown_operator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = random_array((3, 4))
    model = single_op_model("Hardmax", {"x": x})
    code, err = run_cli(["check", save(model, tmp_path / "m.onnx"), "--strict"], capsys)
    assert code == 2 and len(err.splitlines()) == 1
    assert "Hardmax" in err and "no fission rule" in err
    # without --strict it runs through onnxruntime, said in one warning line
    code, err = run_cli(["check", save(model, tmp_path / "m.onnx")], capsys)
    assert code == 0 and len(err.splitlines()) == 1 and err.startswith("kernorch: warning:") and "Hardmax" in err


def test_unsupported_attribute(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = random_array((1, 1, 4, 4))
    constants = {"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 0.5, 0.5], np.float32)}
    model = single_op_model("Resize", {"x": x}, {"mode": "linear", "antialias": 1}, constants,
                            input_order=["x", "roi", "scales"], opset=18)  # fmt: skip
    code, err = run_cli(["check", save(model, tmp_path / "m.onnx"), "--strict"], capsys)
    assert code == 2 and len(err.splitlines()) == 1
    assert "antialias" in err and "Resize" in err


def test_unsupported_attribute_value_names_op_attribute_and_node() -> None:
    x = random_array((2, 3))
    model = single_op_model("Gelu", {"x": x}, {"approximate": "sigmoid"}, opset=20)
    model.graph.node[0].name = "my_gelu"
    with pytest.raises(UnsupportedOperator) as info:
        fission(import_model(model))
    message = str(info.value)
    assert "Gelu" in message and "approximate" in message and "my_gelu" in message


def _symbolic_model() -> onnx.ModelProto:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "symbolic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_symbolic_dim_needs_input_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save(_symbolic_model(), tmp_path / "sym.onnx")
    code, err = run_cli(["check", path], capsys)
    assert code == 2 and "'N'" in err and "--input-shape" in err
    assert main(["check", path, "--input-shape", "x=3x4"]) == 0
    code, err = run_cli(["check", path, "--input-shape", "x=3x5"], capsys)
    assert code == 2 and "contradicts" in err
    code, err = run_cli(["check", path, "--input-shape", "nope=3x4"], capsys)
    assert code == 2 and "nope" in err


def test_wrong_runtime_input_dtype_and_shape() -> None:
    graph = fission(import_model(conv_norm_act_block(channels=4, size=8)))
    good = random_array((1, 4, 8, 8))
    assert run_reference(graph, {"x": good})["y"].shape == (1, 4, 8, 8)
    with pytest.raises(InputMismatch, match="dtype float64"):
        run_reference(graph, {"x": good.astype(np.float64)})
    with pytest.raises(InputMismatch, match=r"shape \(1, 4, 8, 7\)"):
        run_reference(graph, {"x": good[..., :7]})
    with pytest.raises(InputMismatch, match="missing"):
        run_reference(graph, {})


def test_wrong_input_to_a_saved_plan_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import kernorch

    plan = kernorch.compile(conv_norm_act_block(channels=4, size=8), cost="analytic", device="cpu-nominal")
    directory = plan.save(tmp_path / "plan")
    np.save(tmp_path / "x.npy", random_array((1, 4, 8, 7)))
    code, err = run_cli(["run", str(directory), "--input", f"x={tmp_path / 'x.npy'}"], capsys)
    assert code == 2 and "shape (1, 4, 8, 7)" in err and len(err.splitlines()) == 1


def test_failed_check_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save(conv_norm_act_block(channels=4, size=8), tmp_path / "m.onnx")
    # A tolerance no float computation meets: the comparison must report failure, not pass.
    assert main(["check", path, "--rtol", "0"]) == 1
    assert "FAIL" in capsys.readouterr().out


# (subcommand and its positional arguments, numeric option, values it must refuse)
BAD_NUMBERS = [
    (cmd, option, values)
    for cmd in (["optimize", "m.onnx"], ["explain", "m.onnx"])
    for option, values in [("--threads", ["0", "-3", "two", "1.5"]), ("--max-kernel-size", ["0", "-1", "x"]),
                           ("--max-subgraph-size", ["0", "-2"]), ("--time-limit", ["0", "-1", "nan", "inf"]),
                           ("--rewrite-budget", ["-1", "nan", "soon"])]
] + [
    (["explain", "m.onnx"], "--rejected", ["-2", "many"]),
    (["explain", "m.onnx"], "--gir", ["-1", "first"]),
    (["check", "m.onnx"], "--seed", ["-1", "x"]),
    (["check", "m.onnx"], "--rtol", ["-1e-4", "nan", "tight"]),
    (["check", "m.onnx"], "--rewrite-budget", ["-1"]),
    (["run", "plan_dir"], "--runs", ["0", "-5", "x"]),
    (["run", "plan_dir"], "--threads", ["0", "-3"]),
    (["run", "plan_dir"], "--seed", ["-1"]),
    (["bench", "m.onnx"], "--runs", ["0", "-1"]),
    (["bench", "m.onnx"], "--threads", ["0", "-3", "many"]),
    (["bench", "m.onnx"], "--rewrite-budget", ["-1"]),
    (["demo"], "--threads", ["0", "-3"]),
    (["demo"], "--runs", ["0", "x"]),
]


@pytest.mark.parametrize(("command", "option", "values"), BAD_NUMBERS,
                         ids=[f"{c[0]}{o}" for c, o, _ in BAD_NUMBERS])  # fmt: skip
def test_bad_numeric_arguments_exit_2_with_one_line(command: list[str], option: str, values: list[str],
                                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    for value in values:
        with pytest.raises(SystemExit) as exit_info:
            main([*command, f"{option}={value}"])
        assert exit_info.value.code == 2, (option, value)
        err = capsys.readouterr().err
        assert "Traceback" not in err
        last = err.strip().splitlines()[-1]  # argparse's usage lines, then the one line naming the cause
        assert last.startswith(f"kernorch {command[0]}: error: argument {option}"), last
        assert value in last, last


def test_bad_arguments_in_a_fresh_process_print_no_traceback(tmp_path: Path) -> None:
    """Through the installed entry point, as a user runs it: exit 2, one error line, no traceback."""
    import subprocess
    import sys

    for argv in (["run", str(tmp_path), "--runs", "0"], ["optimize", "m.onnx", "--threads", "-3"],
                 ["run", str(tmp_path / "missing")], ["check", str(tmp_path / "missing.onnx")]):  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "kernorch.cli", *argv], capture_output=True, text=True,
                              check=False, timeout=120)  # fmt: skip
        assert done.returncode == 2, (argv, done.stderr)
        assert "Traceback" not in done.stderr
        assert len([line for line in done.stderr.splitlines() if "error" in line]) == 1, done.stderr


HOSTILE_NAMES = ["int", "return", "x\"); system(\"touch pwned", "a\nb", "ü-名前", "$(touch pwned)", "*/ int k;",
                 "--help", "../../etc/passwd", " ", "a b"]  # fmt: skip


def test_hostile_value_and_node_names_compile_and_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Names are data: C keywords, quotes, newlines, non-ASCII and shell syntax never reach generated code."""
    import kernorch
    from kernorch.tools.check import run_onnxruntime

    monkeypatch.chdir(tmp_path)
    names = HOSTILE_NAMES
    w = random_array((4, 4, 3, 3), seed=1)
    nodes = [helper.make_node("Conv", [names[0], names[1]], [names[2]], name=names[3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", [names[2]], [names[4]], name=names[5]),
             helper.make_node("Add", [names[4], names[0]], [names[6]], name=names[7]),
             helper.make_node("Sigmoid", [names[6]], [names[8]], name=names[9])]  # fmt: skip
    graph = helper.make_graph(nodes, names[10],
                              [helper.make_tensor_value_info(names[0], TensorProto.FLOAT, (1, 4, 5, 5))],
                              [helper.make_tensor_value_info(names[8], TensorProto.FLOAT, (1, 4, 5, 5))],
                              [onnx.numpy_helper.from_array(w, names[1])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    x = random_array((1, 4, 5, 5))
    for layout in ("nchw", "channels-last"):
        compiled = kernorch.compile(model, cost="analytic", device="cpu-nominal", layout=layout)
        np.testing.assert_allclose(compiled(x), run_onnxruntime(model, {names[0]: x})[names[8]], rtol=1e-5,
                                   atol=1e-5)  # fmt: skip
        loaded = kernorch.load(compiled.save(tmp_path / f"plan-{layout}"))
        np.testing.assert_allclose(loaded(x), compiled(x), rtol=0, atol=0)
    assert not (tmp_path / "pwned").exists()


def test_names_that_are_not_utf8_are_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by the fuzzer: protobuf strings must be UTF-8; a model breaking that is refused in one line."""
    x = random_array((2, 3))
    data = single_op_model("Relu", {"qq": x}).SerializeToString().replace(b"qq", b"\xd9\xd9")
    path = tmp_path / "bad.onnx"
    path.write_bytes(data)
    code, err = run_cli(["check", str(path)], capsys)
    assert code == 2 and "not valid UTF-8" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("data_type", [46, 123])
def test_a_data_type_onnx_does_not_define_is_bad_input(data_type: int, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Found by the fuzzer: a flipped byte in an initializer's data_type escaped as a traceback."""
    model = single_op_model("Conv", {"x": random_array((1, 3, 6, 6))}, {}, {"w": random_array((2, 3, 3, 3))})
    model.graph.initializer[0].data_type = data_type
    code, err = run_cli(["check", save(model, tmp_path / "m.onnx"), "--no-rewrite"], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and f"unknown ({data_type})" in err, err


def test_softmax_over_an_empty_axis_matches_onnxruntime(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by the fuzzer: the max inside softmax, over nothing, raised. It is the identity of max (-inf)."""
    model = single_op_model("Softmax", {"x": np.zeros((2, 0, 3), np.float32)}, {"axis": 1})
    code, err = run_cli(["check", save(model, tmp_path / "m.onnx"), "--no-rewrite"], capsys)
    assert code == 0, err
    model = single_op_model("ReduceMax", {"x": np.zeros((2, 0, 3), np.float32)}, {"keepdims": 1},
                            {"axes": np.array([1], np.int64)}, opset=18)  # fmt: skip
    code, err = run_cli(["check", save(model, tmp_path / "r.onnx"), "--no-rewrite", "--strict"], capsys)
    assert code == 2 and "empty axis" in err and len(err.splitlines()) == 1  # ONNX leaves it undefined: refused
    code, err = run_cli(["check", save(model, tmp_path / "r.onnx"), "--no-rewrite"], capsys)
    assert code == 0 and "run through onnxruntime" in err  # without --strict: onnxruntime's answer, with a warning


def test_found_by_the_fuzzer_with_the_fallback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A graph listing one output twice is refused at import; a node that falls back to onnxruntime and fails
    there (a Reshape to another element count) is one error line, no onnxruntime log, no warning beside it."""
    x = random_array((2, 3))
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "twice", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])] * 2)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    code, err = run_cli(["check", save(model, tmp_path / "twice.onnx")], capsys)
    assert code == 2 and err.strip() == "kernorch: error: graph output 'y' is listed more than once"
    bad = single_op_model("Reshape", {"x": x}, constants={"shape": np.array([4, 4], np.int64)})
    code, err = run_cli(["check", save(bad, tmp_path / "reshape.onnx")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("kernorch: error: onnx_node from Reshape_0: onnxruntime failed on Reshape")  # names the node


def test_reshape_zero_beyond_the_input_rank_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by the fuzzer: a 0 (copy this dimension) at a position the input does not have raised IndexError."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [3], [3, 2, 0])
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "zero",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2, 1])], [shape])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    code, err = run_cli(["check", save(model, tmp_path / "m.onnx")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "does not have" in err, err


def test_a_kernorch_bug_is_one_line_too_and_its_traceback_on_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """An exception that is no KernorchError is a bug in kernorch: still one line (exit 2), naming it as one;
    KERNORCH_DEBUG=1 lets the traceback through for the bug report."""
    import kernorch.tools.check

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("a stage typed a value two ways\nsecond line")

    monkeypatch.setattr(kernorch.tools.check, "check_model", broken)
    path = save(conv_norm_act_block(), tmp_path / "m.onnx")
    code, err = run_cli(["check", path], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("kernorch: internal error: ValueError: a stage typed a value two ways") and "bug" in err
    monkeypatch.setenv("KERNORCH_DEBUG", "1")
    with pytest.raises(ValueError, match="typed a value two ways"):
        main(["check", path])
