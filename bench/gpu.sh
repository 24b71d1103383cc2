#!/usr/bin/env bash
# The GPU checks of issue 40 in one go, on a machine with a GPU and no package registry (the device tool's:
# Python 3.12 with torch, Triton, onnx, onnxruntime, numpy preinstalled). `make gpu-carry` here puts highspy's
# wheel in bench/gpu-wheels and copies of the models in bench/gpu-models (the tool sends the repo, not
# ../shared); carry both. This installs them and kernorch without dependencies, then runs bench/gpu.py: every
# model planned for the GPU present, checked against onnxruntime and timed against torch eager and torch.compile,
# within DEADLINE seconds (default 420). Results: $OUT (the device tool's output folder) or bench/results, as
# DATE-gpu.md and .json. Device call: run(command="bash bench/gpu.sh", carry=["bench/gpu-wheels",
# "bench/gpu-models"], timeout_s=540).
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS=${MODELS:-$( [ -d bench/gpu-models ] && echo bench/gpu-models || echo ../shared/models )}
DEADLINE=${DEADLINE:-420}
RESULTS=${OUT:-bench/results}
PYTHON=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if ls bench/gpu-wheels/*.whl >/dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-deps --no-index bench/gpu-wheels/*.whl
fi
"$PYTHON" -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null || export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" -c "import torch, triton, onnx, onnxruntime, highspy; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'triton', triton.__version__)"
# Korch's two detectors are built here from bench/zoo/korch_models.py (YOLOv4's 245 MB of weights would not fit
# the 64 MiB the device tool carries), into a folder of their own (never ../shared); torch's TorchScript exporter
# needs nothing the image lacks
DETECTORS=${DETECTORS:-bench/gpu-korch}
"$PYTHON" bench/zoo/export.py "$DETECTORS" --set korch || echo "gpu.sh: the korch detectors did not export; going on"
"$PYTHON" bench/gpu.py "$MODELS"/*.onnx $(ls "$DETECTORS"/*.onnx 2>/dev/null) --deadline "$DEADLINE" --out "$RESULTS/$(date +%F)-gpu"
