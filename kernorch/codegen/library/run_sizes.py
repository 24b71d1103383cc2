"""Library calls whose sizes are known only when they run: the forms a shape-generic plan gives them
(codegen/generic/: the kernel rendered at several sizes, its size-dependent literals made expressions).

**A float32 matmul with run-time rows** (`render_matmul_at_run_sizes`).

The primitive is created once, when the plan is created, with its source's and destination's dims and strides
run-time (DNNL_RUNTIME_DIM_VAL) but for the last of each — the rows (and any batch) follow the sizes, the inner
dims do not — and its constant weights packed once into the layout oneDNN chooses. A run writes the call's dims and
strides as literals (the unified source computes them from the sizes) and re-creates the source's and
destination's memories only when they differ from the previous run's (a generation repeats them never, a server
batch often). oneDNN 3.2 runs such a matmul with its jit sgemm (`gemm:jit:f32`; the shape-specialised call picks
brgemm). Its scratchpad is the library's own (a user scratchpad is sized when the primitive is created).

Only what this form can say: a float32 matmul with constant weights, a bias and eltwise post-ops; anything else
(a binary post-op's operand, scales, zero points, bfloat16) renders as the specialised call, which unifies only
where the sizes do not reach it.

**A convolution at run-time sizes** (`render_per_shape`): any library call's backend (oneDNN, kernorch's own
convolutions) rendered for one image, as its source is unified across sizes (codegen/generic/): its create and
run take the sizes (`SIZES_PARAMETER`), so a unified create makes the primitive of the call's sizes. oneDNN makes
a convolution primitive for one shape only (no run-time dims), so a run looks the call's shape up in a small cache
of created primitives (`PER_SHAPE_PRIMITIVES`, the least recently used one destroyed beyond it) and creates one on
a miss — once per image size, on its first call: a detector's few resolutions each pay it once, a batch's any
number of images never (the images are independent in a convolution: the primitive for one runs once per image
of the call, every batched buffer advanced by its image's stride).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from kernorch.codegen.c import SIZES_PARAMETER, SIZES_POINTER, CWriter, c_literal
from kernorch.codegen.library.call import LibraryCall, Tensor
from kernorch.codegen.library.epilogue import Eltwise
from kernorch.codegen.library.onednn import DEFAULT_ALPHA, ELTWISE_ALG, as_onednn, pointer_of, render_onednn_call
from kernorch.codegen.loops import NotGeneratable

RUNTIME = "DNNL_RUNTIME_DIM_VAL"
# created calls a convolution keeps, one per shape it ran at: a detector's resolutions, each made once
PER_SHAPE_PRIMITIVES = 8


def runs_at_run_sizes(call: LibraryCall) -> bool:
    """Whether the call has this module's form (module doc)."""
    return call.op == "matmul" and call.precision == "f32" and call.weights.constant and call.scales is None \
        and call.src_zero is None and all(t is None and isinstance(op, Eltwise) for op, t in call.post_ops) \
        and all(t.dtype == "float32" for t in (call.src, call.weights, call.dst))  # fmt: skip


