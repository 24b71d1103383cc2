"""User-facing tools built on the pipeline: check, conformance, demo models."""
