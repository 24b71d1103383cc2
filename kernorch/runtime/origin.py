"""What a plan was planned for, and the check that it is what a caller loads it for.

A plan's metadata records its origin (and plan.json's manifest hash covers it): the SHA-256 of the ONNX bytes it
was compiled from, the input shapes it was planned at, and the options that shaped it
(`kernorch.options.plan_shaping`). A plan valid in itself is still another model's plan, or another shape's: a
loader that knows what it wants a plan for — the specialisation cache (a model, a shape set, options), a saved
family (its model.onnx, the shape set each plan is filed under, its options), `kernorch.load(dir, model=...)` —
passes the origin it expects, and any difference is a refusal naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from kernorch.errors import KernorchError

ORIGIN_KEY = "origin"  # the metadata entry

Shapes = tuple[tuple[str, tuple[int, ...]], ...]  # input name -> shape, sorted by name (frontend.ShapeSet)


def model_digest(model: str | os.PathLike[str] | bytes | onnx.ModelProto) -> str:
    """The SHA-256 of the ONNX bytes a plan is compiled from: the file's bytes, the given bytes, or a proto's
    serialization (what a DynamicModel and its saved model.onnx hold)."""
    if isinstance(model, onnx.ModelProto):
        data = model.SerializeToString()
    elif isinstance(model, bytes):
        data = model
    else:
        try:
            data = Path(model).read_bytes()
        except OSError as error:
            raise KernorchError(f"cannot read the model {model}: {error.strerror or error}") from None
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class PlanOrigin:
    """A plan's origin, or (as an expectation) the parts of it a loader checks: None leaves that part unchecked."""

    model_sha256: str
    inputs: Shapes | None = None
    options: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        inputs = None if self.inputs is None else [[name, list(shape)] for name, shape in self.inputs]
        return {"model_sha256": self.model_sha256, "inputs": inputs, "options": self.options}

    @staticmethod
    def from_json(value: Any) -> PlanOrigin:
        """A recorded origin; anything not of its form is a ValueError."""
        if not isinstance(value, dict) or not isinstance(value.get("model_sha256"), str):
            raise ValueError("records no origin (the model, shapes and options it was planned for)")
        inputs = tuple(sorted((str(name), tuple(int(d) for d in shape)) for name, shape in value["inputs"]))
        options = value.get("options")
        if not isinstance(options, dict):
            raise ValueError("records no options")
        return PlanOrigin(value["model_sha256"], inputs, options)

    def mismatch(self, recorded: PlanOrigin) -> str | None:
        """None when `recorded` is what this expectation asks for, else what differs, in words."""
        if recorded.model_sha256 != self.model_sha256:
            return (f"planned for another model (sha256 {recorded.model_sha256[:12]}…, not "
                    f"{self.model_sha256[:12]}…)")  # fmt: skip
        if self.inputs is not None and recorded.inputs != self.inputs:
            return f"planned for the input shapes {_describe(recorded.inputs)}, not {_describe(self.inputs)}"
        if self.options is not None and _canonical(recorded.options) != _canonical(self.options):
            recorded_options, expected = recorded.options or {}, self.options
            differing = sorted(k for k in {*recorded_options, *expected}
                               if _canonical(recorded_options.get(k)) != _canonical(expected.get(k)))  # fmt: skip
            return f"planned with other options ({', '.join(differing[:4]) or 'their form'})"
        return None


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _describe(inputs: Shapes | None) -> str:
    return "[" + ", ".join(f"{n}={'x'.join(map(str, s)) or 'scalar'}" for n, s in inputs or ()) + "]"