def render_matmul_at_run_sizes(name: str, call: LibraryCall) -> str:
    """The call in this module's form where it has it, else the specialised call (render_onednn_call)."""
    if not runs_at_run_sizes(call):
        return render_onednn_call(name, call)
    count = 4 if call.bias is not None else 3
    w = CWriter()
    w.line(f"typedef struct {{ dnnl_engine_t engine; dnnl_primitive_t prim; dnnl_memory_t mem[{count}]; "
           f"dnnl_exec_arg_t args[{count}]; dnnl_dim_t shape[2][24]; }} {name}_state;")  # fmt: skip
    with w.function(f"static void {name}_destroy(void *state)", returns=None):
        w.line(f"{name}_state *s = ({name}_state *)state;", "if (!s) return;",
               f"for (int i = 0; i < {count}; i++) if (s->mem[i]) dnnl_memory_destroy(s->mem[i]);",
               "if (s->prim) dnnl_primitive_destroy(s->prim);", "free(s);")  # fmt: skip
    with w.function(f"static void *{name}_create(dnnl_engine_t engine, dnnl_stream_t stream, void **a)", returns="s"):
        _create(w, name, call, count)
    with w.function(f"static int {name}_run(void *state, dnnl_stream_t stream, void **a)", returns=None):
        w.line(f"{name}_state *s = ({name}_state *)state;",
               *_dims_and_strides("r0", call.src), *_dims_and_strides("r2", call.dst))  # fmt: skip
        with w.block("if (memcmp(s->shape[0], r0, sizeof r0) || memcmp(s->shape[1], r2, sizeof r2))"):
            for i, tensor, array in ((0, call.src, "r0"), (2, call.dst, "r2")):
                rank = len(tensor.dims)
                w.line(f"if (s->mem[{i}]) {{ dnnl_memory_destroy(s->mem[{i}]); s->mem[{i}] = NULL; }}",
                       f"dnnl_memory_desc_t md{i} = NULL;",
                       f"if (dnnl_memory_desc_create_with_strides(&md{i}, {rank}, {array}, dnnl_f32, {array} + {rank}) "
                       "!= dnnl_success) return 1;",
                       f"dnnl_status_t made{i} = dnnl_memory_create(&s->mem[{i}], md{i}, s->engine, DNNL_MEMORY_NONE);",
                       f"dnnl_memory_desc_destroy(md{i});", f"if (made{i} != dnnl_success) return 1;",
                       f"s->args[{i}].memory = s->mem[{i}];")  # fmt: skip
            w.line("memcpy(s->shape[0], r0, sizeof r0);", "memcpy(s->shape[1], r2, sizeof r2);")
        w.line(f"if (dnnl_memory_set_data_handle(s->mem[0], {pointer_of(call.src)}) != dnnl_success) return 1;",
               f"if (dnnl_memory_set_data_handle(s->mem[2], {pointer_of(call.dst)}) != dnnl_success) return 1;")
        if call.bias is not None:
            w.line(f"if (dnnl_memory_set_data_handle(s->mem[3], {pointer_of(call.bias)}) != dnnl_success) return 1;")
        w.line(f"return dnnl_primitive_execute(s->prim, stream, {count}, s->args) != dnnl_success;")
    return w.text(end="\n")


def _dims_and_strides(name: str, tensor: Tensor) -> list[str]:
    """The tensor's dims then strides, as one array (what a run compares and describes its memory with)."""
    return [f"const dnnl_dim_t {name}[] = {{{', '.join(str(v) for v in (*tensor.dims, *tensor.strides))}}};"]


def _runtime(values: tuple[int, ...]) -> str:
    """Every value but the last run-time: the inner dim and its stride are the call's own."""
    return ", ".join([RUNTIME] * (len(values) - 1) + [str(values[-1])])


