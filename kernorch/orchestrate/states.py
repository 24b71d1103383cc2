"""Execution states (Korch Definition 2): the downward-closed node sets of a subgraph."""

from __future__ import annotations

from dataclasses import dataclass

from kernorch.orchestrate.subgraph import Subgraph


@dataclass(frozen=True)
class StateEnumeration:
    states: list[int]  # bitmasks over the subgraph's local node indices
    capped: bool  # True when enumeration stopped at the cap (the subgraph must be split)


def enumerate_states(sub: Subgraph, cap: int) -> StateEnumeration:
    """Breadth-first from the empty state: add any node whose predecessors are all in the state."""
    seen = {0}
    frontier = [0]
    full = (1 << sub.size) - 1
    while frontier:
        next_frontier = []
        for state in frontier:
            missing = full & ~state
            while missing:
                low = missing & -missing
                node = low.bit_length() - 1
                missing ^= low
                if sub.pred_masks[node] & ~state == 0:
                    successor = state | low
                    if successor not in seen:
                        seen.add(successor)
                        next_frontier.append(successor)
                        if len(seen) > cap:
                            return StateEnumeration(sorted(seen, key=lambda s: (s.bit_count(), s)), True)
        frontier = next_frontier
    return StateEnumeration(sorted(seen, key=lambda s: (s.bit_count(), s)), False)
