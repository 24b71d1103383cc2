# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev

STAMP_BENCH := $(VENV)/.installed-bench
STAMP_DOT := $(VENV)/.installed-graphviz
STAMP_BROWSER := $(VENV)/.installed-chromium
# Debian packages: Graphviz draws plans (`kernorch explain --svg`), Chromium opens the HTML report in a test
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL = $(SUDO) apt-get install -y -q --no-install-recommends $(1) >/dev/null || \
	{ $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q --no-install-recommends $(1) >/dev/null; }

.PHONY: demo test test-slow bench lint typecheck clean mutate fuzz soak compile-check sanitize zoo torch-next gpu-verify gpu-carry

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch is an extra (pyproject): here pinned to the CPU build that installs from local disk, before anything
# else can pull a CUDA build.
$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[ort,torch,pictures]'
	touch $@

$(STAMP_DEV): pyproject.toml $(STAMP_RUN)
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q triton==3.9.0  # GPU plans: their Triton kernels run in its interpreter in the tests
	touch $@

$(STAMP_DOT): | $(BIN)/python
	command -v dot >/dev/null || $(call APT_INSTALL,graphviz)
	touch $@

$(STAMP_BROWSER): | $(BIN)/python
	command -v chromium >/dev/null || $(call APT_INSTALL,chromium)
	touch $@

$(STAMP_BENCH): pyproject.toml $(STAMP_RUN)
	$(BIN)/pip install -q -e '.[bench]'
	touch $@

# Every model in ../shared/models (override: make bench MODELS=dir); writes bench/results/DATE.{md,png,json} (BENCH_FLAGS=--resume keeps models already measured today)
MODELS ?= ../shared/models
bench: $(STAMP_BENCH)
	$(BIN)/python bench/run_all.py --models $(MODELS) --compare-layouts $(BENCH_FLAGS)

demo: $(STAMP_RUN) $(STAMP_DOT)
	$(BIN)/kernorch demo

# On demand: does the suite catch broken code? (a fixed list of mutants; prints which survive)
mutate: $(STAMP_DEV)
	$(BIN)/python -m kernorch.devtools.mutate

# On demand: 10 000 malformed ONNX inputs through `kernorch check`; prints the exit-code histogram
fuzz: $(STAMP_DEV)
	$(BIN)/python -m kernorch.devtools.fuzz --count 10000