def _create(w: CWriter, name: str, call: LibraryCall, count: int) -> None:
    weights = call.weights
    w.line(f'static const char ko_where[] = "{name}";',
           f"{name}_state *s = ({name}_state *)calloc(1, sizeof({name}_state));",
           "dnnl_memory_desc_t md[4] = {0}, md_any = NULL;", "dnnl_primitive_attr_t attr = NULL;",
           "dnnl_post_ops_t ops = NULL;", "dnnl_primitive_desc_t pd = NULL, reorder_pd = NULL;",
           "dnnl_primitive_t reorder = NULL;", "dnnl_memory_t user = NULL;", "int ok = 0;",
           'if (!s) { snprintf(ko_error, sizeof ko_error, "%s: out of memory", ko_where); return NULL; }',
           "s->engine = engine;", "for (int i = 0; i < 24; i++) s->shape[0][i] = s->shape[1][i] = -1;")  # fmt: skip
    for i, tensor in ((0, call.src), (2, call.dst)):
        w.line(f"const dnnl_dim_t d{i}[] = {{{_runtime(tensor.dims)}}}, s{i}[] = {{{_runtime(tensor.strides)}}};",
               f"KO_CHECK(ko_md(&md[{i}], {len(tensor.dims)}, d{i}, s{i}));")  # fmt: skip
    w.line(f"const dnnl_dim_t d1[] = {{{', '.join(map(str, weights.dims))}}}, "
           f"s1[] = {{{', '.join(map(str, weights.strides))}}};",
           f"KO_CHECK(ko_md(&md[1], {len(weights.dims)}, d1, s1));",
           f"KO_CHECK(dnnl_memory_desc_create_with_tag(&md_any, {len(weights.dims)}, d1, dnnl_f32, "
           "dnnl_format_tag_any));")  # fmt: skip
    if call.bias is not None:
        bias = call.bias
        w.line(f"const dnnl_dim_t d3[] = {{{', '.join(map(str, bias.dims))}}}, "
               f"s3[] = {{{', '.join(map(str, bias.strides))}}};",
               f"KO_CHECK(ko_md(&md[3], {len(bias.dims)}, d3, s3));")
    w.line("KO_CHECK(dnnl_primitive_attr_create(&attr));", "KO_CHECK(dnnl_post_ops_create(&ops));")
    for op in (expanded for given, _ in call.post_ops for expanded in as_onednn(given)):
        assert isinstance(op, Eltwise)
        alpha = c_literal(op.alpha or DEFAULT_ALPHA.get(op.alg, 0.0), "float32")
        w.line(f"KO_CHECK(dnnl_post_ops_append_eltwise(ops, {ELTWISE_ALG[op.alg]}, {alpha}, "
               f"{c_literal(op.beta, 'float32')}));")  # fmt: skip
    w.line("KO_CHECK(dnnl_primitive_attr_set_post_ops(attr, ops));",
           f"KO_CHECK(dnnl_matmul_primitive_desc_create(&pd, engine, md[0], md_any, "
           f"{'md[3]' if call.bias is not None else 'NULL'}, md[2], attr));",
           "KO_CHECK(dnnl_primitive_create(&s->prim, pd));")  # fmt: skip
    with w.block(""):  # the constant weights packed once into the layout the primitive chose
        w.line("const_dnnl_memory_desc_t chosen = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);",
               f"KO_CHECK(dnnl_memory_create(&user, md[1], engine, {pointer_of(weights)}));",
               "KO_CHECK(dnnl_memory_create(&s->mem[1], chosen, engine, DNNL_MEMORY_ALLOCATE));",
               "KO_CHECK(dnnl_reorder_primitive_desc_create(&reorder_pd, md[1], engine, chosen, engine, NULL));",
               "KO_CHECK(dnnl_primitive_create(&reorder, reorder_pd));",
               "dnnl_exec_arg_t pack[2] = {{DNNL_ARG_FROM, user}, {DNNL_ARG_TO, s->mem[1]}};",
               "KO_CHECK(dnnl_primitive_execute(reorder, stream, 2, pack));", "KO_CHECK(dnnl_stream_wait(stream));")
    if call.bias is not None:
        w.line("KO_CHECK(dnnl_memory_create(&s->mem[3], md[3], engine, DNNL_MEMORY_NONE));")
    arguments = ["DNNL_ARG_SRC", "DNNL_ARG_WEIGHTS", "DNNL_ARG_DST", "DNNL_ARG_BIAS"][:count]
    for i, argument in enumerate(arguments):
        w.line(f"s->args[{i}].arg = {argument}; s->args[{i}].memory = s->mem[{i}];")
    w.line("ok = 1;")
    w.verbatim("fail:")  # KO_CHECK jumps here
    w.line("for (int i = 0; i < 4; i++) if (md[i]) dnnl_memory_desc_destroy(md[i]);",
           "if (md_any) dnnl_memory_desc_destroy(md_any);", "if (user) dnnl_memory_destroy(user);",
           "if (reorder) dnnl_primitive_destroy(reorder);", "if (reorder_pd) dnnl_primitive_desc_destroy(reorder_pd);",
           "if (pd) dnnl_primitive_desc_destroy(pd);", "if (ops) dnnl_post_ops_destroy(ops);",
           "if (attr) dnnl_primitive_attr_destroy(attr);", f"if (!ok) {{ {name}_destroy(s); return NULL; }}")


def batched(call: LibraryCall) -> list[Tensor]:
    """The call's tensors with the batch on their first axis: the source's batch (more than one image), the
    destination, a binary post-op's operand of as many images (a broadcast one has one)."""
    images = call.src.dims[0] if call.src.dims else 1
    if call.op not in ("convolution", "deconvolution") or images < 2 or call.dst.dims[0] != images:
        return []
    operands = [t for _, t in call.post_ops if t is not None and t.dims and t.dims[0] == images]
    return [call.src, call.dst, *operands]


