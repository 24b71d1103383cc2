"""Export two decoders whose cache length is a symbolic dim, for the generation benchmark (bench/decode.py):

- gpt2_decoder: GPT-2's block (LayerNorm, multi-head attention, GELU MLP, learned positions, tied LM head);
- llama_decoder: Llama's block (RMSNorm, grouped-query attention with rotary embeddings, SwiGLU MLP).

Runs in the zoo's virtual environment (`make zoo` creates .zoo-venv), never in kernorch's:

    .zoo-venv/bin/python bench/dynamic/decoders.py OUT_DIR [--only NAME ...]

One file serves prefill and every decoding step: inputs `ids` [1, sequence] and the cache `past_keys`,
`past_values` [layers, 1, kv_heads, past, head_dim] (past may be 0); outputs `logits` [1, sequence, vocab] and
`present_keys`, `present_values` [layers, 1, kv_heads, past + sequence, head_dim]. Positions and the causal mask
are computed from the two lengths inside the model, as exported decoders do. Random weights (seeded), no
downloads; the sizes are a small model's (hidden 512), not a toy's.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from export import export_all  # bench/dynamic/export.py: this script's directory is on the path
from torch import nn

VOCAB = 8192
HIDDEN = 512
LAYERS = 6
HEADS = 8
MAX_POSITIONS = 1024


def _causal_mask(sequence: int, past: int, like: torch.Tensor) -> torch.Tensor:
    """0 where query i (at position past + i) may see key j, -inf where j is later: [sequence, past + sequence]."""
    rows = torch.arange(sequence, device=like.device).unsqueeze(1) + past
    columns = torch.arange(past + sequence, device=like.device).unsqueeze(0)
    return torch.where(columns > rows, torch.tensor(float("-inf")), torch.tensor(0.0)).to(like.dtype)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask
    return torch.softmax(scores, dim=-1) @ v


class Gpt2Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.qkv, self.out = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.up, self.down = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        batch, sequence, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(HIDDEN, dim=-1)
        q, k, v = (t.reshape(batch, sequence, HEADS, -1).transpose(1, 2) for t in (q, k, v))
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        mixed = _attend(q, k, v, mask).transpose(1, 2).reshape(batch, sequence, HIDDEN)
        x = x + self.out(mixed)
        x = x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x)), approximate="tanh"))
        return x, k, v


class Gpt2Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(MAX_POSITIONS, HIDDEN)
        self.blocks = nn.ModuleList(Gpt2Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(HIDDEN)

    def forward(self, ids: torch.Tensor, past_keys: torch.Tensor,
                past_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        sequence, past = ids.shape[1], past_keys.shape[3]
        x = self.tokens(ids) + self.positions(torch.arange(past, past + sequence).unsqueeze(0))
        mask = _causal_mask(sequence, past, x)
        keys, values = [], []
        for layer, block in enumerate(self.blocks):
            x, k, v = block(x, past_keys[layer], past_values[layer], mask)
            keys.append(k)
            values.append(v)
        logits = self.ln(x) @ self.tokens.weight.T
        return logits, torch.stack(keys), torch.stack(values)


LLAMA_KV_HEADS = 2
LLAMA_INTERMEDIATE = 1408


class RmsNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(HIDDEN) + 0.1 * torch.randn(HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class LlamaBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        head = HIDDEN // HEADS
        self.norm1, self.norm2 = RmsNorm(), RmsNorm()
        self.q = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.kv = nn.Linear(HIDDEN, 2 * LLAMA_KV_HEADS * head, bias=False)
        self.out = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.gate_up = nn.Linear(HIDDEN, 2 * LLAMA_INTERMEDIATE, bias=False)
        self.down = nn.Linear(LLAMA_INTERMEDIATE, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, mask: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        batch, sequence, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).reshape(batch, sequence, HEADS, -1).transpose(1, 2)
        k, v = self.kv(h).reshape(batch, sequence, 2 * LLAMA_KV_HEADS, -1).transpose(1, 2).chunk(2, dim=1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        group = HEADS // LLAMA_KV_HEADS  # each key/value head serves `group` query heads
        mixed = _attend(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), mask)
        x = x + self.out(mixed.transpose(1, 2).reshape(batch, sequence, HIDDEN))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(torch.nn.functional.silu(gate) * up), k, v


class LlamaDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(LlamaBlock() for _ in range(LAYERS))
        self.norm = RmsNorm()
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        head = HIDDEN // HEADS
        frequencies = 1.0 / (10000 ** (torch.arange(0, head, 2).float() / head))
        angles = torch.outer(torch.arange(MAX_POSITIONS).float(), frequencies)
        self.register_buffer("cos", torch.cat([angles.cos()] * 2, dim=-1), persistent=False)
        self.register_buffer("sin", torch.cat([angles.sin()] * 2, dim=-1), persistent=False)

    def forward(self, ids: torch.Tensor, past_keys: torch.Tensor,
                past_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        sequence, past = ids.shape[1], past_keys.shape[3]
        x = self.tokens(ids)
        mask = _causal_mask(sequence, past, x)
        cos, sin = self.cos[past:past + sequence], self.sin[past:past + sequence]
        keys, values = [], []
        for layer, block in enumerate(self.blocks):
            x, k, v = block(x, past_keys[layer], past_values[layer], mask, cos, sin)
            keys.append(k)
            values.append(v)
        return self.head(self.norm(x)), torch.stack(keys), torch.stack(values)


MODELS = {"gpt2_decoder": (Gpt2Decoder, HEADS), "llama_decoder": (LlamaDecoder, LLAMA_KV_HEADS)}


def export(name: str, target: Path) -> None:
    build, kv_heads = MODELS[name]
    torch.manual_seed(0)
    module = build().eval()
    ids = torch.randint(0, VOCAB, (1, 5))
    past = torch.randn(LAYERS, 1, kv_heads, 7, HIDDEN // HEADS)
    cache_axes = {3: "past"}
    with torch.no_grad():
        torch.onnx.export(module, (ids, past, past.clone()), str(target), opset_version=17, dynamo=False,
                          input_names=["ids", "past_keys", "past_values"],
                          output_names=["logits", "present_keys", "present_values"],
                          dynamic_axes={"ids": {1: "sequence"}, "past_keys": cache_axes, "past_values": cache_axes,
                                        "logits": {1: "sequence"}, "present_keys": {3: "total"},
                                        "present_values": {3: "total"}})  # fmt: skip


def main() -> int:
    return export_all(__doc__, list(MODELS), export)


if __name__ == "__main__":
    sys.exit(main())
