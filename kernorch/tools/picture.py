"""Pictures of a plan: the primitive graph with each kernel drawn as a coloured cluster (Korch Fig. 4c), and a
self-contained HTML report around it (`kernorch explain MODEL --svg PLAN.svg --html REPORT.html`).

A primitive computed by several kernels (redundant computation) appears once inside each of them, outlined in
red and marked ×N. Library kernels (oneDNN / direct C convolution) are blue and name what they absorbed;
generated C kernels are orange; kernels run by the reference implementation grey; onnxruntime fallbacks pink.
Edges between clusters are the values kernels hand each other through memory. Rendering uses Graphviz's `dot`.
"""

from __future__ import annotations

import html
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import graphviz

from kernorch.codegen.backends import ONNXRUNTIME, REFERENCE, choose_backend, plan_views
from kernorch.codegen.library import absorbed_summary
from kernorch.errors import KernorchError
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel
from kernorch.orchestrate import OrchestrationResult

# by Backend.family
COLOURS = {"library call": "#cfe2ff", "native C": "#e0cffc", "generated C": "#ffe5b4", "view": "#ffffff",
           "reference": "#e9ecef", "onnxruntime": "#f8d7da", "generated Triton": "#d1e7dd",
           "Triton template": "#a3cfbb"}  # fmt: skip
LEGEND = {"library call": "library call (oneDNN; cuBLAS/cuDNN on a GPU)",
          "native C": "native C (direct convs, LSTM templates)", "generated C": "generated C", "view": "view (no copy)",
          "reference": "reference kernel", "onnxruntime": "onnxruntime fallback",
          "generated Triton": "generated Triton", "Triton template": "Triton matmul template + epilogue"}  # fmt: skip


class GraphvizMissing(KernorchError):
    """Graphviz's `dot` is not installed."""


@dataclass(frozen=True)
class KernelView:
    """What the picture and the report say about one kernel of the plan."""

    index: int
    kernel: CandidateKernel
    cost: float
    kind: str  # its backend's family: a COLOURS key
    title: str  # e.g. "oneDNN conv (channels-last) ← bias, swish" or "generated C"


def kernel_views(kernels: Sequence[CandidateKernel], costs: Sequence[float], device: str = "cpu") -> list[KernelView]:
    """Per kernel what the pictures show; `device` the plan's kind ("cpu" or "gpu": whose backends run it)."""
    views = []
    chosen = [choose_backend(kernel, device) for kernel in kernels]
    backends = [backend or REFERENCE for backend, _ in chosen]
    if device == "cpu":
        backends, _ = plan_views(kernels, backends)  # a concat may copy
    for index, (kernel, cost) in enumerate(zip(kernels, costs, strict=True)):
        backend, reason = backends[index], chosen[index][1]
        if backend != chosen[index][0]:
            reason = "generated C (its inputs cannot be placed inside the output)"
        kind = backend.family
        absorbed = absorbed_summary(kernel)
        if absorbed is not None:
            title = f"{backend.summary(kernel)}: {absorbed}"
        elif backend is ONNXRUNTIME:
            title = "onnxruntime: " + ", ".join(n.attr("op_type") for n in kernel.primitives)
        else:
            title = reason
        views.append(KernelView(index, kernel, cost, kind, title))
    return views


def _shape(graph: Graph, value: str) -> str:
    return "×".join(map(str, graph.types[value].shape)) or "scalar"


def plan_graph(graph: Graph, views: Sequence[KernelView], name: str = "plan") -> graphviz.Digraph:
    """The DOT description: one cluster per kernel, one node per (kernel, primitive)."""
    dot = graphviz.Digraph(name, graph_attr={"rankdir": "TB", "fontname": "Helvetica", "fontsize": "11",
                                             "newrank": "true", "compound": "true"},
                           node_attr={"shape": "box", "style": "rounded,filled", "fillcolor": "white",
                                      "fontname": "Helvetica", "fontsize": "10", "height": "0.3"},
                           edge_attr={"arrowsize": "0.6", "color": "#555555"})  # fmt: skip
    computed_by = Counter(n for view in views for n in view.kernel.nodes)
    writer: dict[str, str] = {}  # value -> the picture node whose kernel writes it to memory
    for view in views:
        for n in view.kernel.nodes:
            for value in graph.nodes[n].outputs:
                if value in view.kernel.outputs:
                    writer.setdefault(value, f"k{view.index}_n{n}")
    for view in views:
        kernel = view.kernel
        with dot.subgraph(name=f"cluster_{view.index}") as cluster:
            cluster.attr(label=f"kernel {view.index} · {view.cost * 1e6:.1f} µs\n{view.title}", style="filled,rounded",
                         fillcolor=COLOURS[view.kind], color="#888888", fontsize="10",
                         tooltip=f"kernel {view.index}: {view.title}")  # fmt: skip
            for n in kernel.nodes:
                node = graph.nodes[n]
                copies = computed_by[n]
                label = f"{node.prim}\n{_shape(graph, node.outputs[0])}"
                label += f"\n×{copies} kernels" if copies > 1 else ""
                extra = {"color": "#d62728", "penwidth": "2.2"} if copies > 1 else {}
                cluster.node(f"k{view.index}_n{n}", label, tooltip=f"{node.prim} from {node.origin}", **extra)
        inside = {v: f"k{view.index}_n{n}" for n in kernel.nodes for v in graph.nodes[n].outputs}
        for n in kernel.nodes:
            for value in graph.nodes[n].inputs:
                if value in inside:
                    dot.edge(inside[value], f"k{view.index}_n{n}")
                elif value in graph.constants:
                    continue  # weights and small constants would crowd the picture
                elif value in writer:
                    dot.edge(writer[value], f"k{view.index}_n{n}", penwidth="1.6", tooltip=value)
                elif value in graph.inputs:
                    dot.node(f"in_{value}", f"input {value}\n{_shape(graph, value)}", shape="ellipse", style="")
                    dot.edge(f"in_{value}", f"k{view.index}_n{n}")
    for value in graph.outputs:
        dot.node(f"out_{value}", f"output {value}\n{_shape(graph, value)}", shape="ellipse", style="")
        source = writer.get(value) or (f"in_{value}" if value in graph.inputs else None)
        if source is not None:
            dot.edge(source, f"out_{value}")
    with dot.subgraph(name="cluster_legend") as legend:
        legend.attr(label="legend", style="rounded", color="#bbbbbb", fontsize="9")
        for kind, text in LEGEND.items():
            legend.node(f"legend_{kind}", text, fillcolor=COLOURS[kind], fontsize="9")
        legend.node("legend_redundant", "computed by several kernels", color="#d62728", penwidth="2.2", fontsize="9")
    return dot


