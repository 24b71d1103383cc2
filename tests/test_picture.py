"""Pictures of a plan: kernels as coloured clusters, redundant primitives marked, the HTML report opened in
headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.cli import main
from kernorch.fission import fission
from kernorch.frontend import import_model
from kernorch.ir.kernel import make_kernel
from kernorch.tools.picture import kernel_views, plan_graph, render_svg


def _model() -> onnx.ModelProto:
    """conv → relu (one library kernel) → Det (onnxruntime fallback) and a softmax branch (generated C)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 2, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Det", ["r"], ["d"], name="det"),
        helper.make_node("Softmax", ["r"], ["s"], axis=-1, name="softmax"),
    ]
    outputs = [helper.make_tensor_value_info("d", TensorProto.FLOAT, [1, 4]),
               helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 4, 4, 4])]  # fmt: skip
    return helper.make_model(helper.make_graph(nodes, "pictured", [x], outputs, [weight]),
                             opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip


def test_a_primitive_computed_by_two_kernels_is_drawn_in_both_and_marked() -> None:
    graph = fission(import_model(_model()), strict=False)
    softmax = [i for i, n in enumerate(graph.nodes) if n.origin == "softmax"]
    relu = next(i for i, n in enumerate(graph.nodes) if n.prim == "relu")
    # relu recomputed inside the softmax kernel: Korch's redundant computation
    first = make_kernel(graph, (relu,), graph.nodes[relu].outputs)
    second = make_kernel(graph, (relu, *softmax), graph.nodes[softmax[-1]].outputs)
    dot = plan_graph(graph, kernel_views([first, second], [1e-6, 2e-6])).source
    assert f"k0_n{relu}" in dot and f"k1_n{relu}" in dot
    assert dot.count("×2 kernels") == 2 and dot.count("#d62728") >= 2
    assert "kernel 1 · 2.0 µs" in dot


def test_explain_writes_the_svg_and_an_html_report_chromium_renders(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(), str(path))
    svg, report = tmp_path / "plan.svg", tmp_path / "report.html"
    assert main(["explain", str(path), "--cost", "analytic", "--svg", str(svg), "--html", str(report)]) == 0
    out = capsys.readouterr().out
    kernels = int(re.search(r"(\d+) kernels, plan cost", out).group(1))  # type: ignore[union-attr]
    assert f"picture of the plan: {svg}" in out and f"report: {report}" in out
    text = svg.read_text()
    assert text.count('class="cluster"') == kernels + 1  # + the legend
    assert "oneDNN" in text and "onnxruntime: Det" in text and "generated C" in text
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Chromium is missing: `make test` installs it (Debian package chromium)"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]  # fmt: skip
    dom = subprocess.run([chromium, *flags, "--dump-dom", report.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout  # fmt: skip
    # the page parsed with the picture inline: an <svg> with one cluster per kernel, the kernel table
    assert "<svg" in dom and dom.count('class="cluster"') == kernels + 1
    assert dom.count("<tr class=") == kernels and "kernorch plan: m" in dom
    shot = tmp_path / "report.png"
    subprocess.run([chromium, *flags, "--window-size=1200,900", f"--screenshot={shot}", report.as_uri()],
                   capture_output=True, timeout=120, check=True)  # fmt: skip
    assert shot.stat().st_size > 10_000  # a rendered page, not a blank one


def test_missing_graphviz_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import graphviz

    from kernorch.tools.picture import GraphvizMissing

    def missing(*args: object, **kwargs: object) -> bytes:
        raise graphviz.ExecutableNotFound(("dot",))

    monkeypatch.setattr(graphviz.Digraph, "pipe", missing)
    with pytest.raises(GraphvizMissing, match="apt-get install graphviz"):
        render_svg(graphviz.Digraph())


def test_explain_draws_the_measured_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kernorch.testing import branchy_model

    path = tmp_path / "branchy.onnx"
    onnx.save(branchy_model(cells=1, branches=4, channels=8, size=10), str(path))
    png = tmp_path / "schedule.png"
    assert main(["explain", str(path), "--cost", "analytic", "--no-rewrite", "--schedule", str(png)]) == 0
    out = capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000
    assert re.search(r"kernel by kernel [\d.]+ ms, rProgram [\d.]+ ms .*simulator predicted [\d.]+ ms", out), out
    assert f"schedule picture (measured timestamps): {png}" in out and "rTasks on 2 vEUs" in out


def test_overlap_counts_only_different_kernels_side_by_side() -> None:
    from kernorch.tools.schedule_picture import _overlaps

    # kernel 1 split over both vEUs (not an overlap of different kernels); kernels 2 and 3 beside each other
    # for 2 units of time; a device-wide call (vEU -1) is never counted
    spans = [(1, 0, 0.0, 1.0), (1, 1, 0.0, 1.0), (2, 0, 1.0, 4.0), (3, 1, 2.0, 5.0), (4, -1, 5.0, 6.0)]
    total, pairs = _overlaps(spans)
    assert total == 2.0 and pairs == [(2, 3, 2.0)]
