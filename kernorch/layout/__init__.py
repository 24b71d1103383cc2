"""The layout stage (stage.py): which values are stored channels-last, decided for the whole graph at once by an
exact 0-1 program (assign.py) and written into the graph (materialize.py); layouts.py holds the axis orders,
modes.py which primitives have a layout mode."""

from kernorch.layout.assign import POLICIES
from kernorch.layout.stage import LayoutReport, choose_layouts

__all__ = ["POLICIES", "LayoutReport", "choose_layouts"]
