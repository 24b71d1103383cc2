"""The cost-model interface: what orchestrate, layout and precision price kernels against, declared in one place
with the default of every optional hook. It imports no codegen, so a stage that only prices kernels loads none.

Required of every cost model: `name`, and `cost(candidate)` — seconds to run the candidate once, `math.inf` when
no backend can generate it. The optional hooks, with their defaults in `CostModelBase` (a cost model subclasses
it and overrides what it has):

- `pricing()`: a block in which a graph's candidates are priced (a measuring model describes each once in it).
  Default: nothing around the block.
- `prepare(candidates)`: called with the candidates before their costs are asked (a measuring model times them
  in one batch, or queues them inside `measuring_together`). Default: nothing.
- `measuring_together()`: a block at whose end what was `prepare`d in it may be measured all at once (a measuring
  model's rounds then lie seconds apart); a cost asked inside the block is measured then. Default: nothing
  around the block.
- `screen`: None, or a callable saying why a candidate is left out before anything is measured (a performance
  model's verdict). Default None: nothing is screened.
- `rejection(candidate)`: why a candidate costs infinity (a backend's reason), or None. Default None.
- `measures`: whether the model times kernels on this machine; then `contended_in(kernels)` (how many are priced
  by a value that never got a quiet measurement) and the tuning counters (`measured`, `measured_remotely`,
  `foreign`, `from_database`) mean something. Default False, 0 and 0.
- `has_signatures`: whether `signature_of(candidate)` gives a key shared by candidates that run the same code on
  the same shapes (a transformer's layers), which in-plan costs are recorded under. Default False, None.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kernorch.ir.kernel import CandidateKernel

Screen = Callable[["CandidateKernel"], "str | None"]


class CostModel(Protocol):
    """What a stage may ask of a cost model (module doc): implemented by `CostModelBase`'s subclasses."""

    @property
    def name(self) -> str: ...

    def cost(self, candidate: CandidateKernel) -> float: ...

    def pricing(self) -> AbstractContextManager[None]: ...

    def prepare(self, candidates: list[CandidateKernel]) -> None: ...

    def measuring_together(self) -> AbstractContextManager[None]: ...

    @property
    def screen(self) -> Screen | None: ...

    def rejection(self, candidate: CandidateKernel) -> str | None: ...

    @property
    def measures(self) -> bool: ...

    def contended_in(self, kernels: Iterable[CandidateKernel]) -> int: ...

    def tuning_counts(self) -> dict[str, int]: ...

    @property
    def has_signatures(self) -> bool: ...

    def signature_of(self, candidate: CandidateKernel) -> str | None: ...


class CostModelBase:
    """The optional hooks' defaults (module doc). Subclasses define `name` and `cost`."""

    screen: Screen | None = None
    measures: bool = False
    has_signatures: bool = False
    # tuning counters of a measuring model: kernels timed this session, whose values came from the database, were
    # measured by this machine kind's Ray workers, or by workers of another kind (stored apart, not used)
    measured: int = 0
    from_database: int = 0
    measured_remotely: int = 0
    foreign: int = 0

    def pricing(self) -> AbstractContextManager[None]:
        return nullcontext()

    def prepare(self, candidates: list[CandidateKernel]) -> None:
        return None

    def measuring_together(self) -> AbstractContextManager[None]:
        return nullcontext()

    def rejection(self, candidate: CandidateKernel) -> str | None:
        return None

    def contended_in(self, kernels: Iterable[CandidateKernel]) -> int:
        return 0

    def tuning_counts(self) -> dict[str, int]:
        """The tuning counters by name."""
        return {"measured": self.measured, "measured_remotely": self.measured_remotely, "foreign": self.foreign,
                "from_database": self.from_database}  # fmt: skip

    def signature_of(self, candidate: CandidateKernel) -> str | None:
        return None
