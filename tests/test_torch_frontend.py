"""PyTorch front end: kernorch.compile(nn.Module, example_inputs=...) and torch.compile(backend="kernorch")
match eager PyTorch; a graph kernorch cannot take runs eagerly with the reason on the kernorch.torch logger."""

from __future__ import annotations

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

import kernorch  # noqa: E402  (after torch: registers the backend)
from kernorch.errors import KernorchError  # noqa: E402


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 8, 3, stride=2, padding=1)
        self.head = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.norm(self.conv1(x)))
        y = torch.nn.functional.silu(self.conv2(y))
        return self.head(y.mean(dim=(2, 3)))


class Block(torch.nn.Module):
    """A pre-norm transformer block written out (nn.TransformerEncoderLayer under no_grad dispatches to one fused
    ATen kernel that the ONNX exporter cannot translate: see the eager-fallback test)."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(batch, seq, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.mlp(self.norm2(x))


def _relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).abs().max() / expected.abs().max())


@pytest.fixture(scope="module")
def modules() -> dict[str, tuple[torch.nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    conv = ConvNet().eval()
    with torch.no_grad():  # non-trivial batch-norm statistics
        conv.norm.running_mean.uniform_(-0.5, 0.5)
        conv.norm.running_var.uniform_(0.5, 2.0)
    return {"conv": (conv, torch.randn(2, 3, 16, 16)), "transformer": (Block().eval(), torch.randn(2, 10, 32)),
            "torch-encoder-layer": (torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval(),
                                    torch.randn(2, 10, 32))}


@pytest.mark.parametrize("name", ["conv", "transformer"])
def test_torch_compile_backend_matches_eager(name: str, modules: dict, caplog: pytest.LogCaptureFixture) -> None:
    module, x = modules[name]
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="kernorch", options={"cost": "analytic"}, dynamic=False)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="kernorch.torch"):
        expected = module(x)
        actual = compiled(x)
        again = compiled(x + 1)  # the same compiled plan, new data
        expected_again = module(x + 1)
    assert any("kernorch compiled a graph" in r.message for r in caplog.records), "the plan did not run"
    assert not any("eagerly" in r.message for r in caplog.records)
    assert _relative(actual, expected) <= 1e-4
    assert _relative(again, expected_again) <= 1e-4


@pytest.mark.parametrize("name", ["conv", "transformer", "torch-encoder-layer"])
def test_compile_accepts_a_module(name: str, modules: dict) -> None:
    module, x = modules[name]
    plan = kernorch.compile(module, example_inputs=(x,), cost="analytic")
    with torch.no_grad():
        expected = module(x)
    actual = plan(x)  # tensors in, tensors out
    assert isinstance(actual, torch.Tensor) and _relative(actual, expected) <= 1e-4
    outputs = plan.run({plan.input_names[0]: x.numpy()})
    assert np.allclose(outputs[plan.output_names[0]], expected.numpy(), rtol=1e-4, atol=1e-5)


class WithDeterminant(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.det(torch.relu(x) + torch.eye(4)) * 2


def test_a_graph_kernorch_cannot_take_runs_eagerly_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    module = WithDeterminant()
    x = torch.randn(3, 4, 4)
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="kernorch", options={"cost": "analytic"}, dynamic=False)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kernorch.torch"):
        actual = compiled(x)
    assert torch.allclose(actual, module(x), rtol=1e-5)
    (record,) = [r for r in caplog.records if r.name == "kernorch.torch"]
    assert "runs this graph eagerly" in record.message and "Det" in record.message, record.message


def test_a_fused_aten_kernel_the_exporter_lacks_runs_eagerly(modules: dict, caplog: pytest.LogCaptureFixture) -> None:
    module, x = modules["torch-encoder-layer"]
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="kernorch", options={"cost": "analytic"}, dynamic=False)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kernorch.torch"):
        assert _relative(compiled(x), module(x)) <= 1e-6
    (record,) = [r for r in caplog.records if r.name == "kernorch.torch"]
    assert "No ONNX function found for" in record.message and "_transformer_encoder_layer_fwd" in record.message


def test_weights_become_constants_and_a_changed_weight_runs_eagerly(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(1)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 12, 12)
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="kernorch", options={"cost": "analytic"}, dynamic=False)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="kernorch.torch"):
        assert _relative(compiled(x), module(x)) <= 1e-4
        # Dynamo passes the 6 parameters and buffers as inputs: bound as constants, batch norm folds away
        assert any("(6 weights as constants)" in r.message for r in caplog.records)
        module[0].weight.add_(0.5)  # the plan holds the old weights: this call must not use it
        assert _relative(compiled(x), module(x)) <= 1e-6
    assert any("weights changed after compilation" in r.message for r in caplog.records)


def test_with_autograd_on_the_graph_runs_eagerly(caplog: pytest.LogCaptureFixture) -> None:
    module = torch.nn.Linear(4, 3)
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="kernorch", options={"cost": "analytic"}, dynamic=False)
    with caplog.at_level(logging.WARNING, logger="kernorch.torch"):
        y = compiled(torch.randn(2, 4))
    y.sum().backward()  # gradients flow: this ran eagerly
    assert module.weight.grad is not None
    assert any("compiles inference only" in r.message for r in caplog.records)


def _attention_block() -> torch.nn.Module:
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(16, 48)
            self.norm = torch.nn.LayerNorm(16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            attention = torch.softmax(q @ k.transpose(-1, -2) * 0.25, dim=-1)
            return self.norm(x + attention @ v)

    torch.manual_seed(3)
    return Block().eval()


def test_dynamic_shapes_run_through_kernorch_specialisations(caplog: pytest.LogCaptureFixture) -> None:
    """dynamic=True: Dynamo hands over one graph with symbolic batch and sequence sizes; each concrete shape gets
    its own kernorch plan (none runs eagerly), reused on the next call with that shape."""
    module = _attention_block()
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="kernorch", options={"cost": "analytic"}, dynamic=True)
    shapes = [(2, 5, 16), (3, 7, 16), (2, 5, 16)]
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="kernorch.torch"):
        for shape in shapes:
            x = torch.randn(shape)
            assert _relative(compiled(x), module(x)) <= 1e-4
    messages = [r.message for r in caplog.records]
    assert not any("eagerly" in m for m in messages), messages
    assert sum("specialises a dynamic-shape graph" in m for m in messages) == 2  # the repeated shape is reused
    assert sum("compiled a graph of" in m for m in messages) == 2


def test_automatic_dynamic_shapes_switch_to_specialisations(caplog: pytest.LogCaptureFixture) -> None:
    """Default torch.compile: the first shape is compiled static; a second size makes Dynamo recompile the graph
    with a symbolic size, which kernorch then specialises per shape instead of running it eagerly."""
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                 torch.nn.Linear(8 * 6 * 6, 5)).eval()  # fmt: skip
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="kernorch", options={"cost": "analytic"})
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="kernorch.torch"):
        for batch in (2, 3, 6):
            x = torch.randn(batch, 3, 8, 8)
            assert _relative(compiled(x), module(x)) <= 1e-4
    messages = [r.message for r in caplog.records]
    assert not any("eagerly" in m for m in messages), messages
    assert sum("specialises a dynamic-shape graph" in m for m in messages) == 2  # batches 3 and 6


def test_module_without_example_inputs_is_one_clear_error() -> None:
    with pytest.raises(KernorchError, match="example_inputs"):
        kernorch.compile(ConvNet())
