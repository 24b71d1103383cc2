"""User-facing tools built on the pipeline: check, conformance, bench, explain's plan and schedule pictures and
kernel rooflines, demo models."""
