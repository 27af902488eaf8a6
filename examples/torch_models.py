"""Two small PyTorch models for ``parplan export --out train.py`` (docs/interop.md, "A
training script"): a GPT written for tensor parallelism and a two-block ResNet.

    parplan export --model examples/torch_models.py:gpt --array cpu:4 --planner megatron1 --batch 8 --out train.py
    torchrun --nproc-per-node 4 train.py --check

The GPT's attention reshapes by ``-1`` heads, so a rank that holds some of the heads (q, k and v
split by their output features, torch's ``ColwiseParallel``) runs those heads only, as
Hugging Face's Llama and torchtitan's models do.
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """A pre-LN transformer block: separate q, k, v projections, causal attention, GELU MLP."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.o = nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, t, _ = x.shape
        y = self.ln1(x)
        q, k, v = (
            m(y).view(b, t, -1, self.head_dim).transpose(1, 2) for m in (self.q, self.k, self.v)
        )
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int = 64, hidden: int = 16, heads: int = 2, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class ResBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return F.relu(x + self.conv2(F.relu(self.conv1(x))))


class ResNet(nn.Module):
    def __init__(self, channels: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.layers = nn.Sequential(ResBlock(channels), ResBlock(channels))
        self.fc = nn.Linear(channels, classes)

    def forward(self, x):
        return self.fc(self.layers(F.relu(self.stem(x))).mean((2, 3)))


def gpt():
    """A 2-block GPT on 8-token sequences."""
    return GPT(), (8,)


def resnet():
    """A 2-block ResNet on 8 x 8 images."""
    return ResNet(), (3, 8, 8)
