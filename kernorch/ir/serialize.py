"""A primitive graph as data: JSON-able structure plus its constants as NPZ bytes (never pickle).

Saved plans (runtime/artifact.py) and kernels sent to tuning workers (cost/remote.py) use this one format.
"""

from __future__ import annotations

import io
import zipfile
from typing import Any

import numpy as np

from kernorch.ir.graph import Graph, Node, freeze_attrs
from kernorch.ir.types import TensorType


def graph_to_json(graph: Graph) -> dict[str, Any]:
    """The graph's structure; constants are listed by name, their data goes to `constants_npz`."""
    return {
        "name": graph.name, "inputs": graph.inputs, "outputs": graph.outputs,
        "types": {n: [list(t.shape), t.dtype] for n, t in graph.types.items()},
        "constants": sorted(graph.constants),
        "nodes": [{"prim": n.prim, "inputs": list(n.inputs), "outputs": list(n.outputs),
                   "attrs": dict(n.attrs), "origin": n.origin} for n in graph.nodes],
    }  # fmt: skip


def constants_npz(graph: Graph) -> bytes:
    """The constants in `graph_to_json`'s order, as an NPZ archive (c0, c1, ...)."""
    buffer = io.BytesIO()
    arrays: dict[str, Any] = {f"c{i}": graph.constants[n] for i, n in enumerate(sorted(graph.constants))}
    np.savez(buffer, **arrays)
    return buffer.getvalue()


NPY_HEADER_BYTES = 65536  # an .npy header is a few dozen bytes; numpy refuses ones over 10 000 bytes


def check_archive_sizes(weights: bytes, expected: list[int]) -> None:
    """Refuse weights.npz unless it holds exactly c0.npy .. c{n-1}.npy, each no larger uncompressed than its
    declared type's bytes plus a header. Checked on the archive's directory before anything is decompressed:
    zipfile then stops every read at the size checked here, so a member that would inflate beyond the sizes the
    plan declares (a zip bomb) is refused, never inflated."""
    with zipfile.ZipFile(io.BytesIO(weights)) as archive:
        members = archive.infolist()
        names = [m.filename for m in members]
        if sorted(names) != sorted(f"c{i}.npy" for i in range(len(expected))):
            raise ValueError(f"weights.npz: holds {len(names)} arrays, the plan declares {len(expected)} constants")
        for member in members:
            limit = expected[int(member.filename[1:-4])] + NPY_HEADER_BYTES
            if member.file_size > limit:
                raise ValueError(f"weights.npz: {member.filename} inflates to {member.file_size} bytes, the plan "
                                 f"declares {limit - NPY_HEADER_BYTES}")  # fmt: skip


def graph_from_json(data: dict[str, Any], weights: bytes) -> Graph:
    """The inverse of graph_to_json + constants_npz; malformed data raises ValueError (or KeyError/TypeError).
    The types are read first: weights.npz is only opened to the sizes they declare (check_archive_sizes)."""
    types = {str(n): TensorType(tuple(int(d) for d in shape), str(dtype))
             for n, (shape, dtype) in data["types"].items()}  # fmt: skip
    names = [str(name) for name in data["constants"]]
    try:
        check_archive_sizes(weights, [types[name].nbytes for name in names])
        with np.load(io.BytesIO(weights), allow_pickle=False) as archive:
            constants = {name: archive[f"c{i}"] for i, name in enumerate(names)}
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise ValueError(f"weights.npz: {error}") from None
    graph = Graph(name=str(data["name"]), inputs=[str(v) for v in data["inputs"]],
                  outputs=[str(v) for v in data["outputs"]])  # fmt: skip
    graph.types = types
    graph.constants = constants
    graph.nodes = [Node(str(n["prim"]), tuple(str(v) for v in n["inputs"]), tuple(str(v) for v in n["outputs"]),
                        freeze_attrs(n["attrs"]), str(n["origin"])) for n in data["nodes"]]  # fmt: skip
    return graph
