"""Codegen: turn planned kernels into something that runs (generated C, PyTorch calls, reference)."""
