from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_MODELS = Path(os.environ.get("KERNORCH_MODELS", Path(__file__).resolve().parents[2] / "shared" / "models"))


def shared_models() -> list[Path]:
    models = sorted(SHARED_MODELS.glob("*.onnx"))
    if not models and os.environ.get("CI"):
        raise RuntimeError(f"CI run without the shared models at {SHARED_MODELS}")
    return models


@pytest.fixture
def tmp_model_dir(tmp_path: Path) -> Path:
    return tmp_path