def render_per_shape(name: str, call: LibraryCall, render: Callable[[str, LibraryCall], str]) -> str:
    """The convolution `call` at run-time sizes (module doc): `render`'s call for one image, its create and run
    taking the sizes, behind a cache of one created call per shape."""
    tensors = batched(call)
    images = call.src.dims[0] if tensors else 1
    one = {id(t): replace(t, dims=(1, *t.dims[1:])) for t in tensors}
    single = replace(call, src=one.get(id(call.src), call.src), dst=one.get(id(call.dst), call.dst),
                     post_ops=tuple((op, one.get(id(t), t) if t is not None else None) for op, t in call.post_ops))
    inner = f"{name}_at"
    text = render(inner, single)
    # its create and run definitions (oneDNN's take a dnnl_stream_t, kernorch's own convolutions a void *)
    definition = re.compile(rf"(\b{re.escape(inner)}_(create|run)\([^)]*void \*\*a)\)(\s*{{)")
    if sorted(found.group(2) for found in definition.finditer(text)) != ["create", "run"]:
        raise NotGeneratable(f"the library call's code has no one {inner}_create and {inner}_run to give sizes to")
    text = definition.sub(rf"\1, {SIZES_PARAMETER})\3", text)
    key = [v for t in _operands(single) for v in (*t.dims, *t.strides)]
    w = CWriter()
    w.line(text,
           f"typedef struct {{ int64_t key[{len(key)}]; void *state; uint64_t used; }} {name}_entry;",
           f"typedef struct {{ dnnl_engine_t engine; uint64_t clock; {name}_entry entry[{PER_SHAPE_PRIMITIVES}]; }} "
           f"{name}_shapes;")  # fmt: skip
    with w.function(f"static void {name}_destroy(void *state)", returns=None):
        w.line(f"{name}_shapes *s = ({name}_shapes *)state;", "if (!s) return;",
               f"for (int i = 0; i < {PER_SHAPE_PRIMITIVES}; i++) "
               f"if (s->entry[i].state) {inner}_destroy(s->entry[i].state);", "free(s);")  # fmt: skip
    with w.function(f"static void *{name}_create(dnnl_engine_t engine, dnnl_stream_t stream, void **a)",
                    returns=None):  # fmt: skip
        w.line("(void)stream; (void)a;  /* a call's primitive is created by its first run at its sizes */",
               f"{name}_shapes *s = ({name}_shapes *)calloc(1, sizeof({name}_shapes));",
               f'if (!s) {{ snprintf(ko_error, sizeof ko_error, "%s: out of memory", "{name}"); return NULL; }}',
               "s->engine = engine;", "return s;")  # fmt: skip
    with w.function(f"static int {name}_run(void *state, dnnl_stream_t stream, void **a)", returns=None):
        w.line(f"{name}_shapes *s = ({name}_shapes *)state;",
               f"const int64_t key[] = {{{', '.join(map(str, key))}}};",
               f"{name}_entry *e = NULL, *oldest = &s->entry[0];")  # fmt: skip
        with w.block(f"for (int i = 0; i < {PER_SHAPE_PRIMITIVES} && !e; i++)"):
            w.line(f"{name}_entry *c = &s->entry[i];",
                   "if (c->state && !memcmp(c->key, key, sizeof key)) e = c;",
                   "else if (c->used < oldest->used) oldest = c;  /* an empty entry's is 0: filled first */")
        with w.block("if (!e)"):
            w.line("e = oldest;", f"if (e->state) {{ {inner}_destroy(e->state); e->state = NULL; }}",
                   f"e->state = {inner}_create(s->engine, stream, a, {SIZES_POINTER});", "if (!e->state) return 1;",
                   "memcpy(e->key, key, sizeof key);")  # fmt: skip
        w.line("e->used = ++s->clock;")
        if tensors:
            arguments = 1 + max(t.slot for t in _operands(call))
            steps = {t.slot: t.strides[0] * int(np.dtype(_NUMPY[t.dtype]).itemsize) for t in tensors}
            w.line(f"void *image[{arguments}];", f"for (int i = 0; i < {arguments}; i++) image[i] = a[i];")
            with w.block(f"for (int64_t n = 0; n < {images}; n++)"):
                w.line(*(f"image[{slot}] = (char *)a[{slot}] + n * {step};" for slot, step in sorted(steps.items())),
                       f"if ({inner}_run(e->state, stream, image, {SIZES_POINTER})) return 1;")  # fmt: skip
            w.line("return 0;")
        else:
            w.line(f"return {inner}_run(e->state, stream, a, {SIZES_POINTER});")
    return w.text(end="\n")


def _operands(call: LibraryCall) -> list[Tensor]:
    """Every tensor the call names: its buffers, bias, post-op operands, scales and zero point."""
    return [call.src, call.weights, call.dst, *(t for _, t in call.post_ops if t is not None),
            *(t for t in (call.bias, call.scales, call.src_zero, call.dst_scale, call.dst_zero) if t is not None)]


_NUMPY = {"float32": "float32", "bfloat16": "uint16", "int8": "int8", "uint8": "uint8", "int32": "int32"}
