"""The IR every stage shares: types, the primitive graph and set, candidate kernels, plans, the builder."""