# On demand (before a codegen change lands): every candidate kernel of the shared models compiled and run once
compile-check: $(STAMP_DEV)
	$(BIN)/python -m kernorch.devtools.compile_candidates --run $(MODELS)/*.onnx

# On demand: generated C and native kernels built with ASan + UBSan; random plans, semantics, node tests, models
# the shared models' quantized versions (onnxruntime's tool: static QDQ, dynamic, QOperator), written once
QUANTIZED ?= build/quantized
$(QUANTIZED)/.written: $(STAMP_DEV)
	$(BIN)/python bench/quantize.py $(MODELS)/*.onnx -o $(QUANTIZED) --kind all --keep-going
	touch $@

sanitize: $(STAMP_DEV) $(QUANTIZED)/.written
	$(BIN)/python -m kernorch.devtools.sanitize --models $(MODELS) --quantized $(QUANTIZED)

# On demand: the model zoo. Its exporters need torchvision/timm/transformers, which torch 2.13's CPU wheel cannot
# import: a venv of their own (about 6 GB), outside the project's. ZOO_FLAGS=--cost analytic for a quick pass;
# ZOO_SET=real ZOO_DIR=zoo-real for the families the small zoo lacks, at real input sizes (bench/zoo/export.py);
# ZOO_SET=korch ZOO_DIR=zoo-korch for Korch's YOLOX-Nano and YOLOv4 at 416x416 (bench/zoo/korch_models.py).
ZOO_VENV := .zoo-venv
ZOO_DIR ?= zoo
ZOO_SET ?= zoo
$(ZOO_VENV)/.installed:
	$(PYTHON) -m venv $(ZOO_VENV)
	$(ZOO_VENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1 timm==1.0.31 transformers==5.24.0 \
		onnx==1.23.2 onnxscript==0.7.2
	touch $@

zoo: $(ZOO_VENV)/.installed $(STAMP_BENCH)
	$(ZOO_VENV)/bin/python bench/zoo/export.py $(ZOO_DIR) --set $(ZOO_SET)
	$(BIN)/python bench/zoo/run.py $(ZOO_DIR) $(ZOO_FLAGS)

# On demand: the newest torch the `torch` extra allows (2.14), in a venv of its own, under the tests that use
# torch (the reference implementations through fission, the PyTorch front end, the torch.compile backend).
TORCH_NEXT_VENV := .torch-next-venv
$(TORCH_NEXT_VENV)/.installed:
	$(PYTHON) -m venv $(TORCH_NEXT_VENV)
	$(TORCH_NEXT_VENV)/bin/pip install -q torch==2.14.1
	$(TORCH_NEXT_VENV)/bin/pip install -q -e '.[ort,torch]' pytest hypothesis
	touch $@

torch-next: $(TORCH_NEXT_VENV)/.installed
	$(TORCH_NEXT_VENV)/bin/python -m pytest tests/test_torch_frontend.py tests/test_dependencies.py \
		kernorch/runtime/concurrency_test.py kernorch/fission/rules

# On demand: every distinct kernel of the analytic A100 plans of the shared models run alone in Triton's
# interpreter (library calls through torch on the CPU) against the reference (about 15 minutes).
gpu-verify: $(STAMP_DEV)
	$(BIN)/python -m kernorch.tools.gpu_verify $(MODELS)/*.onnx

# What bench/gpu.sh needs on a GPU machine (the device tool sends the repo, at most 64 MiB with what it carries, and
# not ../shared): highspy, the one dependency its image lacks (it has torch, triton, onnx, onnxruntime, numpy,
# tqdm), and copies of the models to run, GPU_MODELS (the four that fit: ~45 MB). Carry bench/gpu-wheels and
# bench/gpu-models (both ignored by git).
GPU_WHEELS := highspy==1.15.1
GPU_MODELS ?= segformer_b0 efficientvit_b0 candy shufflenet_v2
gpu-carry: $(STAMP_RUN)
	rm -rf bench/gpu-wheels bench/gpu-models && mkdir -p bench/gpu-models
	$(BIN)/pip download -q --only-binary=:all: --no-deps --python-version 3.12 --platform manylinux_2_28_x86_64 \
		--platform manylinux2014_x86_64 -d bench/gpu-wheels $(GPU_WHEELS)
	for m in $(GPU_MODELS); do cp $(MODELS)/$$m.onnx bench/gpu-models/; done
	du -sh bench/gpu-wheels bench/gpu-models

lint: $(STAMP_DEV)
	$(BIN)/ruff check kernorch tests

typecheck: $(STAMP_DEV)
	$(BIN)/mypy kernorch

# one pytest worker per core (pytest-xdist): 2 cores run the suite in ~340 s instead of ~540 s; then, alone, the
# few tests that assume a quiet machine (`serial`: Ray workers' measurements count only when undisturbed)
test: $(STAMP_DEV) $(STAMP_DOT) $(STAMP_BROWSER) lint typecheck
	$(BIN)/python -m pytest -n auto -m "not slow and not serial"
	$(BIN)/python -m pytest -m "serial and not slow"

# the few model-level tests too slow for `make test`'s 10 minutes (pyproject: the `slow` marker)
test-slow: $(STAMP_DEV)
	$(BIN)/python -m pytest -m slow

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# On demand: a day of serving in a minute — 8 threads, 100 000 calls of a model with symbolic dims at random
# shapes (padded, saved-and-reloaded and bf16 copies beside it), every output against onnxruntime; reports
# errors, the resident-memory slope, peak workspaces, file descriptors and threads (kernorch/devtools/soak.py)
soak: $(STAMP_DEV)
	$(BIN)/python -m kernorch.devtools.soak --calls 100000 --threads 8
