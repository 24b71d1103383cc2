"""GIR: memory-intensive kernels as graphs of computation and explicit data movement (PowerFusion §4-§5).

`graph.py` holds the IR, `lower.py` builds it from a kernel's loop description, `rules.py` rewrites it.
The cost stage's `gir_model.py` prices it (bytes per memory level at measured bandwidths, plus compute).
"""
