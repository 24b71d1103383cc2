"""Do the tests catch broken code? A fixed list of mutants, each a one-line change to the source that a
real bug could make, and the tests that must then fail.

For each mutant the source file is changed in place, the named tests run (pytest, `-x`), and the file is
restored (also on Ctrl-C). A mutant is *killed* when the tests fail, *survived* when they pass. Run on
demand (`make mutate`, a few minutes); the table lists every mutant, its verdict and the tests used.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RANDOM_PLANS = "kernorch/runtime/executor_test.py::test_random_plans_match_reference"
INDEXING = "kernorch/codegen/loops/indexing_test.py"
TIES = "kernorch/runtime/executor_test.py::test_comparisons_at_ties"
EXECUTOR = "kernorch/runtime/executor_test.py"
COMPILED_NODE_TESTS = "tests/test_conformance.py::test_compiled_path_passes_what_the_reference_passes"
BLP = "kernorch/orchestrate/blp_test.py"
ORACLE = "kernorch/orchestrate/oracle_test.py"
CANDIDATES = "kernorch/orchestrate/candidates_test.py"
EPILOGUES = "kernorch/codegen/library/epilogue_test.py"
GIR_RENDERER = "kernorch/codegen/c/render_test.py"
SPLITTING = "kernorch/codegen/loops/splitting_test.py"
REDUCTIONS = "kernorch/codegen/gir/reductions_test.py"
LAYOUT = "kernorch/layout/layout_test.py"
REWRITES = "kernorch/rewrite"
API = "tests/test_api.py"
LSTM_STACK = "kernorch/codegen/native/lstm_stack_test.py"
ATTENTION = "kernorch/codegen/native/attention_test.py"
ATTENTION_AMX = "kernorch/codegen/native/attention_amx_test.py"
AMX_MATMUL = "kernorch/codegen/native/amx_matmul_test.py"
AMX_CONV = "kernorch/codegen/native/amx_conv_test.py"
POINTWISE = "kernorch/codegen/native/pointwise_conv_test.py"
STREAMING = "kernorch/codegen/native/streaming_product_test.py"
FEW_CHANNEL = "kernorch/codegen/native/few_channel_conv_test.py"
RESIZE_TAPS = "kernorch/codegen/loops/resize_taps_test.py"
SEMANTICS = "tests/test_onnx_semantics.py::test_every_case_matches_onnxruntime"
DIVISION_EDGES = "tests/test_onnx_semantics.py::test_integer_division_edges_never_signal"
SANITIZED_SEMANTICS = "tests/test_sanitize.py"
CONCURRENCY = "kernorch/runtime/concurrency_test.py"
REGISTRY = "kernorch/codegen/backends/registry_test.py"
RTASK_UNITS = "tests/test_rtask_units.py"
DYNAMIC = "kernorch/shapes/dynamic_test.py"
PADDING = "kernorch/shapes/padding_test.py"
SIGNATURE = "kernorch/frontend/signature_test.py"
TRITON = "kernorch/codegen/triton/render_test.py"
GPU_COST = "kernorch/cost/gpu_test.py"
GPU_PLANS = "tests/test_gpu_plans.py"
PRECISION = "kernorch/precision/precision_test.py"
STORAGE = "kernorch/precision/storage_test.py"
VALIDATE = "kernorch/validate"
LIBRARY_CALLS = "kernorch/codegen/library/call_test.py"
REFUSED_PRIMITIVE = ("kernorch/cost/profile_test.py::"
                     "test_a_primitive_whose_every_kernel_a_library_refuses_runs_by_its_reference")


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    original: str
    mutated: str
    tests: tuple[str, ...]


MUTANTS: tuple[Mutant, ...] = (
    # NaN through oneDNN's post-ops: relu as elu(0) + 0, clip/hardsigmoid/logistic declined
    Mutant("oneDNN's relu post-op turns NaN into 0", "kernorch/codegen/library/onednn.py",
           'if isinstance(op, Eltwise) and op.alg == "relu" and op.alpha == 0.0:', "if False:", (EPILOGUES,)),
    Mutant("oneDNN takes a clip post-op", "kernorch/codegen/library/onednn.py",
           'NAN_TO_BOUND = ("clip", "hardsigmoid", "logistic")', 'NAN_TO_BOUND = ("logistic",)', (EPILOGUES,)),
    # bf16 mode: the reference's rounding, the library call's conversion, the stage's choice
    Mutant("bf16 rounding truncates instead of rounding to nearest even", "kernorch/ir/reference_kernels.py",
           "rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)",
           "rounded = bits & np.uint32(0xFFFF0000)", (PRECISION,)),
    Mutant("a bf16 library call multiplies in float32", "kernorch/codegen/library/onednn.py",
           'if tensor.dtype == "float32" and not (i == 1 and tensor.constant))', "if False)", (PRECISION,)),
    Mutant("a bf16 call's weights stay float32 when packed", "kernorch/codegen/library/onednn.py",
           'element = "dnnl_bf16" if call.precision == "bf16" else "dnnl_f32"', 'element = "dnnl_f32"', (PRECISION,)),
    Mutant("the precision stage gives bf16 where it is slower", "kernorch/precision/__init__.py",
           "if bf16_cost < fp32_cost:", "if bf16_cost != fp32_cost:", (PRECISION,)),
    Mutant("kernorch's float32 depthwise kernel takes a bf16 conv", "kernorch/codegen/backends/library_calls.py",
           "if call.precision not in self.precisions:", "if False:", (PRECISION,)),
    # bf16 values between kernels: generated C's bfloat16 stores and loads, the calls' bfloat16 operands and
    # destinations, the stage's casts
    Mutant("generated C truncates to bfloat16", "kernorch/codegen/c/prelude.py",
           "const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;", "const uint32_t rounded = u >> 16;",
           (STORAGE,)),
    Mutant("generated C's bfloat16 NaN may carry into inf", "kernorch/codegen/c/prelude.py",
           "return (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? ((u >> 16) & 0x8000u) | 0x7FC0u : rounded);",
           "return (uint16_t)rounded;", (STORAGE,)),
    Mutant("a bfloat16 load reads the low half", "kernorch/codegen/c/prelude.py",
           "const uint32_t u = (uint32_t)bits << 16;", "const uint32_t u = (uint32_t)bits;", (STORAGE,)),
    Mutant("a call reads a bfloat16 operand as float32", "kernorch/codegen/library/onednn.py",
           'if tensor.dtype == "bfloat16":  # stored so by its producer: read as it is', "if False:", (STORAGE,)),
    Mutant("a call's bfloat16 destination is written as float32", "kernorch/codegen/library/call.py",
           'slots[epilogue.output], dst_dtype = slots[graph.nodes[stored].outputs[0]], "bfloat16"',
           'slots[epilogue.output], dst_dtype = slots[graph.nodes[stored].outputs[0]], "float32"', (STORAGE,)),
    Mutant("a view chain with a float32 reader is converted before its views", "kernorch/precision/__init__.py",
           "out not in outputs and readers.get(out, set()) <= members for i in chain", "True for i in chain",
           (STORAGE,)),
    # GPU plans: the Triton renderer, the GPU runtime, the GPU cost model, saved GPU plans
    Mutant("triton: a negative gather index is not counted from the end", "kernorch/codegen/triton/render.py",
           'wrapped, _ = self.temp(f"tl.where({raw} < 0, {raw} + {size}, {raw})", "int64")',
           'wrapped, _ = self.temp(f"{raw}", "int64")', (TRITON,)),
    Mutant("triton: round half to even rounds ties up", "kernorch/codegen/triton/expr.py",
           "r = tl.where(((r - x) == 0.5) & odd, r - 1.0, r)", "r = r", (TRITON,)),
    Mutant("triton: a pad's border reads the input unmasked and keeps it", "kernorch/codegen/triton/render.py",
           'ctx.rows))\n            return self.temp(f"tl.where({chosen}, {a}, {b})", dtype, key)',
           'ctx.rows))\n            return self.temp(a, dtype, key)', (TRITON,)),
    Mutant("triton: a row's reduction forgets its taps beyond the first block", "kernorch/codegen/triton/render.py",
           'self.open(f"for {start} in range(0, {taps}, {lanes}):")', 'self.open(f"for {start} in range(0, 1, 1):")',
           (TRITON,)),
    Mutant("triton: the matmul template's epilogue is dropped", "kernorch/codegen/triton/matmul.py",
           "result, _ = writer.value(expr, context)", 'result = "ko_acc"', (TRITON,)),
    Mutant("gpu runtime: the error flag is never cleared", "kernorch/runtime/gpu.py",
           "        self.error.zero_()\n", "", (TRITON,)),
    Mutant("gpu cost: occupancy ignored", "kernorch/cost/gpu.py",
           "occupancy = min(1.0, launch.programs / max(self.target.units, 1))", "occupancy = 1.0", (GPU_COST,)),
    Mutant("gpu plans: a saved plan's Triton is not compared with the plan's", "kernorch/runtime/artifact.py",
           "    if regenerated.encode() != shipped_source:", "    if False:", (GPU_PLANS,)),
    # dynamic shapes: binding, saved specialisations, the padding proof and its use
    Mutant("shapes: one symbol may take two sizes", "kernorch/frontend/signature.py",
           "elif values.setdefault(dim, size) != size:", "elif False:", (SIGNATURE,)),
    Mutant("shapes: a specialisation filed under other shapes loads", "kernorch/shapes/dynamic.py",
           "if actual != shapes:", "if False:", (DYNAMIC,)),
    Mutant("shapes: padding proof ignores a reduction over the padded axis", "kernorch/shapes/padding.py",
           'if first in attr("axes"):', 'if first in attr("axes") and False:', (PADDING,)),
    Mutant("shapes: padding proof ignores a size-dependent constant", "kernorch/shapes/padding.py",
           "        if axis is None:\n            raise NotProven(f\"constant",
           "        if False:\n            raise NotProven(f\"constant", (DYNAMIC,)),
    Mutant("shapes: padded outputs cut one row late", "kernorch/shapes/padding.py",
           "index[output_axis] = slice(0, self.sizes[dim])", "index[output_axis] = slice(1, self.sizes[dim] + 1)",
           (DYNAMIC,)),
    # generated C: templates and index arithmetic
    Mutant("C div becomes mul", "kernorch/codegen/c/expr.py", '"div": f"({a} / {b})" if is_float',
           '"div": f"({a} * {b})" if is_float', (RANDOM_PLANS,)),
    Mutant("C < becomes <=", "kernorch/codegen/c/expr.py", '"less": f"({a} < {b})"', '"less": f"({a} <= {b})"',
           (TIES, RANDOM_PLANS)),
    Mutant("C max picks the smaller", "kernorch/codegen/c/prelude.py", "ko_m_ = ko_a_ > ko_b_ ? ko_a_ : ko_b_",
           "ko_m_ = ko_a_ < ko_b_ ? ko_a_ : ko_b_", (RANDOM_PLANS,)),
    Mutant("integer division floors", "kernorch/codegen/c/prelude.py",
           "return b == -1 ? (int64_t)(0 - (uint64_t)a) : a / b;",
           "return b == -1 ? (int64_t)(0 - (uint64_t)a) : (a - (((a % b) + b) % b)) / b;", (RANDOM_PLANS, SEMANTICS)),
    Mutant("a cast to bool keeps the low byte", "kernorch/codegen/c/expr.py",
           'return f"((uint8_t)(({value}) != 0))"', 'return f"((uint8_t)({value}))"', (SEMANTICS,)),
    Mutant("Sign of NaN is 0 in C", "kernorch/codegen/c/expr.py", '"sign": f"(({a}) != ({a}) ? ({a}) :',
           '"sign": f"(0 ? ({a}) :', (SEMANTICS,)),
    Mutant("integer add overflows as C's signed add", "kernorch/codegen/c/expr.py",
           'if dtype not in _UNSIGNED:\n        return f"({a} {operator} {b})"',
           'if True:\n        return f"({a} {operator} {b})"', (SANITIZED_SEMANTICS,)),
    Mutant("a float cast to a narrow integer keeps out-of-range values", "kernorch/ir/numeric.py",
           "valid = (whole >= low) & (whole < high)", "valid = whole == whole", (SEMANTICS,)),
    Mutant("INT_MIN / -1 divides (a trap)", "kernorch/codegen/c/prelude.py",
           "return b == -1 ? (int64_t)(0 - (uint64_t)a) : a / b;", "return a / b;", (DIVISION_EDGES,)),
    Mutant("a lone primitive a library refuses is dropped, not run by its reference",
           "kernorch/codegen/backends/registry.py",
           "    if len(kernel.nodes) != 1:\n        return False\n    _REFUSED",
           "    if True:\n        return False\n    _REFUSED", (REFUSED_PRIMITIVE,)),
    # one model, many callers
    Mutant("a busy workspace is shared", "kernorch/runtime/executor.py",
           "if w.lock.acquire(blocking=False)), None)", "if w.lock.acquire(blocking=False) or True), None)",
           (CONCURRENCY,)),
    Mutant("each overlapping scope saves torch's count", "kernorch/runtime/threads.py",
           "if self._active == 0:\n                self._saved", "if True:\n                self._saved",
           (CONCURRENCY,)),
    Mutant("pow becomes mul", "kernorch/codegen/c/expr.py", """"pow": f"{c_math('pow', dtype)}({a}, {b})\"""",
           """"pow": f"({a} * {b})\"""", (RANDOM_PLANS,)),
    Mutant("a split range decides a select one element off", "kernorch/codegen/loops/splitting.py",
           'return (c * v + k < t) == (op == "<")', 'return (c * v + k <= t) == (op == "<")',
           (SPLITTING, RANDOM_PLANS)),
    Mutant("a row sum fused into the loop keeps only the last value", "kernorch/codegen/c/render.py",
           'f"{acc} += ({ctype})({self.names[step.result]});"', 'f"{acc} = ({ctype})({self.names[step.result]});"',
           (GIR_RENDERER, RANDOM_PLANS)),
    Mutant("a short row's last partial vector is not summed", "kernorch/codegen/c/render.py",
           'lines += lanes(str(full), size % 8, "_acc")', 'lines += lanes(str(full), 0, "_acc")',
           (GIR_RENDERER, RANDOM_PLANS)),
    Mutant("a long row's sixteen partials folded to eight lose their upper half", "kernorch/codegen/c/render.py",
           '{part}_acc += *(const ko_v8 *){part}_t16 + *(const ko_v8 *)({part}_t16 + 8);',
           '{part}_acc += *(const ko_v8 *){part}_t16;', (GIR_RENDERER,)),
    Mutant("a row's summed vectors are not added to its partials", "kernorch/codegen/c/render.py",
           'f"{part}_acc += *(const ko_v8 *){part}_t;"', 'f"{part}_acc = *(const ko_v8 *){part}_t;"',
           (GIR_RENDERER, RANDOM_PLANS)),
    Mutant("a block's row sums take a lane of the next row", "kernorch/codegen/c/prelude.py",
           "__builtin_shufflevector(p[4], p[5], 1, 3, 9, 11, 5, 7, 13, 15)",
           "__builtin_shufflevector(p[4], p[5], 1, 3, 9, 11, 5, 7, 13, 14)", (GIR_RENDERER, RANDOM_PLANS)),
    Mutant("a row's overlapping last vector block starts one element early", "kernorch/codegen/c/render.py",
           'f"for (int64_t {var} = {size - width}; {var} < {size}; {var}++) {{"',
           'f"for (int64_t {var} = {size - width - 1}; {var} < {size - 1}; {var}++) {{"', (GIR_RENDERER, RANDOM_PLANS)),
    Mutant("an upsampling's border at the axis end starts one input late", "kernorch/codegen/loops/description.py",
           'lit(size_in - high)), tail, head)', 'lit(size_in - high + 1)), tail, head)',
           (RESIZE_TAPS,)),
    Mutant("an upsampling's periodic taps are not checked against the reference map",
           "kernorch/codegen/loops/resize_taps.py",
           "    if not matches:\n        return None", "    if False:\n        return None", (RESIZE_TAPS,)),
    Mutant("a simd loop setting err drops its reduction", "kernorch/codegen/c/render.py",
           "            if _ERR.search(out[j]):\n                break", "            pass", (GIR_RENDERER,)),
    Mutant("the description memo outlives its block", "kernorch/codegen/gir/memo.py", "        _active.pop()",
           "        pass", ("kernorch/codegen/gir/memo_test.py",)),
    Mutant("orchestration prices candidates outside the description memo", "kernorch/orchestrate/orchestrator.py",
           'pricing = getattr(cost_model, "pricing", None)', "pricing = None", ("kernorch/cost/profile_test.py",)),
    Mutant("a pool separated per axis swaps its begin and end pads", "kernorch/rewrite/rules/window.py",
           '"pads": _along(pads[:spatial], axis, 0) + _along(pads[spatial:], axis, 0)}',
           '"pads": _along(pads[spatial:], axis, 0) + _along(pads[:spatial], axis, 0)}',
           ("kernorch/rewrite/rules/window_test.py",)),
    Mutant("a pool's axis of one tap keeps a tap loop", "kernorch/codegen/loops/description.py",
           "pads[j], pads[spatial + j]) == (1, 1, 1, 0, 0):", "pads[j], pads[spatial + j]) == (0, 0, 0, 0, 0):",
           ("kernorch/codegen/c/kernel_test.py",)),
    Mutant("a row step reading what it stores is a simd loop", "kernorch/codegen/gir/lowering.py",
           "return mapping is not None and mapping[0].isdisjoint(buffer for buffer, _ in mapping[1])",
           "return mapping is not None", (GIR_RENDERER,)),
    Mutant("a collapsed nest keeps its one-iteration loops", "kernorch/codegen/c/loops.py",
           "kept = [(var, bound, step) for var, bound, step in loops if bound > step] or loops[-1:]",
           "kept = list(loops)", ("kernorch/codegen/c/kernel_test.py",)),
    Mutant("a row step reading what it stores overlaps its tail", "kernorch/codegen/gir/lowering.py",
           "    return stored.isdisjoint(buffer for buffer, level in read if level == GLOBAL)", "    return True",
           (GIR_RENDERER, RANDOM_PLANS)),
    Mutant("a phase's reductions do not count as work when sharing it out", "kernorch/codegen/gir/reductions.py",
           "    return max(1, taps(tree))", "    return 1", (GIR_RENDERER,)),
    Mutant("an address part reading the vector loop's variable is hoisted", "kernorch/codegen/c/render.py",
           "and not _loop_vars(tree) & inner:  # fmt: skip", ":  # fmt: skip",
           (GIR_RENDERER, RANDOM_PLANS, SPLITTING)),
    Mutant("around an unrolled short loop, the vector loop's part of an address is hoisted",
           "kernorch/codegen/c/render.py", "self.phase.loops[-2 if self.phase.unrolled else -1:]",
           "self.phase.loops[-1:]", (GIR_RENDERER, RANDOM_PLANS, SPLITTING)),
    Mutant("a nested body drops the hoisted constants of the body around it", "kernorch/codegen/c/render.py",
           "mine, self.hoisted = self.hoisted, enclosing", "mine, self.hoisted = self.hoisted, None",
           (GIR_RENDERER, RANDOM_PLANS, SPLITTING)),
    Mutant("max by a literal lets a NaN through", "kernorch/codegen/c/expr.py",
           'return f"({number} > {a} ? {number} : {a})" if prim == "max"',
           'return f"({a} > {number} ? {a} : {number})" if prim == "max"', (GIR_RENDERER, RANDOM_PLANS)),
    Mutant("GIR-rendered where swaps its branches", "kernorch/codegen/c/render.py",
           'f"({args[0]} ? {args[1]} : {args[2]})"', 'f"({args[0]} ? {args[2]} : {args[1]})"',
           (GIR_RENDERER, RANDOM_PLANS)),
    Mutant("GIR hoists what varies along an unrolled or row loop", "kernorch/codegen/gir/lowering.py",
           'outer = 0 if any(mentions(tree, var) for var in ctx["pinned"]) else ctx["outer"]',
           'outer = ctx["outer"]', (GIR_RENDERER, RANDOM_PLANS, EXECUTOR)),
    Mutant("index remainder bound off by one", "kernorch/codegen/loops/indexing.py",
           "if bounds is not None and bounds[0] >= 0 and bounds[1] < n:",
           "if bounds is not None and bounds[0] >= 0 and bounds[1] <= n:", (INDEXING, RANDOM_PLANS, EXECUTOR)),
    Mutant("digits merge without checking strides", "kernorch/codegen/loops/indexing.py",
           "if terms[high] != terms[low] * low.radix:", "if False:", (INDEXING, RANDOM_PLANS, EXECUTOR)),
    Mutant("pooling border check dropped too often", "kernorch/codegen/loops/description.py",
           "(kernel[j] - 1) * dilations[j] < in_shape[lead + j]:",
           "(kernel[j] - 1) * dilations[j] <= in_shape[lead + j]:", (EXECUTOR,)),
    Mutant("running max starts at 0", "kernorch/codegen/c/loops.py",
           'init = "-INFINITY" if is_float else {"int64": "INT64_MIN", "int32": "INT32_MIN", "bool": "0"}[dtype]\n'
           '        return init, "KO_MAX_INTO({acc}, {x});"',
           'init = "0" if is_float else {"int64": "INT64_MIN", "int32": "INT32_MIN", "bool": "0"}[dtype]\n'
           '        return init, "KO_MAX_INTO({acc}, {x});"', (EXECUTOR, COMPILED_NODE_TESTS)),
    Mutant("simd max forgets a NaN", "kernorch/codegen/c/render.py", 'f"{nan} |= {x} != {x};"',
           'f"{nan} |= 0;"', ("kernorch/codegen/c/kernel_test.py::"
                              "test_float_max_and_min_are_simd_reductions_that_propagate_nan",)),
    Mutant("a map over part of a reduction's domain is teed into it", "kernorch/codegen/gir/tee.py",
           "        if not _one_to_one(mapped, binding, sizes):\n            continue",
           "        if False:\n            continue", ("kernorch/codegen/gir/tee_test.py",)),
    Mutant("a teed value is not stored", "kernorch/codegen/gir/lowering.py",
           "            self.store_at(tree[1], tree[2], result, ctx)\n", "", ("kernorch/codegen/gir/tee_test.py",)),
    Mutant("the sigmoid's low end wraps (no select below -88)", "kernorch/codegen/c/prelude.py",
           "    y = x < -88.0f ? 0.0f : y;\n", "\n", ("kernorch/codegen/c/math_test.py",)),
    Mutant("the sigmoid's high end wraps (no select above 88)", "kernorch/codegen/c/prelude.py",
           "return x > 88.0f ? 1.0f : y;", "return y;", ("kernorch/codegen/c/math_test.py",)),
    Mutant("the sigmoid's exp drops ln2's low part", "kernorch/codegen/c/prelude.py",
           "r = n * 2.12194440e-4f + r;", "r = r + 0.0f;", ("kernorch/codegen/c/math_test.py",)),
    Mutant("running max drops a new NaN", "kernorch/codegen/c/prelude.py",
           "(acc) = ((ko_x_ > (acc)) | (ko_x_ != ko_x_)) ? ko_x_ : (acc); })",
           "(acc) = (ko_x_ > (acc)) ? ko_x_ : (acc); })", (REDUCTIONS,)),
    Mutant("depthwise taps shifted", "kernorch/codegen/loops/description.py", 'lit(-attrs["pads"][j])),',
           'lit(1 - attrs["pads"][j])),', (EXECUTOR,)),
    # library calls and their epilogues
    Mutant("T - x loses its negation", "kernorch/codegen/library/epilogue.py",
           'post_ops.extend([Binary("sub", other), Eltwise("linear", -1.0, 0.0)])',
           'post_ops.extend([Binary("sub", other)])', (EPILOGUES,)),
    Mutant("a later per-channel add becomes the bias", "kernorch/codegen/library/epilogue.py",
           'if bias is None and not post_ops and head.prim == "add"',
           'if bias is None and head.prim == "add"', (EPILOGUES,)),
    Mutant("activation fit accepts anything close-ish", "kernorch/codegen/library/epilogue.py", "_FIT_TOLERANCE = 2e-6",
           "_FIT_TOLERANCE = 2e-1", (EPILOGUES,)),
    Mutant("deconv weights not transposed", "kernorch/codegen/library/call.py",
           "w_strides = (strides[2], strides[1], *strides[3:])", "w_strides = (strides[1], strides[2], *strides[3:])",
           (COMPILED_NODE_TESTS,)),
    Mutant("transposed matmul operand read untransposed", "kernorch/ir/strided.py",
           "tuple(shape[p] for p in perm), tuple(strides[p] for p in perm)",
           "tuple(shape[p] for p in perm), tuple(strides)", (API, EXECUTOR)),
    Mutant("dilation passed as is", "kernorch/codegen/library/call.py",
           'tuple(int(d) - 1 for d in attrs["dilations"])', 'tuple(int(d) for d in attrs["dilations"])',
           ("kernorch/codegen/library/call_test.py", COMPILED_NODE_TESTS)),
    Mutant("bias bound to the wrong argument", "kernorch/codegen/library/onednn.py",
           'memories.append(("DNNL_ARG_BIAS", call.bias, False))',
           'memories.append(("DNNL_ARG_SRC_1", call.bias, False))', (EXECUTOR, EPILOGUES)),
    # orchestration
    Mutant("BLP dependency rows deleted", "kernorch/orchestrate/blp.py",
           "            add_row(0.0, infinity, entries)", "            pass", (BLP,)),
    Mutant("BLP output rows deleted", "kernorch/orchestrate/blp.py",
           "add_row(1.0, infinity, {column[j]: 1.0 for j in producers[value]})", "pass", (BLP,)),
    Mutant("optional-output subsets collapse to none/all", "kernorch/orchestrate/candidates.py",
           "extra = [c for r in range(len(optional) + 1) for c in combinations(optional, r)]",
           "extra = [(), tuple(optional)]", (ORACLE, BLP)),
    Mutant("library calls may write intermediate values", "kernorch/orchestrate/candidates.py",
           "if linear and (len(mandatory) > 1 or optional):", "if False:", (CANDIDATES, EXECUTOR, BLP)),
    Mutant("every set is convex", "kernorch/orchestrate/subgraph.py",
           "return (ancestors & descendants & ~mask) == 0", "return True", (BLP,)),
    # rewrites
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
    Mutant("the rewrite search tries a promising rule again before judging every rule once",
           "kernorch/rewrite/search.py", "key=lambda s: (s.rule.name in outcomes, -_promise(",
           "key=lambda s: (-_promise(", ("kernorch/rewrite/search_test.py",)),
    Mutant("sub-constant forgets the negation", "kernorch/rewrite/rules/algebra.py",
           'ctx.emit("add", left, ctx.emit("neg", right))', 'ctx.emit("add", left, right)', (REWRITES,)),
    Mutant("a permuted row's lane indices ignore which two registers they select from",
           "kernorch/codegen/c/render_permuted.py", 'lanes = ", ".join(str(lane - at) for lane in block)',
           'lanes = ", ".join(str(lane % 32) for lane in block)', ("kernorch/codegen/gir/row_permute_test.py",)),
    Mutant("a one-pass variance without its shift", "kernorch/codegen/gir/variance.py",
           '_scalar(shift, substituted(value, {var: ("lit", 0)})),', '_scalar(shift, ("const", 0.0, _F32)),',
           ("kernorch/codegen/gir/variance_test.py",)),
    Mutant("the sum of squares in a loop of its own", "kernorch/codegen/gir/lowering.py",
           "marked[k] = replace(first, joined=True)", "marked[k] = first",
           ("kernorch/codegen/gir/variance_test.py",)),
    Mutant("a column one-pass mean adds the shift n - 1 times", "kernorch/codegen/gir/variance.py",
           '("op", "mul", _F32, shift, ("const", float(n), _F32))',
           '("op", "mul", _F32, shift, ("const", n - 1.0, _F32))',
           ("kernorch/codegen/gir/variance_columns_test.py",)),
    Mutant("a tap block skips its last tap", "kernorch/codegen/c/loops.py",
           "{tap} < ko_{tap} + {block}; {tap}++", "{tap} < ko_{tap} + {block} - 1; {tap}++", (REDUCTIONS,)),
    Mutant("sums joined though one reads what the other stores", "kernorch/codegen/gir/reductions.py",
           "if first.target in buffers_used(second.expr) or", "if False or",
           ("kernorch/codegen/gir/variance_columns_test.py",)),
    Mutant("scales out of a product add up instead of multiplying", "kernorch/rewrite/rules/algebra.py",
           'ctx.emit("mul", ctx.emit("mul", x, y), ctx.emit("mul", c1, c2))',
           'ctx.emit("mul", ctx.emit("mul", x, y), ctx.emit("add", c1, c2))', (REWRITES,)),
    Mutant("no kernel recomputes an elementwise input", "kernorch/orchestrate/candidates.py",
           "        found.append((extended, p))", "        continue", (ORACLE,)),
    # layout
    Mutant("reshape mixes separated axes", "kernorch/layout/layouts.py",
           "if places != list(range(places[0], places[0] + len(places))):", "if False:", (LAYOUT,)),
    Mutant("pooling in a layout that reorders its axes", "kernorch/layout/modes.py",
           "if positions != sorted(positions):", "if False:", (LAYOUT,)),
    Mutant("layout change transposes the wrong way", "kernorch/layout/materialize.py",
           '{"perm": between(source, memory)}', '{"perm": between(memory, source)}', (LAYOUT,)),
    Mutant("layout change ignores where a frame put size-1 axes", "kernorch/layout/materialize.py",
           "canonical_view = self.reshaped(self.stored[value, source], permute(shape, source), origin)",
           "canonical_view = self.stored[value, source]", (LAYOUT,)),
    Mutant("reduction axes not relabelled", "kernorch/layout/modes.py",
           '"axes": tuple(sorted(position[a] for a in attrs["axes"]))', '"axes": tuple(sorted(attrs["axes"]))',
           (LAYOUT,)),
    Mutant("a swapped matmul product keeps its operands' order", "kernorch/layout/materialize.py",
           "inputs = [operand(b, lb, True), operand(a, la, True)]",
           "inputs = [operand(a, la, True), operand(b, lb, True)]", (LAYOUT,)),
    Mutant("a matmul operand read as stored whichever way the product needs it", "kernorch/layout/materialize.py",
           "if (layout != identity(rank)) == transposed:", "if True:", (LAYOUT,)),
    Mutant("a 1x1 conv as a matmul reads its input as stored whatever the output's layout",
           "kernorch/layout/materialize.py", "if x_last != out_last:", "if False:", (LAYOUT,)),
    Mutant("a 1x1 conv as a matmul writing channels-last keeps its weight untransposed",
           "kernorch/layout/materialize.py", "np.ascontiguousarray(matrix.T if out_last else matrix)",
           "np.ascontiguousarray(matrix)", (LAYOUT,)),
    # stacked LSTM waves
    Mutant("stack rTask does not wait for the layer below", "kernorch/codegen/native/lstm_stack.py",
           "< chunk + 1) {{", "< chunk) {{", (LSTM_STACK,)),
    Mutant("stack projection drops the bias", "kernorch/codegen/native/lstm_stack.py", "acc[i][j] = bp[j];",
           "acc[i][j] = 0;", (LSTM_STACK,)),
    Mutant("stack keeps a lower layer whose h is used", "kernorch/rewrite/rules/recurrent.py",
           "any(ctx.consumers(v) or ctx.is_output(v)", "any(ctx.consumers(v) and ctx.is_output(v)", (REWRITES,)),
    # profiling
    Mutant("every input of an isolated kernel reads the same pool values", "kernorch/cost/profile.py",
           "offset = position * _POOL_STRIDE", "offset = 0", ("kernorch/cost/profile_test.py",)),
    # saved plans
    Mutant("shipped C not compared with the plan", "kernorch/runtime/artifact.py",
           "if regenerated.encode() != shipped_source:", "if False:", (API,)),
    Mutant("manifest hash not checked", "kernorch/runtime/artifact.py",
           "if plan.get(MANIFEST_HASH_KEY) != manifest_digest(plan):", "if False:", (API,)),
    Mutant("compile cache ignores the CPU", "kernorch/codegen/program/compiler.py",
           'version, isa_digest()])', 'version])', (API,)),
    # the rTask units recorded in the GIR
    Mutant("a transpose's strips are counted as tiles", "kernorch/codegen/gir/graph.py",
           "return around * -(-size_b // STRIP_ROWS)", "return around * -(-size_b // tile)", (RTASK_UNITS,)),
    Mutant("an unrolled short loop counts as the vector loop", "kernorch/codegen/gir/graph.py",
           "inner = -2 if self.unrolled or self.row_permuted else -1", "inner = -1", (RTASK_UNITS,)),
    # the backend registry
    Mutant("a caller matches a backend's name instead of reading its attributes", "kernorch/cost/model.py",
           "if backend is not None and not backend.runs_code:", 'if backend is not None and backend.name == "view":',
           ("tests/test_structure.py",)),
    Mutant("the executor ignores a Python backend's function", "kernorch/runtime/executor.py",
           "function = self.backends[k].python_kernel(kernel)", "function = None", (REGISTRY,)),
    Mutant("a registered backend is asked after the built-in ones", "kernorch/codegen/backends/registry.py",
           "order.insert(order.index(before) if before is not None else len(order), backend)",
           "order.append(backend)", (REGISTRY,)),
    Mutant("a kernel no backend runs gets the last backend's reason", "kernorch/codegen/backends/registry.py",
           "if verdict.claims and claimed is None:", "if True:", (REGISTRY,)),
    # whole plans measured: next-best plans, validation, costs in place, 2-D matmul calls
    Mutant("a next-best selection may be an excluded plan again", "kernorch/orchestrate/blp.py",
           "add_row(-infinity, len(costly) - 1.0, {column[k]: 1.0 for k in costly})",
           "add_row(-infinity, float(len(costly)), {column[k]: 1.0 for k in costly})", (BLP,)),
    Mutant("validation keeps a plan faster by less than the margin", "kernorch/validate/__init__.py",
           "chosen = fastest if medians[fastest] < medians[0] * (1 - MARGIN) else 0", "chosen = fastest",
           (VALIDATE,)),
    Mutant("validation keeps a plan whose outputs differ", "kernorch/validate/__init__.py",
           "agrees = [True] + [_same_outputs(expected, model.run(feeds), bf16) for model in models[1:]]",
           "agrees = [True] * len(models)", (VALIDATE,)),
    Mutant("in-place costs keep the per-launch dispatch", "kernorch/validate/in_place.py",
           "    if excess <= 0:\n        return times", "    if True:\n        return times", (VALIDATE,)),
    Mutant("a linear layer on a map stays a 4-D oneDNN matmul", "kernorch/codegen/library/call.py",
           'return rows_merged(described) if described.op == "matmul" else described', "return described",
           (LIBRARY_CALLS,)),
    Mutant("validation holds bf16 plans to float32 agreement", "kernorch/validate/__init__.py",
           "BF16_AGREEMENT = 4e-2", "BF16_AGREEMENT = 1e-4", ("kernorch/validate/validate_test.py",)),
    Mutant("a per-row post-op merges a matmul's rows into oneDNN's reference path", "kernorch/codegen/library/call.py",
           "per_row = columns > 1 and any(", "per_row = columns < 0 and any(", (LIBRARY_CALLS,)),
    Mutant("an attention's mask added first is taken for its scores", "kernorch/orchestrate/attention.py",
           "scores = a if from_matmul(a) else b", "scores = a", (ATTENTION,)),
    Mutant("fused attention drops torch's NaN guard on the weights", "kernorch/codegen/native/attention.py",
           "const float w = sr[j] / l; sr[j] = {a.weight_expr};", "const float w = sr[j] / l; sr[j] = w;",
           (ATTENTION,)),
    Mutant("fused attention's softmax skips the row max", "kernorch/codegen/native/attention.py",
           "m = v > m ? v : m;", "m = 0.0f;", (ATTENTION,)),
    Mutant("fused attention reads Q without its scaling", "kernorch/codegen/native/attention.py",
           "for op, scalar in operand.prologue:", "for op, scalar in ():", (ATTENTION,)),
    Mutant("fused attention drops the keys of the last partial block", "kernorch/codegen/native/attention.py",
           "for (; j < LKP; j += KO_VC_LANES * (", "for (; j < LKP - KO_VC_LANES; j += KO_VC_LANES * (",
           (ATTENTION,)),
    Mutant("oneDNN calls its reference matmul would run are kept", "kernorch/codegen/library/onednn.py",
           'if implementation is None or not implementation.startswith("ref"):', "if True:",
           ("kernorch/codegen/library/onednn_test.py",)),
    Mutant("the partition cuts attentions as freely as anything", "kernorch/orchestrate/subgraph.py",
           "ATTENTION_CUT = 8.0", "ATTENTION_CUT = 0.0", ("kernorch/orchestrate/subgraph_test.py",)),
    Mutant("AMX attention skips the last block of keys or values", "kernorch/codegen/native/attention_amx.py",
           "for (; n < blocks; n++) {", "for (; n < blocks - 1; n++) {", (ATTENTION_AMX,)),
    Mutant("AMX attention leaves divided weights out of the tiles", "kernorch/codegen/native/attention_amx.py",
           "if ({separately} && r < rows) {{", "if (0 && r < rows) {{", (ATTENTION_AMX,)),
    Mutant("fused attention rounds the operands of a float32 plan", "kernorch/codegen/native/attention.py",
           "weights_rounded and q.rounded and kt.rounded and v.rounded", "True", (ATTENTION_AMX,)),
    Mutant("AMX matmul drops the last of its four tile products", "kernorch/codegen/native/amx_product.py",
           '"    _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);",', '"    _tile_dpbf16ps(2, 5, 6);",',
           (AMX_MATMUL, AMX_CONV)),
    Mutant("AMX matmul converts only its first block of rows", "kernorch/codegen/native/amx_matmul.py",
           """f"            if ({'!tiles && ' if ring is not None else ''}mb != loaded) {{",""",
           """f"            if ({'!tiles && ' if ring is not None else ''}loaded < 0) {{",""", (AMX_MATMUL, AMX_CONV)),
    Mutant("AMX matmul leaves the bias out", "kernorch/codegen/native/amx_product.py",
           'biased = " + bias[n]" if', 'biased = "" if', (AMX_MATMUL,)),
    Mutant("AMX matmul's path without tiles stops one k short", "kernorch/codegen/native/amx_product.py",
           'f"        for (int k = 0; k < {k_total}; k++)",', 'f"        for (int k = 0; k < {k_total} - 1; k++)",',
           (AMX_MATMUL, AMX_CONV)),
    Mutant("AMX matmul takes convolutions over few channels, where oneDNN is faster",
           "kernorch/codegen/native/amx_matmul.py", "FEW_CHANNELS, SHORT_RUN = 16, 32",
           "FEW_CHANNELS, SHORT_RUN = 0, 32", (AMX_MATMUL,)),
    Mutant("the precision stage prices an attention's products alone on AMX too", "kernorch/precision/__init__.py",
           'if "amx_bf16" not in isa_flags():', "if True:", ("kernorch/precision/precision_test.py",)),
    Mutant("AMX matmul reads taps in a convolution's padding", "kernorch/codegen/native/amx_matmul.py",
           'f"                if (iy < 0 || iy >= {ih} || ix < 0 || ix >= {iw}) {{",',
           'f"                if (iy < 0 || ix < 0) {{",', (AMX_MATMUL,)),
    Mutant("AMX convolution loads a strided block's second row tile one stride short",
           "kernorch/codegen/native/amx_matmul.py", "_tile_loadd(5, x + {16 * sx * c}", "_tile_loadd(5, x + {16 * c}",
           (AMX_CONV,)),
    Mutant("AMX convolution's ring keeps a slot's row when another row wants the slot",
           "kernorch/codegen/native/amx_product.py", '"    if (tags[slot] != tag) {",', '"    if (tags[slot] < 0) {",',
           (AMX_MATMUL, AMX_CONV)),
    Mutant("AMX convolution's ring leaves out the left padding", "kernorch/codegen/native/amx_product.py",
           "to=f'row + {px * c}'", "to='row'", (AMX_MATMUL, AMX_CONV)),
    Mutant("the profiler's check lets a bfloat16 output sit four steps from the reference", "kernorch/cost/verify.py",
           "BF16_BITS = 8", "BF16_BITS = 6", ("kernorch/cost/verify_test.py",)),
    Mutant("folded AMX convolution sums one kernel column short", "kernorch/codegen/native/amx_conv.py",
           'f"                    for (int kx = 0; kx < {kw}; kx++) {{",',
           'f"                    for (int kx = 1; kx < {kw}; kx++) {{",', (AMX_CONV,)),
    Mutant("buffers start where numpy puts them (16 bytes), not on a cache line", "kernorch/runtime/memory.py",
           "shift = (-raw.ctypes.data) % ALIGNMENT\n    return", "shift = 0\n    return",
           ("kernorch/runtime/memory_test.py",)),
    Mutant("the per-region rProgram keeps the regions that ran slower than their kernels",
           "kernorch/schedule/regions.py", "if alone < region_seconds[s]:", "if alone > region_seconds[s]:",
           ("kernorch/schedule/regions_test.py",)),
    Mutant("the per-region rProgram leaves a replaced region's rTask numbers as they were",
           "kernorch/schedule/regions.py", "return RProgram(program.veus, program.units, _renumbered(segments))",
           "return RProgram(program.veus, program.units, tuple(segments))", ("kernorch/schedule/regions_test.py",)),
    Mutant("the profiler's check scales every element's error by a mask's -3.4e38", "kernorch/cost/verify.py",
           "magnitudes[magnitudes < SENTINEL]", "magnitudes[np.isfinite(magnitudes)]",
           ("kernorch/cost/verify_test.py",)),
    Mutant("the 1x1 convolution sums one input channel short", "kernorch/codegen/native/pointwise_conv.py",
           'f"    for (int k = 0; k < {in_channels}; k++) {{",', 'f"    for (int k = 1; k < {in_channels}; k++) {{",',
           (POINTWISE,)),
    Mutant("the 1x1 convolution's epilogue skips the last pixel of a run", "kernorch/codegen/native/pointwise_conv.py",
           '"        for (p = p0; p < p1; p++) {",', '"        for (p = p0; p < p1 - 1; p++) {",', (POINTWISE,)),
    Mutant("the 1x1 convolution's last register block of a run takes ROWS pixels past the run",
           "kernorch/codegen/native/pointwise_conv.py",
           'blocks(f"p + {name}_ROWS <= p1", f"{name}_ROWS")', 'blocks("p < p1", f"{name}_ROWS")', (POINTWISE,)),
    Mutant("a call's input check takes any array whose dtype has the expected name (a big-endian >f4 too)",
           "kernorch/runtime/reference.py", "array.dtype == _native_dtype(expected.dtype)",
           "array.dtype.name == expected.dtype", ("kernorch/runtime/inputs_test.py",)),
    Mutant("the 1x1 convolution's epilogue reads a residual at the transposed pixel",
           "kernorch/codegen/native/pointwise_conv.py", 'f"            const long y = p / {width}, x = p % {width};",',
           'f"            const long x = p / {width}, y = p % {width};",', (POINTWISE,)),
    Mutant("sum-of-convs puts every kernel at the merged window's corner, not where its taps read",
           "kernorch/rewrite/rules/branches.py", "*(slice(o, o + k) for o, k in", "*(slice(0, k) for o, k in",
           ("kernorch/rewrite/rules/branches_test.py",)),
    Mutant("sum-of-convs merges windows that neither kernel spans (zero-weight taps)",
           "kernorch/rewrite/rules/branches.py", "    if all(k != window for k in kernels):",
           "    if False:", ("kernorch/rewrite/rules/branches_test.py",)),
    Mutant("identity-into-conv adds the identity at the window's first tap, not the centre one",
           "kernorch/rewrite/rules/branches.py", "taps = tuple(pads[a] for a in range(spatial))",
           "taps = tuple(0 for a in range(spatial))", ("kernorch/rewrite/rules/branches_test.py",)),
    Mutant("identity-into-conv ignores the identity's shift t",
           "kernorch/rewrite/rules/branches.py", "            value, shift = found[0]",
           "            value = found[0][0]", ("kernorch/rewrite/rules/branches_test.py",)),
    Mutant("channel-scale-into-conv moves a gate onto a padded conv's kernel",
           "kernorch/rewrite/rules/linear.py", 'node.attr("group") != 1 or any(node.attr("pads")) or',
           'node.attr("group") != 1 or', ("kernorch/rewrite/rules/linear_test.py",)),
    Mutant("channel-scale-into-conv puts the gate on the kernel's output-channel axis",
           "kernorch/rewrite/rules/linear.py", "per_channel = (1, channels, *(1,) * (weight.ndim - 2))",
           "per_channel = (channels, 1, *(1,) * (weight.ndim - 2))", ("kernorch/rewrite/rules/linear_test.py",)),
    Mutant("oneDNN repacks run-time convolution weights once, at create, not on every run",
           "kernorch/codegen/library/onednn.py",
           "    for i, (_, tensor, packed) in enumerate(memories):\n        if i in per_run:",
           "    for i, (_, tensor, packed) in enumerate(memories):\n        if i in per_run and i != 1:",
           ("kernorch/codegen/library/onednn_test.py",)),
    Mutant("kernorch's own kernels take weights computed at run time (packed once, at create)",
           "kernorch/codegen/backends/library_calls.py", "if not call.weights.constant and not self.runtime_weights:",
           "if False:", ("kernorch/codegen/native/direct_conv_test.py",)),
    Mutant("the few-channel conv refuses wide rows even with a transcendental post-op",
           "kernorch/codegen/native/few_channel_conv.py",
           "if call.dst.dims[3] > MAX_OUTPUT_WIDTH and not slow_in_onednn(call):",
           "if call.dst.dims[3] > MAX_OUTPUT_WIDTH:", ("kernorch/codegen/native/few_channel_conv_test.py",)),
    Mutant("the bench times a slice right after the cool-down pause, without its warm-up runs",
           "kernorch/tools/bench.py", "        while time.perf_counter() < warm_until:\n            run()\n",
           "", ("tests/test_bench.py",)),
    Mutant("sum-of-convs merges convs of different inputs",
           "kernorch/rewrite/rules/branches.py", "if first.inputs[0] != second.inputs[0] or any(",
           "if any(", ("kernorch/rewrite/rules/branches_test.py",)),
    Mutant("the partition may cut an attention between its product and the division by the row sum",
           "kernorch/orchestrate/subgraph.py", "return divisions[0] if len(divisions) == 1 else second",
           "return second", ("kernorch/orchestrate/subgraph_test.py",)),
    Mutant("the breakdown reads a linear kernel against the lower of its two roofs",
           "kernorch/tools/breakdown.py", "max(compute, memory) / seconds", "min(compute, memory) / seconds",
           ("kernorch/tools/breakdown_test.py",)),
    Mutant("the Winograd conv takes transformed filters past a core's L2 (5x slower than oneDNN on 7x7 maps)",
           "kernorch/codegen/native/winograd_conv.py", "MAX_TRANSFORMED_BYTES = 1 << 20",
           "MAX_TRANSFORMED_BYTES = 1 << 30",
           ("kernorch/codegen/native/winograd_conv_test.py",)),
    Mutant("the streaming product packs only the taps every row reads (not those any row reads)",
           "kernorch/codegen/native/streaming_product.py", "if any(offset >= 0 for offset in offsets):",
           "if all(offset >= 0 for offset in offsets):", (STREAMING,)),
    Mutant("the streaming product's register block starts every block at the first row",
           "kernorch/codegen/native/streaming_product.py", "const long at = {name}_src[t][first + r];",
           "const long at = {name}_src[t][r];", (STREAMING,)),
    Mutant("the streaming product's short last chunk writes a whole chunk of channels",
           "kernorch/codegen/native/streaming_product.py",
           "c1 = c0 + {name}_CHUNK < {outputs} ? c0 + {name}_CHUNK : {outputs};", "c1 = c0 + {name}_CHUNK;",
           (STREAMING, FEW_CHANNEL)),
    Mutant("the streaming product's padded taps read the source's first row, not zeros",
           "kernorch/codegen/native/streaming_product.py", "+ r] = at < 0 ? {name}_zeros : src + at;",
           "+ r] = at < 0 ? src : src + at;", (STREAMING,)),
    Mutant("the few-channel conv takes a run that crosses the right border as if inside",
           "kernorch/codegen/native/few_channel_conv.py", "else if (at_x >= 0 && at_x + {kernel_w} <= {width}) ",
           "else if (at_x >= 0 && at_x + {kernel_w} <= {width} + 1) ", (FEW_CHANNEL,)),
    Mutant("the few-channel conv's border copy shifts its pixels by one",
           "kernorch/codegen/native/few_channel_conv.py", "(at_x + kx) * {src_x}L + c] : 0.0f;",
           "(at_x + kx - 1) * {src_x}L + c] : 0.0f;", (FEW_CHANNEL,)),
    Mutant("the few-channel conv's tap-by-tap rows ignore the dilation along x",
           "kernorch/codegen/native/few_channel_conv.py", "+ {name}_kx[t] * {dilate_x};", "+ {name}_kx[t];",
           (FEW_CHANNEL,)),
    Mutant("index-set splitting gives up on a concat of more than eight maps",
           "kernorch/codegen/loops/splitting.py", "MAX_PIECES = 64", "MAX_PIECES = 8",
           ("kernorch/codegen/loops/splitting_test.py",)),
    Mutant("a select's lower branch is simplified as if its variable stopped one short of the threshold",
           "kernorch/codegen/loops/indexing.py", "{**ranges, var: threshold})", "{**ranges, var: threshold - 1})",
           ("kernorch/codegen/loops/indexing_test.py",)),
    Mutant("a select's upper branch renames its variable back off by one",
           "kernorch/codegen/loops/indexing.py", '("lit", -threshold)))', '("lit", 1 - threshold)))',
           ("kernorch/codegen/loops/indexing_test.py",)),
    Mutant("a factor split lets the low part reach the factor",
           "kernorch/codegen/loops/indexing.py", "bounds[1] >= factor:", "bounds[1] > factor:",
           ("kernorch/codegen/loops/indexing_test.py",)),
    Mutant("the oneDNN probe asks about matmuls only (a plain-layout conv with a residual goes to ref:any)",
           "kernorch/codegen/library/onednn.py",
           'if call.op not in ("matmul", "convolution") or not any(operand is not None',
           'if call.op not in ("matmul",) or not any(operand is not None',
           ("kernorch/codegen/library/onednn_test.py",)),
    Mutant("a tap's range along a reversed axis ends one column short",
           "kernorch/codegen/gir/reductions.py", "to_tree((terms, constant + 1), ranges), -c))",
           "to_tree((terms, constant), ranges), -c))", (REDUCTIONS,)),
    Mutant("an NCHW window's taps start at column 0 whatever their lower bound",
           "kernorch/codegen/c/loops.py", "if (ko_b {keep} {end}) {end} = ko_b;",
           "if (ko_b {keep} {end} && {int(not bound.lower)}) {end} = ko_b;", (REDUCTIONS,)),
    Mutant("the ceiling division rounds a positive quotient down",
           "kernorch/codegen/c/prelude.py", "return a > 0 ? (a + b - 1) / b : -((-a) / b); }",
           "return a > 0 ? a / b : -((-a) / b); }", (REDUCTIONS,)),
    Mutant("a reshape group's later coordinates lose their remainder",
           "kernorch/codegen/loops/description.py", "div(flat, stride) if k == 0 else mod(div(flat, stride), size)",
           "div(flat, stride)", ("kernorch/codegen/loops/reshape_test.py",)),
    Mutant("a clamped linear pair weighs its position 1 and 0 (an inf there becomes NaN)",
           "kernorch/ir/reference_kernels.py", "weights[taps[:, 0] == taps[:, 1]] = 0.5",
           "weights[taps[:, 0] == taps[:, 1]] = weights[taps[:, 0] == taps[:, 1]]", (RESIZE_TAPS,)),
    Mutant("align_corners divides by a length off the output size by float32 rounding (grid points move a tap)",
           "kernorch/ir/reference_kernels.py", "            length = out_size\n", "            length = length\n",
           (RESIZE_TAPS,)),
    Mutant("an upsampling's borders read the pattern's weights", "kernorch/codegen/loops/description.py",
           'position = ("sel", border, add(in_border, lit(weights.size)), position)', "pass", (RESIZE_TAPS,)),
    Mutant("the BLP leaves out the primitive covers (a weak relaxation: same optima, slow proofs)",
           "kernorch/orchestrate/blp.py", "        add_row(1.0, infinity, entries)\n    # A chosen kernel's",
           "        pass\n    # A chosen kernel's", (BLP,)),
    Mutant("a primitive cover asks for two kernels computing it (cuts off optimal plans)",
           "kernorch/orchestrate/blp.py", "        add_row(1.0, infinity, entries)\n    # A chosen kernel's",
           "        add_row(2.0, infinity, entries)\n    # A chosen kernel's", (BLP,)),
    Mutant("the covers' walk goes past values available before the subgraph",
           "kernorch/orchestrate/blp.py", "if value in available or value not in producer or",
           "if value not in producer or", (BLP,)),
)  # fmt: skip


def run_mutant(mutant: Mutant, timeout: float) -> tuple[str, float]:
    path = ROOT / mutant.file
    source = path.read_text()
    if source.count(mutant.original) != 1:
        return f"stale ({source.count(mutant.original)} matches)", 0.0
    started = time.monotonic()
    try:
        path.write_text(source.replace(mutant.original, mutant.mutated))
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests],
                              cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip
        verdict = "killed" if done.returncode != 0 else "SURVIVED"
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
    chosen = [m for m in MUTANTS if args.filter in m.name]
    print("| # | mutant | file | verdict | seconds | tests |\n|---|---|---|---|---|---|", flush=True)
    survived = 0
    for index, mutant in enumerate(chosen, 1):
        verdict, seconds = run_mutant(mutant, args.timeout)
        survived += verdict != "killed" and not verdict.startswith("killed")
        tests = ", ".join(t.split("::")[-1].removesuffix(".py").split("/")[-1] for t in mutant.tests)
        print(f"| {index} | {mutant.name} | {mutant.file} | {verdict} | {seconds:.0f} | {tests} |", flush=True)
    print(f"\n{len(chosen) - survived} of {len(chosen)} mutants killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
