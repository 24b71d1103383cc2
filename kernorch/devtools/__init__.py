"""Developer tools run on demand, driving the CLI and the test suite: `make mutate` (mutate.py: collects every test
module's mutants and checks its tests kill them), `make sanitize` (sanitize.py: the tests marked `sanitize` and
the shared models under ASan/UBSan), `make fuzz` (fuzz.py), `make soak` (soak.py: one model, many callers, long
runs), `make compile-check` (compile_candidates.py: every candidate kernel of a model compiled)."""
