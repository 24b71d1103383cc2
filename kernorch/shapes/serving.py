"""Shape sets without a plan, served at once (the `new_shapes="serve"` policy of shapes/dynamic.py).

Planning, profiling and compiling a shape set takes seconds to minutes; a generate loop or a server sees a new
length on nearly every call and must not wait for that. Under this policy a call whose shape set has no plan
(and no exact padding to one) is answered at once by onnxruntime's session over the same model — shape-agnostic
kernels, the reference kernorch is checked against — and logged; a shape set called `HOT_CALLS` times is then
planned and compiled in one background thread (at a lower priority than the callers'), and its calls run on
kernorch's plan once it is ready. Shapes that never repeat (each step of a generation) are never planned.

A range's shape-generic plan (shapes/generic.py: kernorch's own kernels, sizes as run-time arguments) serves the
shapes inside it instead; this tier serves those outside every range, and `describe()` says which shape sets it
served. `HotShapes` also counts a range's shape sets, with a higher threshold (the generic plan is fast).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from kernorch.errors import InputMismatch, KernorchError
from kernorch.frontend import ShapeSet, describe_shapes

LOGGER = logging.getLogger("kernorch.shapes")
HOT_CALLS = 3  # calls of one shape set without a plan before it is planned in the background
# shape sets counted at once: a server that sees a new length on every call (each step of every generation) keeps
# the most recently called ones, so its memory stays bounded; a set evicted before it turned hot starts again at 1
MAX_COUNTED = 4096
BACKGROUND_NICENESS = 10  # the planner's thread (and the compilers it starts) yields to the callers' threads


def onnxruntime_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


class GenericServer:
    """onnxruntime's session over the model, made once (by `prepare`, else on its first call), run by any
    number of threads at once (onnxruntime's `run` is thread-safe)."""

    def __init__(self, model: bytes, threads: int, output_names: list[str]) -> None:
        self._model = model
        self._threads = threads
        self._output_names = output_names
        self._session: Any = None
        self._lock = threading.Lock()

    def prepare(self) -> None:
        with self._lock:
            if self._session is None:
                import onnxruntime

                options = onnxruntime.SessionOptions()
                options.intra_op_num_threads = self._threads
                options.inter_op_num_threads = 1
                try:
                    self._session = onnxruntime.InferenceSession(self._model, options,
                                                                 providers=["CPUExecutionProvider"])  # fmt: skip
                except Exception as error:  # onnxruntime's exceptions share no base class
                    raise KernorchError(f"onnxruntime cannot load the model to serve shapes without a plan: "
                                        f"{str(error).strip().splitlines()[0][:200]}") from None  # fmt: skip

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._session is None:
            self.prepare()
        try:
            results = self._session.run(self._output_names, dict(feeds))
        except Exception as error:  # a wrong dtype, a missing input: onnxruntime's message, one line
            raise InputMismatch(f"onnxruntime refused the call it serves: "
                                f"{str(error).strip().splitlines()[0][:200]}") from None  # fmt: skip
        return dict(zip(self._output_names, results, strict=True))


class HotShapes:
    """Counts the calls of each shape set served without a plan; at `HOT_CALLS` it is handed to `plan`, run by
    one background worker, one shape set at a time (a 2-core machine has no room for more)."""

    def __init__(self, plan: Callable[[ShapeSet], object], max_counted: int = MAX_COUNTED, hot_calls: int = HOT_CALLS,
                 served_by: str = "onnxruntime") -> None:  # fmt: skip
        self._plan = plan
        self._hot_calls = hot_calls  # calls after which a shape set is handed to `plan`
        self._served_by = served_by  # what runs a shape set until then (for the log)
        self._lock = threading.Lock()
        self._calls: OrderedDict[ShapeSet, int] = OrderedDict()  # least recently called first
        self._max_counted = max_counted
        self._totals = [0, 0]  # shape sets and calls served without a plan, evicted ones included
        self._queue: queue.Queue[ShapeSet] = queue.Queue()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._worker: threading.Thread | None = None

    @property
    def served(self) -> dict[ShapeSet, int]:
        """Calls served without a plan, by shape set (the MAX_COUNTED most recently called)."""
        with self._lock:
            return dict(self._calls)

    @property
    def totals(self) -> tuple[int, int]:
        """(shape sets, calls) served without a plan so far, those no longer counted included (a set evicted and
        called again counts again)."""
        with self._lock:
            return self._totals[0], self._totals[1]

    def called(self, shapes: ShapeSet, plannable: bool = True) -> None:
        """Count a call served without a plan (`plannable` False: one never to be planned, an empty tensor's)."""
        with self._lock:
            count = self._calls[shapes] = self._calls.get(shapes, 0) + 1
            self._calls.move_to_end(shapes)
            if len(self._calls) > self._max_counted:
                self._calls.popitem(last=False)
            self._totals[0] += count == 1
            self._totals[1] += 1
            if count == 1:
                LOGGER.info("kernorch: [%s] has no plan: served by %s%s", describe_shapes(shapes),
                            self._served_by, f" (planned after {self._hot_calls} calls)" if plannable else "")
            if count != self._hot_calls or not plannable:
                return
            self._pending += 1
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="kernorch-hot-shapes", daemon=True)
                self._worker.start()
        self._queue.put(shapes)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every shape set handed over so far is planned (or failed); True when none is left."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def _work(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICENESS)
        except (AttributeError, OSError):  # not Linux, or not allowed: plan at the callers' priority
            pass
        while True:
            shapes = self._queue.get()
            try:
                LOGGER.info("kernorch: [%s] called %d times: planning it in the background", describe_shapes(shapes),
                            self._hot_calls)  # fmt: skip
                self._plan(shapes)
            except Exception as error:  # noqa: BLE001 - onnxruntime keeps serving it; say why planning stopped
                LOGGER.warning("kernorch: planning [%s] in the background failed: %s", describe_shapes(shapes), error)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()
