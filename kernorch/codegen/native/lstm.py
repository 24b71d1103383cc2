"""Hand-written C templates for opaque primitives (today: the LSTM scan), sized at compile time."""

from __future__ import annotations

from kernorch.codegen.backends.templates import CTemplate
from kernorch.codegen.c import CWriter
from kernorch.ir.kernel import CandidateKernel


def float32_alone(kernel: CandidateKernel, prim: str) -> bool:
    """The kernel is one `prim` on float32 values: what a hand-written template here takes."""
    nodes = kernel.primitives
    return len(nodes) == 1 and nodes[0].prim == prim and kernel.graph.types[nodes[0].inputs[0]].dtype == "float32"


def lstm_supported(kernel: CandidateKernel) -> bool:
    return float32_alone(kernel, "lstm_recurrence")


_MAX_THREADS = 64  # step counters the scan keeps (one cache line each); more threads than this are not used


def _state_floats(batch: int, hidden: int) -> int:
    """Floats of the scan's state in its scratch (h twice, c), rounded up so the counters after it start on
    a cache line."""
    return -(-3 * batch * hidden // 16) * 16


def lstm_scratch_bytes(kernel: CandidateKernel) -> list[int]:
    """One scratch buffer: h twice (read one step, written the next), c, then the threads' step counters."""
    (node,) = kernel.primitives
    dirs, seq, batch, four_h = kernel.graph.types[node.inputs[0]].shape
    return [_state_floats(batch, four_h // 4) * 4 + _MAX_THREADS * 64]


def describe_lstm(kernel: CandidateKernel) -> str:
    """What `kernorch explain` says of the scan."""
    (node,) = kernel.primitives
    dirs, seq, batch, four_h = kernel.graph.types[node.inputs[0]].shape
    blocks = four_h // 4 // node.attr("unit_block")
    return (f"{seq} steps, hidden {four_h // 4}: its {blocks} blocks of {node.attr('unit_block')} units split over the "
            f"threads, a barrier per step")


def write_gate_block(w: CWriter, gates_x: str, h: str, panel: str, c: str, h_out: str, peephole: str, hidden: int,
                     unit: int) -> None:  # fmt: skip
    """One block of `unit` hidden units at one step, as a C block: their four gates (the row `gates_x` + h·Rᵀ, from
    the block's weight panel [H, 4, unit]) and the cell update, which writes c and h_out. Every name is a pointer
    already at the block's first unit (h: the whole previous h)."""
    H, U = hidden, unit  # noqa: N806 - the math's names
    with w.flat_block(""):  # a scope of its own at its caller's depth
        w.line(f"float acc[4][{U}];")
        w.nest("for (int q = 0; q < 4; q++)", f"for (int j = 0; j < {U}; j++) acc[q][j] = ({gates_x})[q * {H} + j];")
        with w.block(f"for (int64_t k = 0; k < {H}; k++)"):
            w.line(f"const float hk = ({h})[k];", f"const float *row = ({panel}) + k * {4 * U};")
            with w.block("for (int q = 0; q < 4; q++)"):
                w.line("#pragma omp simd", f"for (int j = 0; j < {U}; j++) acc[q][j] += hk * row[q * {U} + j];")
        w.line(f"const float *pi = {peephole}, *po = pi + {H}, *pf = pi + {2 * H};",
               f"float *cb_ = {c}, *ho_ = {h_out};", "#pragma omp simd")
        with w.block(f"for (int j = 0; j < {U}; j++)"):
            w.line("const float i = ko_sigmoidf(acc[0][j] + pi[j] * cb_[j]);",
                   "const float f = ko_sigmoidf(acc[2][j] + pf[j] * cb_[j]);",
                   "const float cell = f * cb_[j] + i * ko_tanhf(acc[3][j]);",
                   "const float o = ko_sigmoidf(acc[1][j] + po[j] * cell);",
                   "cb_[j] = cell;", "ho_[j] = o * ko_tanhf(cell);")  # fmt: skip


def render_lstm(name: str, kernel: CandidateKernel) -> str:
    """gates_x [D,S,B,4H] (= X·Wᵀ + biases), R packed [D,H/U,H,4,U] (U = unit_block), h0/c0 [D,B,H], P [D,3H]
    → Y [S,D,B,H], Y_h, Y_c. Gate order i, o, f, c (ONNX); peepholes i, o, f.

    One parallel region per direction; each thread owns a range of U-unit blocks for the whole scan. Per step
    it computes its blocks' four gates (gates_x[t] + h·Rᵀ, reading its blocks' weight panels, which stay in
    its core's L2 from step to step) and their cell update, so no gate leaves the thread. The only
    synchronisation is one barrier per step, before anyone reads the new h: each thread publishes how many
    steps it has finished and waits until every thread has finished as many (Rammer's step array; with the
    gate products removed, barrier and cell update take 0.4 µs per step here, H=256). h is double-buffered,
    so a thread already in step t+1 never overwrites the h another thread is still reading in step t."""
    (node,) = kernel.primitives
    graph = kernel.graph
    dirs, seq, batch, four_h = graph.types[node.inputs[0]].shape
    hidden = four_h // 4
    block = node.attr("unit_block")
    reverse = {"forward": "0", "reverse": "1", "bidirectional": "d"}[node.attr("direction")]
    # kernel.inputs follows first use; map the node's operands to argument slots explicitly
    slot = {value: i for i, value in enumerate(kernel.inputs)}
    out = {value: len(kernel.inputs) + i for i, value in enumerate(kernel.outputs)}
    gx, rec, h0, c0, peep = (slot[v] for v in node.inputs)
    y_arg = out.get(node.outputs[0], -1)
    yh_arg = out.get(node.outputs[1], -1)
    yc_arg = out.get(node.outputs[2], -1)
    scratch = len(kernel.inputs) + len(kernel.outputs)
    D, S, B, H, U = dirs, seq, batch, hidden, block  # noqa: N806 - the math's names
    blocks = H // U
    state_floats = _state_floats(B, H)
    w = CWriter()
    w.line("")  # the source begins with an empty line
    with w.function(f"int {name}(void **args)"):
        w.line(f"const float *gx = (const float *)args[{gx}], *R = (const float *)args[{rec}];",
               f"const float *h0 = (const float *)args[{h0}], *c0 = (const float *)args[{c0}], "
               f"*P = (const float *)args[{peep}];",
               f"float *Y = {f'(float *)args[{y_arg}]' if y_arg >= 0 else 'NULL'};",
               f"float *Yh = {f'(float *)args[{yh_arg}]' if yh_arg >= 0 else 'NULL'};",
               f"float *Yc = {f'(float *)args[{yc_arg}]' if yc_arg >= 0 else 'NULL'};",
               f"float *hbuf0 = (float *)args[{scratch}], *hbuf1 = hbuf0 + {B * H}, *c = hbuf0 + {2 * B * H};",
               f"int64_t *done = (int64_t *)(hbuf0 + {state_floats});  /* thread p's finished steps at done[8 * p] */",
               "int threads = omp_get_max_threads();",
               f"threads = threads < {min(blocks, _MAX_THREADS)} ? threads : {min(blocks, _MAX_THREADS)};")  # fmt: skip
        with w.block(f"for (int64_t d = 0; d < {D}; d++)"):
            w.line(f"memcpy(hbuf0, h0 + d * {B * H}, sizeof(float) * {B * H});",
                   f"memcpy(c, c0 + d * {B * H}, sizeof(float) * {B * H});",
                   f"const float *Rd = R + d * {blocks * H * 4 * U}, *Pd = P + d * {3 * H};",
                   f"const int reverse = {reverse};",
                   "for (int i = 0; i < threads; i++) done[8 * i] = 0;",
                   "#pragma omp parallel num_threads(threads)")  # fmt: skip
            with w.block(""):
                w.line("const int64_t p = omp_get_thread_num(), np = omp_get_num_threads();",
                       f"const int64_t first = {blocks} * p / np, last = {blocks} * (p + 1) / np;")
                with w.block(f"for (int64_t step = 0; step < {S}; step++)"):
                    w.line(f"const int64_t t = reverse ? {S - 1} - step : step;",
                           "const float *hin = (step & 1) ? hbuf1 : hbuf0;",
                           "float *hout = (step & 1) ? hbuf0 : hbuf1;")
                    with w.block("for (int64_t blk = first; blk < last; blk++)"):
                        w.line(f"const int64_t u = blk * {U};", f"const float *panel = Rd + blk * {H * 4 * U};")
                        with w.block(f"for (int64_t b = 0; b < {B}; b++)"):
                            w.line(f"const float *gxt = gx + ((d * {S} + t) * {B} + b) * {4 * H} + u, "
                                   f"*hb = hin + b * {H};",
                                   f"float *cb = c + b * {H} + u, *ho = hout + b * {H} + u;")  # fmt: skip
                            write_gate_block(w, "gxt", "hb", "panel", "cb", "ho", "Pd + u", H, U)
                            w.line(f"if (Y) memcpy(Y + ((t * {D} + d) * {B} + b) * {H} + u, ho, sizeof(float) * {U});")
                    w.line("/* barrier: publish this step, wait until every thread has finished it */",
                           "__atomic_store_n(&done[8 * p], step + 1, __ATOMIC_RELEASE);",
                           "for (int64_t q = 0; q < np; q++)")  # fmt: skip
                    with w.indented(), w.block("while (__atomic_load_n(&done[8 * q], __ATOMIC_ACQUIRE) < step + 1)"):
                        w.verbatim("#if defined(__x86_64__) || defined(__i386__)")
                        w.line("__builtin_ia32_pause();")
                        w.verbatim("#endif")
            w.line(f"const float *h = ({S} & 1) ? hbuf1 : hbuf0;  /* step S-1 wrote buffer S % 2 */",
                   f"if (Yh) memcpy(Yh + d * {B * H}, h, sizeof(float) * {B * H});",
                   f"if (Yc) memcpy(Yc + d * {B * H}, c, sizeof(float) * {B * H});")  # fmt: skip
    return w.text(end="\n")


# the recurrence as one template: a barrier per step, no rTask variants
BACKEND = CTemplate("lstm_scan", "LSTM scan C template", lstm_supported, lstm_scratch_bytes, render_lstm,
                    describe_lstm)  # fmt: skip