def render_svg(dot: graphviz.Digraph) -> str:
    try:
        return dot.pipe(format="svg").decode()
    except graphviz.ExecutableNotFound:
        raise GraphvizMissing("drawing the plan needs Graphviz's dot (Debian/Ubuntu: apt-get install graphviz; "
                              "`make test` installs it)") from None
    except graphviz.CalledProcessError as error:
        raise KernorchError(f"Graphviz's dot failed: {str(error.stderr or error).strip()[:200]}") from None


def write_svg(path: str | Path, graph: Graph, kernels: Sequence[CandidateKernel], costs: Sequence[float],
              name: str = "plan", device: str = "cpu") -> Path:  # fmt: skip
    target = Path(path)
    svg = render_svg(plan_graph(graph, kernel_views(kernels, costs, device), name))
    _write(target, svg)
    return target


def _write(target: Path, text: str) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    except OSError as error:
        raise KernorchError(f"cannot write {target}: {error.strerror or error}") from None


def write_html(path: str | Path, result: OrchestrationResult, model_name: str, device: str = "cpu") -> Path:
    """One self-contained page: summary, the picture (inline SVG), the kernel table, rewrites and layout."""
    plan = result.plan
    views = kernel_views(plan.kernels, plan.costs, device)
    svg = render_svg(plan_graph(plan.graph, views, model_name))
    svg = svg[svg.index("<svg"):]  # inline: drop the XML prolog and doctype
    computed_by = Counter(n for kernel in plan.kernels for n in kernel.nodes)
    redundant = sum(1 for count in computed_by.values() if count > 1)
    e = html.escape
    optimality = "every subgraph solved to proven optimality" if result.all_optimal else \
        "NOT every subgraph solved to optimality"
    rows = []
    for view in views:
        prims = " → ".join(plan.graph.nodes[n].prim for n in view.kernel.nodes)
        origins = ", ".join(sorted({plan.graph.nodes[n].origin for n in view.kernel.nodes}))
        rows.append(f"<tr class='{view.kind}'><td>{view.index}</td><td class='num'>{view.cost * 1e6:.1f}</td>"
                    f"<td>{e(LEGEND[view.kind])}</td><td>{e(view.title)}</td><td>{e(prims)}</td>"
                    f"<td>{e(origins)}</td></tr>")  # fmt: skip
    sections = [
        f"<h1>kernorch plan: {e(model_name)}</h1>",
        f"<p>{len(plan.kernels)} kernels, plan cost <b>{plan.cost * 1e3:.3f} ms</b> "
        f"({e(result.cost_model)} cost model); "
        f"greedy fusion {result.greedy_plan.cost * 1e3:.3f} ms ({result.greedy_plan.cost / plan.cost:.2f}x); "
        f"{len(plan.graph.nodes)} primitives, {redundant} computed by more than one kernel; "
        f"{optimality}. Generated {e(time.strftime('%Y-%m-%d %H:%M'))}.</p>",
        "<h2>Plan</h2>", f"<div class='picture'>{svg}</div>",
        "<h2>Kernels</h2>", "<table><tr><th>#</th><th>µs</th><th>runs as</th><th>what</th><th>primitives</th>"
        "<th>from ONNX nodes</th></tr>" + "".join(rows) + "</table>",
    ]  # fmt: skip
    if result.rewrite_report is not None:
        report = result.rewrite_report
        items = "".join(f"<li><b>{e(rule)}</b> ×{count}</li>" for rule, count in report.fired_counts().items())
        trials = "".join(f"<li>{e(t.rule)} at {e(t.origin)}: {t.cost_before * 1e6:.1f} → {t.cost_after * 1e6:.1f} µs, "
                         f"{'kept' if t.kept else 'rejected'}</li>" for t in report.trials)  # fmt: skip
        sections += ["<h2>Rewrites</h2>", f"<p>{e(report.summary())}</p>", f"<ul>{items}</ul>",
                     f"<ul>{trials}</ul>" if trials else ""]  # fmt: skip
    if result.layout_report is not None:
        sections += ["<h2>Layout</h2>", f"<p>{e(result.layout_report.summary())}</p>"]
    page = ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>kernorch plan: {e(model_name)}</title><style>{_STYLE}</style></head><body>"
            + "\n".join(sections) + "</body></html>")  # fmt: skip
    target = Path(path)
    _write(target, page)
    return target


_STYLE = """
body { font-family: Helvetica, Arial, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 12px; }
td, th { border: 1px solid #ccc; padding: 2px 6px; vertical-align: top; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.library td { background: #cfe2ff; } tr.c td { background: #ffe5b4; }
tr.reference td { background: #e9ecef; } tr.view td { background: #ffffff; } tr.onnxruntime td { background: #f8d7da; }
.picture { overflow: auto; border: 1px solid #ddd; max-height: 80vh; }
"""
