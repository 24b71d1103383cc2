"""Developer tools run on demand (`make fuzz`, `make mutate`): they drive the CLI and the test suite."""
