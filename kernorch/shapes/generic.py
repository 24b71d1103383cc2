"""One plan for a range of sizes: planned once, compiled once, run at any size of the range at once.

A `SizeRange` gives every symbolic dim of a model a size or a range (`sequence=1,past=1..256`: a decoder's
steps). The plan is built at a few probe sizes of the range (`probe_sizes`) and is accepted only where what
the pipeline makes of the model is the same program at all of them:

1. **The graph.** The model is imported and fissioned at each probe and put through the stages that decide
   from structure alone (pipeline.generic_stages: safe rewrites, analytic layouts under one policy decided at the
   largest sizes by pipeline.generic_layout, float32); the graphs must
   match primitive by primitive. Each value's dims, each view's offset are then integer polynomials of the sizes
   (codegen/generic/polynomial.py), and each value's size at any size of the range is at most its size at the
   largest (the plan is laid out for those: runtime/generic.py).
2. **The constants.** A constant that differs between probes is a size folded into a value; it is made per
   call where its maker is found (shapes/generic_constants.py): filled with one value (a mask as long as the
   cache), the leading corner of its value at the largest sizes (positions from 0, a causal mask), or rows of a
   table of the model at an offset and count that are polynomials of the sizes (a position's embedding, a rotary
   table's row). Any other is refused, naming it.
3. **The kernels.** The orchestration runs once, at the largest sizes, with the measured or analytic costs the
   options ask for. Each kernel whose shapes do not change is used as planned; every other kernel is rendered
   at each probe and unified into one source taking the sizes (codegen/generic/unify.py). A kernel that does
   not unify (a library call created for one shape, a loop split by size) is excluded and the graph
   orchestrated again without it, up to MAX_ROUNDS times; a primitive no kernel left can cover ends it.
4. **The numbers.** The compiled plan runs at the range's edges, the smallest sizes one by one, and a prime
   between, against onnxruntime on the same inputs; any difference beyond DEFAULT_RTOL refuses the plan.

Refusals raise `NotGeneric` with the reason; the caller (shapes/dynamic.py) then serves the range as before
and logs why.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kernorch.codegen.backends import Backend, choose_backend, plan_views, registered
from kernorch.codegen.generic import (
    PLACEHOLDER,
    GenericCode,
    GenericKernelBackend,
    NotGeneric,
    Polynomial,
    cross_monomials,
    generic_backend,
    polynomial_of,
    unify,
)
from kernorch.codegen.loops import NotGeneratable
from kernorch.errors import InputMismatch, KernorchError
from kernorch.frontend import InputSignature, shapes_for, symbols_of
from kernorch.ir.graph import Graph
from kernorch.ir.kernel import CandidateKernel, kernel_inputs
from kernorch.ir.types import TensorType
from kernorch.options import Options, parse_size_range
from kernorch.pipeline import generic_layout, generic_stages, import_graph, make_cost_model, orchestrate_generic
from kernorch.runtime.feeds import graph_feeds
from kernorch.runtime.generic import SIZES_INPUT, Generator, GenericExecutor, GenericLayout
from kernorch.shapes.generic_constants import generators as constant_generators

LOGGER = logging.getLogger("kernorch.shapes")
# probes are at least this large and in the upper half of a range: smaller sizes fold axes of one, and a kernel
# opens its parallel loops only above some work; the code of the larger sizes runs the smaller ones (checked)
MIN_PROBE = 8
PROBES = 6  # per size that varies: a quadratic's 3 coefficients and 3 sizes that check them
OFF_LINE_MARGIN = 3  # probes off the lines beyond the coefficients they determine: what checks those
MAX_ROUNDS = 4  # orchestrations without the kernels that did not unify
DEFAULT_RTOL = 1e-4  # the generic plan against onnxruntime, relative to the output's largest magnitude
MAX_SIZES_CHECKED = 400_000  # size combinations enumerated to check that every value fits its largest buffer
SavedKernels = tuple[tuple[tuple[int, ...], tuple[str, ...]], ...]  # a plan's kernels: (primitives, outputs)


@dataclass(frozen=True)
class SizeRange:
    """Each symbolic dim's sizes: (name, smallest, largest, step), a fixed size where the two are equal.

    The plan's polynomials are of each size's **unit**, the size divided by its step (1 unless given): a network
    that halves an image five times takes multiples of 32, and at height 32·u its feature maps are 16·u, 8·u, ...
    high — integer polynomials of u, where of the height they are not (a stride-2 convolution at an odd height
    rounds). The plan's size array holds the units."""

    bounds: tuple[tuple[str, int, int, int], ...]

    @staticmethod
    def parse(spec: object) -> SizeRange:
        """`sequence=1,past=1..256`, `height=224..640:32`: every symbolic dim, a size or an inclusive range, with
        a step or not (options.parse_size_range)."""
        return SizeRange(parse_size_range(spec))

    @property
    def varying(self) -> tuple[str, ...]:
        return tuple(name for name, lo, hi, _ in self.bounds if lo < hi)

    @property
    def largest(self) -> dict[str, int]:
        return {name: hi for name, _, hi, _ in self.bounds}

    def contains(self, sizes: Mapping[str, int]) -> bool:
        return all(lo <= sizes.get(name, -1) <= hi and sizes[name] % step == 0 for name, lo, hi, step in self.bounds)

    def units(self, sizes: Mapping[str, int]) -> dict[str, int]:
        """The varying sizes' units (class doc): what the plan's polynomials and its size array take."""
        steps = {name: step for name, _, _, step in self.bounds}
        return {name: sizes[name] // steps[name] for name in self.varying}

    def describe(self) -> str:
        return ",".join(f"{name}={lo}" if lo == hi else f"{name}={lo}..{hi}" + (f":{step}" if step > 1 else "")
                        for name, lo, hi, step in self.bounds)  # fmt: skip

    def checked(self, signature: Sequence[InputSignature]) -> SizeRange:
        symbols = symbols_of(signature)
        named = [name for name, _, _, _ in self.bounds]
        unknown = [name for name in named if name not in symbols]
        missing = [name for name in symbols if name not in named]
        if unknown or missing:
            what = f"names '{unknown[0]}', not a symbolic dim" if unknown else f"gives no size to '{missing[0]}'"
            raise KernorchError(f"--range {self.describe()} {what} (the model's symbolic dims: "
                                f"{', '.join(symbols) or 'none'})")  # fmt: skip
        if not self.varying:
            raise KernorchError(f"--range {self.describe()} fixes every dim: give that shape with --input-shape")
        return self


def probe_sizes(size_range: SizeRange) -> list[dict[str, int]]:
    """The largest sizes first, then for each size that varies PROBES - 1 more (the others at their largest),
    and, with two or more, points off those lines: OFF_LINE_MARGIN more than the monomials of two or more sizes
    (codegen/generic/polynomial.py), which only they determine. Each varying size's probes include two
    consecutive units, so no remainder modulo any number is the same at all of them; the points off the lines
    are drawn from a generator of a fixed seed (the same probes, the same code, every time)."""
    largest = size_range.largest
    probes = [dict(largest)]
    spans: dict[str, tuple[int, int, int]] = {}  # each varying size's probed units (lowest, highest) and step
    for name, lo, hi, step in size_range.bounds:
        if lo == hi:
            continue
        # the code of the larger sizes: where the plan's time goes
        low = max(lo // step, -(-MIN_PROBE // step), hi // step // 2)
        spans[name] = (low, hi // step, step)
        if hi // step - low + 1 < PROBES:
            raise NotGeneric(f"{name}={lo}..{hi} has fewer than {PROBES} sizes of at least {MIN_PROBE} to probe"
                             + (f" in steps of {step}" if step > 1 else "") + ": plan its sizes as buckets instead")
        for unit in _spread(low, hi // step):
            if unit * step != hi:
                probes.append({**largest, name: unit * step})
    if len(spans) < 2:
        return probes
    wanted = len(probes) + cross_monomials(len(spans)) + OFF_LINE_MARGIN
    off_line = int(np.prod([high - low for low, high, _ in spans.values()]))  # points off every line
    if off_line < wanted - len(probes):
        raise NotGeneric(f"the range's upper half has {off_line} combinations of sizes off the lines through its "
                         f"largest, fewer than the {wanted - len(probes)} a fit of {len(spans)} sizes needs")
    draw = np.random.default_rng(0)
    while len(probes) < wanted:
        point = {**largest, **{name: step * int(draw.integers(low, high)) for name, (low, high, step) in spans.items()}}
        if point not in probes:
            probes.append(point)
    return probes


def _spread(low: int, high: int) -> list[int]:
    sizes = [high, high - 1, low, low + (high - low) // 4, low + (high - low) // 2, low + 3 * (high - low) // 4]
    chosen: list[int] = []
    for size in sizes:
        while size in chosen:
            size += 1 if size + 1 <= high else -1
        chosen.append(size)
    return chosen[:PROBES]


def check_sizes(size_range: SizeRange) -> list[dict[str, int]]:
    """The sizes a generic plan is run at before it is accepted: per varying size (the others at their
    largest) its four smallest, its two largest and a prime unit between (sizes of the range: multiples of its
    step)."""
    largest = size_range.largest
    checked = [dict(largest)]
    for name, lo, hi, step in size_range.bounds:
        if lo == hi:
            continue
        first, last = lo // step, hi // step
        middle = next((n for n in range((first + last) // 2, last)
                       if n > 2 and all(n % d for d in range(2, int(n**0.5) + 1))), (first + last) // 2)  # fmt: skip
        for unit in sorted({*range(first, min(first + 4, last + 1)), last - 1, middle}):
            point = {**largest, name: unit * step}
            if point not in checked:
                checked.append(point)
    varying = [(name, lo, hi) for name, lo, hi, _ in size_range.bounds if lo < hi]
    if len(varying) > 1:  # off the lines: every size at its smallest, and the smallest and largest alternating
        for point in ({name: lo for name, lo, _ in varying},
                      {name: (lo, hi)[i % 2] for i, (name, lo, hi) in enumerate(varying)}):
            checked.append({**largest, **point})
    return checked


class GenericPlan:
    """A range's compiled plan (module doc); `run` calls it at any size of the range."""

    def __init__(self, size_range: SizeRange, executor: GenericExecutor, seconds: float, generic_kernels: int,
                 fixed_kernels: int, rounds: int, generated: Sequence[str],
                 saved: SavedKernels = ()) -> None:  # fmt: skip
        self.size_range = size_range
        self.executor = executor
        self.seconds = seconds
        self.generic_kernels = generic_kernels  # kernels taking the sizes
        self.fixed_kernels = fixed_kernels  # kernels whose shapes do not change over the range
        self.rounds = rounds
        self.generated = tuple(generated)
        self.saved = saved  # its kernels as (primitives, outputs): what `DynamicModel.save` keeps of it
        self.calls = 0

    def run(self, sizes: Mapping[str, int], feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One call at `sizes` (inside the range; the feeds' shapes those the model has at them: the caller binds
        them to the signature). A feed of another dtype than the model's input is refused, never read as it."""
        graph = self.executor.graph
        for name, array in feeds.items():
            if name not in graph.types or name in self.generated or graph.types[name].dtype != array.dtype:
                raise InputMismatch(f"input '{name}' is {array.dtype}, the model takes "
                                    f"{graph.types[name].dtype if name in graph.types else 'no such input'}")
        self.calls += 1
        return self.executor.run_at(self.size_range.units(sizes), feeds)

    def describe(self) -> str:
        return (f"[{self.size_range.describe()}]: {len(self.executor.kernels)} kernels ({self.generic_kernels} take "
                f"the sizes), {self.calls} call(s)")  # fmt: skip


def build_generic_plan(model: bytes, signature: Sequence[InputSignature], size_range: SizeRange, options: Options,
                       reference: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]],
                       saved: SavedKernels | None = None) -> GenericPlan:  # fmt: skip
    """The range's plan (module doc), checked against `reference` (onnxruntime's session over the model);
    NotGeneric says why there is none. `saved`: the kernels of a plan saved for this range (`GenericPlan.saved`),
    used instead of orchestrating — untrusted: they must partition the graph's primitives and write what the
    graph reads, and the code is rendered, unified and checked as for a new plan."""
    started = time.perf_counter()
    if options.precision != "fp32" or options.gpu:
        raise NotGeneric("shape-generic plans are float32 CPU plans")
    size_range.checked(signature)
    probes = probe_sizes(size_range)
    varying = size_range.varying
    at = [size_range.units(probe) for probe in probes]  # what the polynomials are fitted to
    graphs: list[Graph] = []
    layout = options.layout
    for index, probe in enumerate(probes):
        with warnings.catch_warnings():
            if index:  # a fallback is reported once, for the largest sizes
                warnings.simplefilter("ignore")
            imported = import_graph(model, dict(shapes_for(signature, probe)), options.strict)
        if not index:
            layout = generic_layout(imported, options)
        graphs.append(generic_stages(imported, options, layout))
    largest = graphs[0]
    _same_structure(graphs, probes)
    dims = _dims(graphs, at)
    _fits_largest(dims, size_range)
    generators = constant_generators(model, graphs, at, dims)
    coded = [_made_per_call(g, generators) for g in graphs]  # those constants not folded into code as literals
    cost_model = make_cost_model(options) if saved is None else None
    excluded: frozenset[tuple[int, ...]] = frozenset()
    refused: dict[tuple[int, ...], str] = {}
    for rounds in range(1, MAX_ROUNDS + 1):  # noqa: B007 - the count is reported
        if saved is not None:
            kernels = _saved_kernels(largest, saved)
            unified = _KernelCodes(kernels, coded, at, generators, dims)
            if unified.refused:
                raise NotGeneric(f"a saved kernel is not the same program at every size: "
                                 f"{next(iter(unified.refused.values()))}")  # fmt: skip
            break
        try:
            result = orchestrate_generic(largest, options, excluded, cost_model)
        except (KernorchError, RuntimeError) as error:  # the BLP found no plan: a primitive no kernel left covers
            kernel, why = next(iter(refused.items()), ((), ""))
            node = largest.nodes[kernel[0]] if kernel else None
            raise NotGeneric("no plan without the kernels that are not the same program at every size"
                             + (f" ({node.prim} from {node.origin}: {why})" if node is not None else "")
                             + f": {error}") from None  # fmt: skip
        if result.plan.graph.nodes != largest.nodes:
            raise NotGeneric("the orchestration changed the graph it was given")
        kernels = list(result.plan.kernels)
        unified = _KernelCodes(kernels, coded, at, generators, dims)
        if not unified.refused:
            break
        refused = unified.refused
        LOGGER.info("kernorch: [%s] %d kernel(s) are not the same program at every size, orchestrating without "
                    "them (%s)", size_range.describe(), len(refused), next(iter(refused.values())))  # fmt: skip
        excluded |= frozenset(refused)
    else:
        raise NotGeneric(f"kernels still not the same program at every size after {MAX_ROUNDS} orchestrations "
                         f"({next(iter(refused.values()))})")  # fmt: skip
    executor = _executor(largest, kernels, unified, dims, generators, varying, size_range, options)
    plan = GenericPlan(size_range, executor, 0.0, unified.generic, unified.fixed, rounds, sorted(generators),
                       tuple((k.nodes, k.outputs) for k in kernels))  # fmt: skip
    _check_against(plan, largest, signature, size_range, reference)
    plan.seconds = time.perf_counter() - started
    LOGGER.info("kernorch: [%s] planned once for the range in %.1f s: %d kernels, %d taking the sizes",
                size_range.describe(), plan.seconds, len(kernels), unified.generic)  # fmt: skip
    return plan


def saved_kernels_from_json(value: object) -> SavedKernels:
    """A saved plan's kernels read back from JSON ([[node, ...], [output, ...]] each); malformed data raises."""
    if not isinstance(value, list):
        raise ValueError("a range's kernels must be a list")
    kernels = []
    for entry in value:
        nodes, outputs = entry
        kernels.append((tuple(int(n) for n in nodes), tuple(str(o) for o in outputs)))
    return tuple(kernels)


def _saved_kernels(graph: Graph, saved: SavedKernels) -> list[CandidateKernel]:
    """The saved kernels on this graph, if they are a plan of it: every primitive in exactly one kernel, each
    kernel writing only values its primitives produce and every value read outside it or by the caller."""
    covered = sorted(n for nodes, _ in saved for n in nodes)
    if covered != list(range(len(graph.nodes))):
        raise NotGeneric("the saved kernels do not cover the graph's primitives once each")
    kernels = []
    needed = set(graph.outputs)
    for nodes, _ in saved:
        needed |= set(kernel_inputs(graph, nodes))
    for nodes, outputs in saved:
        produced = {v for n in nodes for v in graph.nodes[n].outputs}
        if not set(outputs) <= produced or not (produced & needed) <= set(outputs):
            raise NotGeneric("a saved kernel's outputs are not what its primitives write for the rest of the graph")
        kernels.append(CandidateKernel(tuple(sorted(nodes)), kernel_inputs(graph, tuple(sorted(nodes))),
                                       tuple(outputs), graph))  # fmt: skip
    return kernels


def _same_structure(graphs: Sequence[Graph], probes: Sequence[Mapping[str, int]]) -> None:
    first = graphs[0]
    for probe, graph in zip(probes[1:], graphs[1:], strict=True):
        where = f"between {_sizes(probes[0])} and {_sizes(probe)}"
        if (graph.inputs, graph.outputs, sorted(graph.constants)) != (first.inputs, first.outputs,
                                                                        sorted(first.constants)):  # fmt: skip
            raise NotGeneric(f"the graph's inputs, outputs or constants differ {where}")
        if len(graph.nodes) != len(first.nodes):
            raise NotGeneric(f"the graph has {len(first.nodes)} primitives and {len(graph.nodes)} {where}")
        for a, b in zip(first.nodes, graph.nodes, strict=True):
            if (a.prim, a.inputs, a.outputs) != (b.prim, b.inputs, b.outputs):
                raise NotGeneric(f"{a.prim} from {a.origin} differs {where}")


def _dims(graphs: Sequence[Graph], at: Sequence[Mapping[str, int]]) -> dict[str, tuple[Polynomial, ...]]:
    dims: dict[str, tuple[Polynomial, ...]] = {}
    for value, kind in graphs[0].types.items():
        types = [g.types[value] for g in graphs]
        if any(t.dtype != kind.dtype or len(t.shape) != len(kind.shape) for t in types):
            raise NotGeneric(f"value {value} changes its dtype or rank with the size")
        dims[value] = tuple(polynomial_of(at, [t.shape[axis] for t in types], f"axis {axis} of {value}")
                            for axis in range(len(kind.shape)))  # fmt: skip
    return dims


def _grid(size_range: SizeRange) -> dict[str, np.ndarray]:
    """Every combination of the varying sizes' units, as arrays (the fixed sizes drop out of the polynomials)."""
    spans = [(name, lo // step, hi // step) for name, lo, hi, step in size_range.bounds if lo < hi]
    count = int(np.prod([hi - lo + 1 for _, lo, hi in spans], dtype=np.int64))
    if count > MAX_SIZES_CHECKED:
        raise NotGeneric(f"the range has {count} size combinations, more than {MAX_SIZES_CHECKED} to check")
    axes = np.meshgrid(*[np.arange(lo, hi + 1, dtype=np.int64) for _, lo, hi in spans], indexing="ij")
    return {name: axis.reshape(-1) for (name, _, _), axis in zip(spans, axes, strict=True)}


def _fits_largest(dims: Mapping[str, tuple[Polynomial, ...]], size_range: SizeRange) -> None:
    grid, largest = _grid(size_range), size_range.units(size_range.largest)
    points = len(next(iter(grid.values())))
    for value, shape in dims.items():
        if all(d.is_constant for d in shape):
            continue
        extents = np.stack([np.broadcast_to(d(grid), (points,)) for d in shape])  # type: ignore[arg-type]
        if np.any(extents < 1):
            raise NotGeneric(f"value {value} is empty at some size of the range")
        if np.any(np.prod(extents, axis=0) > np.prod([d(largest) for d in shape])):
            raise NotGeneric(f"value {value} is larger at some size of the range than at its largest sizes")


class _KernelCodes:
    """Each planned kernel's backend at the largest sizes, or its unified code, or why it has none."""

    def __init__(self, kernels: Sequence[CandidateKernel], graphs: Sequence[Graph], at: Sequence[Mapping[str, int]],
                 generators: Mapping[str, Generator], dims: Mapping[str, tuple[Polynomial, ...]]) -> None:  # fmt: skip
        self.refused: dict[tuple[int, ...], str] = {}
        self.backends: list[Backend] = []
        self.view_offsets: dict[str, Polynomial] = {}
        self.generic = self.fixed = 0
        sizes = tuple(at[0])
        at_probe = [[CandidateKernel(k.nodes, k.inputs, k.outputs, g) for k in kernels] for g in graphs]
        chosen = [plan_views(ks, [_backend(k) for k in ks]) for ks in at_probe]
        if any(set(views) != set(chosen[0][1]) for _, views in chosen):
            raise NotGeneric("the plan's views (values placed in another's bytes) differ between sizes")
        for index, kernel in enumerate(kernels):
            backend = chosen[0][0][index]  # at the largest sizes; at others another may be the first that runs it
            # (a native convolution for some map sizes only): _unified takes one that runs it at every probe
            values = (*kernel.inputs, *kernel.outputs)
            fixed = all(d.is_constant for v in values for d in dims[v]) and not any(v in generators for v in values)
            try:
                if not backend.runs_code:  # its outputs alias its input, or a concat's inputs alias its output
                    for value, (source, _) in chosen[0][1].items():
                        if value in kernel.outputs or source in kernel.outputs:
                            self.view_offsets[value] = polynomial_of(at, [c[1][value][1] for c in chosen],
                                                                     f"the offset of view {value}")  # fmt: skip
                    self.backends.append(backend)
                elif fixed:
                    self.fixed += 1
                    self.backends.append(backend)
                elif not backend.native:
                    raise NotGeneric(f"{backend.name} runs it at one size (run by Python for its shapes)")
                elif backend.stateful and any(v in generators for v in kernel.inputs):
                    raise NotGeneric(f"{backend.name} packs a constant that follows the size once")
                else:
                    code = _unified(kernel, [ks[index] for ks in at_probe], at, sizes, backend)
                    self.generic += not code.source.is_fixed
                    self.fixed += code.source.is_fixed
                    self.backends.append(generic_backend(code))
            except NotGeneric as reason:
                self.refused[kernel.nodes] = str(reason)
                self.backends.append(backend)


def _unified(kernel: CandidateKernel, at_probe: Sequence[CandidateKernel], at: Sequence[Mapping[str, int]],
             sizes: tuple[str, ...], chosen: Backend) -> GenericCode:  # fmt: skip
    """The kernel's code unified across the probes: by the backend the plan chose, else by the first backend
    after it, in the registry's order, that runs the kernel at every probe and whose code unifies (a native
    product over few rows keeps per-row tables: oneDNN's matmul takes its rows at run time)."""
    order = [b for b in registered() if b.native and b.runs_code]
    candidates = [chosen, *order[order.index(chosen) + 1:]] if chosen in order else [chosen]
    first: NotGeneric | None = None
    for backend in candidates:
        if not all(backend.applies(k).runs for k in at_probe):
            first = first or NotGeneric(f"{backend.name} does not run it at every size")
            continue
        try:
            texts = [backend.generic_source(PLACEHOLDER, k) for k in at_probe]
            scratch = [backend.scratch_bytes(k) for k in at_probe]
            if any(len(s) != len(scratch[0]) or any(x > y for x, y in zip(s, scratch[0], strict=True))
                   for s in scratch):  # fmt: skip
                raise NotGeneric("its scratch is not largest at the largest sizes")
            return GenericCode(backend, unify(texts, at, sizes), len(kernel.inputs), len(kernel.outputs),
                               tuple(scratch[0]))  # fmt: skip
        except NotGeneratable as reason:  # a backend that cannot render it at some probe
            first = first or NotGeneric(f"{backend.name} does not render it at every size: {reason}")
        except NotGeneric as reason:
            first = first or reason
    assert first is not None
    raise first


def _backend(kernel: CandidateKernel) -> Backend:
    backend, reason = choose_backend(kernel)
    if backend is None:
        raise NotGeneric(f"no backend runs {kernel.describe()} at every size: {reason}")
    return backend


def _made_per_call(graph: Graph, generators: Mapping[str, Generator]) -> Graph:
    """The graph with the constants made per call as its inputs (the plan's), in a copy."""
    graph = graph.copy()
    for name in generators:
        del graph.constants[name]
        graph.inputs.append(name)
    return graph


def _executor(largest: Graph, kernels: Sequence[CandidateKernel], unified: _KernelCodes,
              dims: dict[str, tuple[Polynomial, ...]], generators: Mapping[str, Generator], varying: tuple[str, ...],
              size_range: SizeRange, options: Options) -> GenericExecutor:  # fmt: skip
    graph = _made_per_call(largest, generators)
    graph.inputs.append(SIZES_INPUT)
    graph.types[SIZES_INPUT] = TensorType((len(varying),), "int64")
    placed = []
    for kernel, backend in zip(kernels, unified.backends, strict=True):
        takes = isinstance(backend, GenericKernelBackend) and backend.takes_sizes
        inputs = (*kernel.inputs, SIZES_INPUT) if takes else kernel.inputs
        placed.append(CandidateKernel(kernel.nodes, inputs, kernel.outputs, graph))
    layout = GenericLayout(varying, size_range.units(size_range.largest),
                           {**dims, SIZES_INPUT: (Polynomial.constant(len(varying)),)}, dict(unified.view_offsets),
                           dict(generators))  # fmt: skip
    executor = GenericExecutor(graph, placed, unified.backends, layout, options.threads, options.cache,
                               options.max_workspaces)  # fmt: skip
    if set(executor.views) != set(unified.view_offsets):
        raise NotGeneric("the plan's views at the largest sizes are not those of the probes")
    return executor


def _check_against(plan: GenericPlan, largest: Graph, signature: Sequence[InputSignature], size_range: SizeRange,
                   reference: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]) -> None:  # fmt: skip
    feeds_at_largest = graph_feeds(largest, seed=1)
    for sizes in check_sizes(size_range):
        shapes = dict(shapes_for(signature, sizes))
        feeds = {name: np.ascontiguousarray(array[tuple(slice(0, n) for n in shapes[name])])
                 for name, array in feeds_at_largest.items()}  # fmt: skip
        want = reference(feeds)
        got = plan.run(sizes, feeds)
        for name, expected in want.items():
            error = _relative_error(got[name], np.asarray(expected))
            if not error <= DEFAULT_RTOL:
                raise NotGeneric(f"at {_sizes(sizes)} output {name} differs from onnxruntime's (relative error "
                                 f"{error:.2e}): the plan is not used")  # fmt: skip
    plan.calls = 0


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    if got.shape != want.shape:
        return float("inf")
    if want.dtype.kind in "biu":
        return 0.0 if np.array_equal(got, want) else float("inf")
    with np.errstate(invalid="ignore"):
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    finite = np.abs(want[np.isfinite(want)])
    scale = max(1.0, float(finite.max()) if finite.size else 1.0)
    return float(np.max(np.where(same, 0.0, diff), initial=0.0)) / scale


def _sizes(sizes: Mapping[str, int]) -> str:
    return ",".join(f"{name}={value}" for name, value in sizes.items())

