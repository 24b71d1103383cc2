"""C template for `lstm_stack`: stacked forward LSTM layers run as waves (Rammer's LSTM-TC case, issue 13).

The threads of one parallel region are the vEUs; vEU p owns a contiguous range of layers for the whole run
(its layers' weights are the only ones it reads). A layer's steps are cut into chunks of CHUNK_STEPS; the
rTask (layer l, chunk c) computes the chunk's input projection (l > 0: the chunk of h of layer l-1 times Wᵀ,
plus the bias) and then its steps of the scan. rTasks run in the order (chunk, layer), on each vEU and
globally, so while the vEU owning layer l+1 works on chunk c the one owning layer l already works on chunk c+1.

Synchronisation is a barrier rTask before (l, c): wait until layer l-1 has finished chunk c, read from layer
l-1's step counter (Rammer's step array); a finished rTask publishes its chunk with a release store. Deadlock
freedom: every wait is for an rTask earlier in the global (chunk, layer) order, and each vEU runs its rTasks in
that order, so the earliest unfinished rTask can always run. A layer's state (c, and the h rows of its own Y)
is touched only by the vEU owning the layer, so it needs no other barrier; h is read from the previous step's
Y row, so a block's new h never overwrites an h another block of the same step still reads.

Scratch (one buffer, planned once): each layer's Y [S, B, H_l] (the top layer writes the output Y when the plan
keeps it), each layer's c [B, H_l], one chunk of projected gates per vEU, the step counters (one cache line each).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernorch.codegen.backends.templates import CTemplate
from kernorch.codegen.c import CWriter
from kernorch.codegen.native.lstm import float32_alone, write_gate_block
from kernorch.ir import reference_kernels as K
from kernorch.ir.kernel import CandidateKernel

CHUNK_STEPS = 4  # steps per rTask: the pipeline fills in (layers per vEU) rTasks; the projection rereads its
# weights once per chunk (4 steps: a quarter more weight traffic than the scan's own)
ROWS = 4  # rows of the projection's register block (ROWS x PANEL accumulators)
_MAX_VEUS = 64


@dataclass(frozen=True)
class _Layer:
    hidden: int
    unit_block: int
    features: int  # input width: the layer below's hidden size (layer 0: not projected here)
    args: dict[str, int]  # argument slot of each input: gates (layer 0) or panels + bias, then R, h0, c0, P


def lstm_stack_supported(kernel: CandidateKernel) -> bool:
    return float32_alone(kernel, "lstm_stack")


def _layers(kernel: CandidateKernel) -> tuple[int, int, list[_Layer]]:
    (node,) = kernel.primitives
    types = kernel.graph.types
    _, seq, batch, four_h = types[node.inputs[0]].shape
    slot = {value: i for i, value in enumerate(kernel.inputs)}
    blocks = node.attr("unit_blocks")
    first, *above = K.stack_layers(node.inputs)
    layers = [_Layer(four_h // 4, blocks[0], 0, dict(zip(("gates", "R", "h0", "c0", "P"),
                                                         (slot[v] for v in first), strict=True)))]
    for layer, inputs in enumerate(above, start=1):
        panels = types[inputs[0]].shape
        args = dict(zip(("panels", "bias", "R", "h0", "c0", "P"), (slot[v] for v in inputs), strict=True))
        layers.append(_Layer(panels[0] * panels[2] // 4, blocks[layer], panels[1], args))
    return seq, batch, layers


def describe_lstm_stack(kernel: CandidateKernel) -> str:
    """What `kernorch explain` says of the waves: layers, vEUs, rTasks."""
    seq, batch, layers = _layers(kernel)
    hidden = "/".join(dict.fromkeys(str(layer.hidden) for layer in layers))
    chunks = -(-seq // CHUNK_STEPS)
    return (f"{len(layers)} layers (hidden {hidden}) in runs of layers, one run per thread (at most "
            f"{min(len(layers), _MAX_VEUS)}); {len(layers) * chunks} rTasks of {CHUNK_STEPS} steps, layer l+1 one "
            f"chunk behind layer l")


def _scratch_layout(seq: int, batch: int, layers: list[_Layer]) -> tuple[list[int], list[int], int, int, int]:
    """Float offsets of each layer's Y and c, of the vEUs' gate chunks, floats per chunk, and the counters'."""
    at, ys, cs = 0, [], []
    for layer in layers:
        ys.append(at)
        at += seq * batch * layer.hidden
    for layer in layers:
        cs.append(at)
        at += batch * layer.hidden
    gates_at = at
    chunk = -(-CHUNK_STEPS * batch * 4 * max(layer.hidden for layer in layers) // 16) * 16
    at += min(len(layers), _MAX_VEUS) * chunk
    return ys, cs, gates_at, chunk, -(-at // 16) * 16


def lstm_stack_scratch_bytes(kernel: CandidateKernel) -> list[int]:
    seq, batch, layers = _layers(kernel)
    *_, counters_at = _scratch_layout(seq, batch, layers)
    return [counters_at * 4 + len(layers) * 64]


def _projection(w: CWriter, layer: _Layer, batch: int) -> None:
    """gx[r][4H] = bias + Σ_k below[r][k] · Wᵀ[k][:] for the chunk's n·B rows, one panel of PANEL columns at a
    time in ROWS x PANEL register blocks (the panel, I x PANEL floats, stays in L1 across a chunk's row blocks).
    Rows past the chunk read the last row again and are not stored."""
    four_h, features, panel = 4 * layer.hidden, layer.features, K.PANEL
    w.line(f"const float *xin = below + t0 * {batch * features};", f"const int64_t rows = n * {batch};")
    with w.block(f"for (int64_t p = 0; p < {four_h // panel}; p++)"):
        w.line(f"const float *wp = Wp + p * {features * panel}, *bp = bias + p * {panel};")
        with w.block(f"for (int64_t r0 = 0; r0 < rows; r0 += {ROWS})"):
            w.line(f"const float *x[{ROWS}];",
                   f"for (int i = 0; i < {ROWS}; i++) x[i] = xin + (r0 + i < rows ? r0 + i : rows - 1) * {features};",
                   f"float acc[{ROWS}][{panel}];")  # fmt: skip
            w.nest(f"for (int i = 0; i < {ROWS}; i++)", f"for (int j = 0; j < {panel}; j++) acc[i][j] = bp[j];")
            with w.block(f"for (int64_t k = 0; k < {features}; k++)"):
                w.line(f"const float *w = wp + k * {panel};")
                with w.block(f"for (int i = 0; i < {ROWS}; i++)"):
                    w.line("const float xk = x[i][k];", "#pragma omp simd",
                           f"for (int j = 0; j < {panel}; j++) acc[i][j] += xk * w[j];")
            w.nest(f"for (int i = 0; i < {ROWS} && r0 + i < rows; i++)",
                   f"for (int j = 0; j < {panel}; j++) gx[(r0 + i) * {four_h} + p * {panel} + j] = acc[i][j];")


def _layer_function(w: CWriter, name: str, index: int, layer: _Layer, batch: int, ys: list[int], cs: list[int],
                    top_y: int | None) -> None:  # fmt: skip
    """static void {name}_layer{index}(args, scratch, gx, t0, n): rTask (layer, chunk of n steps from t0)."""
    H, U, B = layer.hidden, layer.unit_block, batch  # noqa: N806 - the math's names
    a = layer.args
    own_y = f"(float *)args[{top_y}]" if top_y is not None else f"scratch + {ys[index]}"
    with w.function(f"static void {name}_layer{index}(void **args, float *scratch, float *gx, int64_t t0, int64_t n)",
                    returns=None):  # fmt: skip
        w.line(f"const float *R = (const float *)args[{a['R']}], *h0 = (const float *)args[{a['h0']}];",
               f"const float *P = (const float *)args[{a['P']}];", f"float *ys = {own_y}, *c = scratch + {cs[index]};",
               f"if (t0 == 0) memcpy(c, (const float *)args[{a['c0']}], sizeof(float) * {B * H});")  # fmt: skip
        with w.block(""):  # layers above the first project the chunk of the layer below into gx
            if index:
                w.line(f"const float *Wp = (const float *)args[{a['panels']}], "
                       f"*bias = (const float *)args[{a['bias']}];",
                       f"const float *below = scratch + {ys[index - 1]};")  # fmt: skip
                _projection(w, layer, B)
            else:
                w.line("")
        w.line(f"const float *gates = (const float *)args[{a['gates']}] + t0 * {B * 4 * H};" if index == 0 else
               "const float *gates = gx;")  # fmt: skip
        with w.block("for (int64_t s = 0; s < n; s++)"):
            w.line("const int64_t t = t0 + s;", f"const float *hin = t == 0 ? h0 : ys + (t - 1) * {B * H};",
                   f"float *hout = ys + t * {B * H};")  # fmt: skip
            with w.block(f"for (int64_t b = 0; b < {B}; b++)"):
                w.line(f"const float *gxt_row = gates + (s * {B} + b) * {4 * H}, *hb = hin + b * {H};")
                with w.block(f"for (int64_t blk = 0; blk < {H // U}; blk++)"):
                    w.line(f"const int64_t u = blk * {U};", f"const float *panel = R + blk * {H * 4 * U};")
                    with w.indented(2):  # the gate block's depth in the one-layer kernel
                        write_gate_block(w, "gxt_row + u", "hb", "panel", f"c + b * {H} + u", f"hout + b * {H} + u",
                                         "P + u", H, U)  # fmt: skip


def render_lstm_stack(name: str, kernel: CandidateKernel) -> str:
    (node,) = kernel.primitives
    seq, batch, layers = _layers(kernel)
    ys, cs, gates_at, chunk_floats, counters_at = _scratch_layout(seq, batch, layers)
    out = {value: len(kernel.inputs) + i for i, value in enumerate(kernel.outputs)}
    y_arg, yh_arg, yc_arg = (out.get(v) for v in node.outputs)
    scratch = len(kernel.inputs) + len(kernel.outputs)
    top, top_h = len(layers) - 1, layers[-1].hidden
    w = CWriter()
    for i, layer in enumerate(layers):
        w.line("")
        _layer_function(w, name, i, layer, batch, ys, cs, y_arg if i == top else None)
    table = ", ".join(f"{name}_layer{i}" for i in range(len(layers)))
    w.line("", f"static void (*const {name}_layers[{len(layers)}])(void **, float *, float *, int64_t, int64_t) = "
           f"{{{table}}};", "")  # fmt: skip
    veus = min(len(layers), _MAX_VEUS)
    with w.function(f"int {name}(void **args)"):
        w.line(f"float *scratch = (float *)args[{scratch}];",
               f"int64_t *done = (int64_t *)(scratch + {counters_at});  /* layer l's finished chunks at done[8 * l] */",
               f"for (int l = 0; l < {len(layers)}; l++) done[8 * l] = 0;", "int threads = omp_get_max_threads();",
               f"threads = threads < {veus} ? threads : {veus};",
               "#pragma omp parallel num_threads(threads)")  # fmt: skip
        with w.block(""):
            _waves(w, name, len(layers), seq, gates_at, chunk_floats)
        top_y = f"(const float *)args[{y_arg}]" if y_arg is not None else f"scratch + {ys[top]}"
        if yh_arg is not None:
            w.line(f"memcpy(args[{yh_arg}], {top_y} + {(seq - 1) * batch * top_h}, sizeof(float) * {batch * top_h});")
        if yc_arg is not None:
            w.line(f"memcpy(args[{yc_arg}], scratch + {cs[top]}, sizeof(float) * {batch * top_h});")
    return w.text("\n")


def _waves(w: CWriter, name: str, layers: int, seq: int, gates_at: int, chunk_floats: int) -> None:
    """Thread p's rTasks: its run of layers, chunk by chunk, each after its barrier rTask."""
    w.line("const int64_t p = omp_get_thread_num(), np = omp_get_num_threads();",
           f"const int64_t first = {layers} * p / np, last = {layers} * (p + 1) / np;",
           f"float *gx = scratch + {gates_at} + p * {chunk_floats};")  # fmt: skip
    with w.block(f"for (int64_t chunk = 0; chunk < {-(-seq // CHUNK_STEPS)}; chunk++)"):
        steps = f"{seq} - t0 < {CHUNK_STEPS} ? {seq} - t0 : {CHUNK_STEPS}"
        w.line(f"const int64_t t0 = chunk * {CHUNK_STEPS}, n = {steps};")
        with w.block("for (int64_t l = first; l < last; l++)"):
            w.line("/* barrier rTask: layer l-1 has finished this chunk (its h rows are this rTask's input) */",
                   "if (l > 0)")  # fmt: skip
            with w.indented(), w.block("while (__atomic_load_n(&done[8 * (l - 1)], __ATOMIC_ACQUIRE) < chunk + 1)"):
                w.verbatim("#if defined(__x86_64__) || defined(__i386__)")
                w.line("__builtin_ia32_pause();")
                w.verbatim("#endif")
            w.line(f"{name}_layers[l](args, scratch, gx, t0, n);",
                   "__atomic_store_n(&done[8 * l], chunk + 1, __ATOMIC_RELEASE);")


# stacked layers as waves: a step counter per layer, no rTask variants
BACKEND = CTemplate("lstm_stack", "stacked LSTM layers as waves, C template", lstm_stack_supported,
                    lstm_stack_scratch_bytes, render_lstm_stack, describe_lstm_stack)  # fmt: skip
