"""Fission rule registry and the context a rule sees.

A rule is a small function registered for one op type of a domain (ONNX's by default; onnxruntime's
`com.microsoft` for the contrib operators its tools write). It reads attributes through the context
(every attribute present on the node must be read, otherwise the node is refused — so an attribute a
rule does not know can never be silently ignored), emits primitives, and returns the value names of
the node's outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import onnx

from kernorch.errors import UnsupportedOperator
from kernorch.ir.builder import PrimitiveBuilder
from kernorch.ir.types import TensorType


class RuleContext:
    def __init__(self, node: onnx.NodeProto, inputs: list[str | None], opset: int,
                 builder: PrimitiveBuilder) -> None:  # fmt: skip
        self.node = node
        self.inputs = inputs
        self.opset = opset
        self.builder = builder
        self.read_attributes: set[str] = set()
        self._attributes = {a.name: a for a in node.attribute}

    # -------------------------------------------------------------------- refusing
    @property
    def op(self) -> str:
        return self.node.op_type

    def refuse(self, reason: str, attribute: str | None = None) -> NoReturn:
        raise UnsupportedOperator(self.op, self.node.name or "<unnamed>", reason, attribute)

    # -------------------------------------------------------------------- attributes
    def attr(self, name: str, default: Any = None) -> Any:
        self.read_attributes.add(name)
        if name not in self._attributes:
            return default
        attribute = self._attributes[name]
        if attribute.ref_attr_name:
            self.refuse("attribute references (functions) are not supported", name)
        value = onnx.helper.get_attribute_value(attribute)
        if isinstance(value, bytes):
            return value.decode()
        if isinstance(value, list):
            return [v.decode() if isinstance(v, bytes) else v for v in value]
        return value

    def has_attr(self, name: str) -> bool:
        return name in self._attributes

    def allow(self, name: str, *allowed: Any, default: Any = None) -> Any:
        """Read an attribute that kernorch supports only for some values; refuse any other."""
        value = self.attr(name, default)
        if value not in allowed:
            self.refuse(f"value {value!r} is not supported (supported: {', '.join(map(repr, allowed))})", name)
        return value

    def unread_attributes(self) -> list[str]:
        return [name for name in self._attributes if name not in self.read_attributes]

    # -------------------------------------------------------------------- inputs
    def has_input(self, index: int) -> bool:
        return index < len(self.inputs) and self.inputs[index] is not None

    def input(self, index: int) -> str:
        value = self.inputs[index] if index < len(self.inputs) else None
        if value is None:
            self.refuse(f"input {index} is required")
        return value

    def type(self, index: int) -> TensorType:
        return self.builder.type_of(self.input(index))

    def const(self, index: int, what: str) -> np.ndarray:
        """The value of an input that must be known at compile time (shapes, axes, pads...)."""
        value = self.builder.constant_value(self.input(index))
        if value is None:
            self.refuse(f"{what} (input {index}) must be a constant for static-shape compilation")
        return value

    def optional_const(self, index: int, what: str) -> np.ndarray | None:
        return self.const(index, what) if self.has_input(index) else None

    def normalize_axis(self, axis: int, rank: int, what: str = "axis") -> int:
        if not -rank <= axis < max(rank, 1):
            self.refuse(f"{what} {axis} out of range for rank {rank}", what)
        return axis % rank if rank else 0

    # -------------------------------------------------------------------- emitting
    def apply(self, op_type: str, *inputs: str | None, at_opset: int | None = None,
              **attributes: Any) -> list[str]:  # fmt: skip
        """The outputs of ONNX operator `op_type` on these values, as its own rule fissions it (at this context's
        opset unless `at_opset`): a quantized operator's float computation is its float operator's (same checks,
        same refusals, given in this node's name). Every attribute given must be one the rule reads."""
        node = onnx.helper.make_node(op_type, [value or "" for value in inputs], [f"{self.node.name}.{op_type}"],
                                     name=self.node.name, **attributes)  # fmt: skip
        opset = self.opset if at_opset is None else at_opset
        context = RuleContext(node, list(inputs), opset, self.builder)
        try:
            outputs = list(find_rule("", op_type, opset, node.name).fn(context))
            unread = context.unread_attributes()
            if unread:
                context.refuse("attribute not supported by kernorch's rule", unread[0])
        except UnsupportedOperator as refusal:
            self.refuse(f"its {op_type}: {refusal.reason}", refusal.attribute)
        return outputs

    def emit(self, prim: str, *inputs: str, **attrs: Any) -> str:
        (output,) = self.builder.emit(prim, inputs, attrs)
        return output

    def emit_multi(self, prim: str, inputs: Sequence[str], **attrs: Any) -> list[str]:
        return self.builder.emit(prim, inputs, attrs)

    def scalar(self, value: float | int | bool, dtype: str) -> str:
        return self.builder.constant(np.array(value, dtype=dtype), hint="scalar")

    def constant(self, array: np.ndarray, hint: str = "const") -> str:
        return self.builder.constant(array, hint=hint)


RuleFn = Callable[[RuleContext], Sequence[str]]


@dataclass(frozen=True)
class FissionRule:
    op_type: str
    fn: RuleFn
    static_inputs: tuple[int, ...]  # inputs that must be compile-time constants
    min_opset: int  # of the ONNX domain


# domain ("" for ONNX's, which "ai.onnx" also names) -> op type -> rule
DOMAIN_RULES: dict[str, dict[str, FissionRule]] = {"": {}, "com.microsoft": {}}
FISSION_RULES = DOMAIN_RULES[""]  # ONNX's operators


def rule(*op_types: str, static_inputs: tuple[int, ...] = (), min_opset: int = 1,
         domain: str = "") -> Callable[[RuleFn], RuleFn]:  # fmt: skip
    """Register a fission rule for one or more op types of `domain` (default: ONNX's)."""
    rules = DOMAIN_RULES[domain]

    def register(fn: RuleFn) -> RuleFn:
        for op_type in op_types:
            if op_type in rules:
                raise ValueError(f"two fission rules for {domain or 'ai.onnx'}.{op_type}")
            rules[op_type] = FissionRule(op_type, fn, static_inputs, min_opset)
        return fn

    return register


def find_rule(domain: str, op_type: str, opset: int, node_name: str) -> FissionRule:
    """The rule for a node of `op_type` in `domain` at the model's ONNX `opset`, or UnsupportedOperator saying
    why there is none."""
    rules = DOMAIN_RULES.get("" if domain == "ai.onnx" else domain)
    if rules is None:
        raise UnsupportedOperator(op_type, node_name, f"operators of domain '{domain}' are not supported")
    found = rules.get(op_type)
    if found is None:
        raise UnsupportedOperator(op_type, node_name, "no fission rule for this operator"
                                  + (f" of domain '{domain}'" if domain not in ("", "ai.onnx") else ""))  # fmt: skip
    if opset < found.min_opset:
        raise UnsupportedOperator(op_type, node_name, f"opset {opset} < {found.min_opset}")
    return found
