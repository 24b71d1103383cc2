"""Hand-written C templates for opaque primitives (today: the LSTM scan), sized at compile time."""

from __future__ import annotations

from kernorch.ir.kernel import CandidateKernel


def lstm_supported(kernel: CandidateKernel) -> bool:
    nodes = kernel.primitives
    return (len(nodes) == 1 and nodes[0].prim == "lstm_recurrence"
            and kernel.graph.types[nodes[0].inputs[0]].dtype == "float32")  # fmt: skip


def render_lstm(name: str, kernel: CandidateKernel) -> str:
    """gates_x [D,S,B,4H] (= X·Wᵀ + biases), R [D,4H,H], h0/c0 [D,B,H], P [D,3H] → Y [S,D,B,H], Y_h, Y_c.
    Gate order i, o, f, c (ONNX); peepholes i, o, f. Per step: gates = gates_x[t] + h·Rᵀ, parallel over
    the 4H gate rows, then the cell update. (One persistent parallel region with a barrier per step was
    tried: 15-20 % slower per layer with GNU OpenMP here than a parallel loop per step.)"""
    (node,) = kernel.primitives
    graph = kernel.graph
    dirs, seq, batch, four_h = graph.types[node.inputs[0]].shape
    hidden = four_h // 4
    reverse = {"forward": "0", "reverse": "1", "bidirectional": "d"}[node.attr("direction")]
    # kernel.inputs follows first use; map the node's operands to argument slots explicitly
    slot = {value: i for i, value in enumerate(kernel.inputs)}
    out = {value: len(kernel.inputs) + i for i, value in enumerate(kernel.outputs)}
    gx, rec, h0, c0, peep = (slot[v] for v in node.inputs)
    y_arg = out.get(node.outputs[0], -1)
    yh_arg = out.get(node.outputs[1], -1)
    yc_arg = out.get(node.outputs[2], -1)
    D, S, B, H = dirs, seq, batch, hidden  # noqa: N806 - the math's names
    return f"""
int {name}(void **args) {{
    const float *gx = (const float *)args[{gx}], *R = (const float *)args[{rec}];
    const float *h0 = (const float *)args[{h0}], *c0 = (const float *)args[{c0}], *P = (const float *)args[{peep}];
    float *Y = {f"(float *)args[{y_arg}]" if y_arg >= 0 else "NULL"};
    float *Yh = {f"(float *)args[{yh_arg}]" if yh_arg >= 0 else "NULL"};
    float *Yc = {f"(float *)args[{yc_arg}]" if yc_arg >= 0 else "NULL"};
    float h[{B * H}], c[{B * H}], g[{B * 4 * H}];  /* small: on the stack, nothing allocated per call */
    for (int64_t d = 0; d < {D}; d++) {{
        memcpy(h, h0 + d * {B * H}, sizeof(float) * {B * H});
        memcpy(c, c0 + d * {B * H}, sizeof(float) * {B * H});
        const float *Rd = R + d * {4 * H * H}, *Pd = P + d * {3 * H};
        for (int64_t step = 0; step < {S}; step++) {{
            const int64_t t = ({reverse}) ? {S - 1} - step : step;
            const float *gxt = gx + (d * {S} + t) * {B * 4 * H};
            #pragma omp parallel for schedule(static)
            for (int64_t j = 0; j < {4 * H}; j++) {{
                const float *row = Rd + j * {H};
                for (int64_t b = 0; b < {B}; b++) {{
                    const float *hb = h + b * {H};
                    float acc = 0;
                    #pragma omp simd reduction(+:acc)
                    for (int64_t k = 0; k < {H}; k++) acc += hb[k] * row[k];
                    g[b * {4 * H} + j] = gxt[b * {4 * H} + j] + acc;
                }}
            }}
            for (int64_t b = 0; b < {B}; b++) {{
                float *hb = h + b * {H}, *cb = c + b * {H};
                const float *gb = g + b * {4 * H};
                #pragma omp simd
                for (int64_t k = 0; k < {H}; k++) {{
                    const float i = ko_sigmoidf(gb[k] + Pd[k] * cb[k]);
                    const float f = ko_sigmoidf(gb[{2 * H} + k] + Pd[{2 * H} + k] * cb[k]);
                    const float cell = f * cb[k] + i * ko_tanhf(gb[{3 * H} + k]);
                    const float o = ko_sigmoidf(gb[{H} + k] + Pd[{H} + k] * cell);
                    cb[k] = cell;
                    hb[k] = o * ko_tanhf(cell);
                }}
                if (Y) memcpy(Y + ((t * {D} + d) * {B} + b) * {H}, hb, sizeof(float) * {H});
            }}
        }}
        if (Yh) memcpy(Yh + d * {B * H}, h, sizeof(float) * {B * H});
        if (Yc) memcpy(Yc + d * {B * H}, c, sizeof(float) * {B * H});
    }}
    return 0;
}}
"""
