"""Import your own PyTorch model and plan its partitioning on a heterogeneous array.

Needs the optional extra: ``pip install -e ".[torch]"`` (torch==2.13.0, CPU build).

    python examples/import_torch_model.py                  # prints the plan
    python examples/import_torch_model.py --plot plan.png  # and draws it

The same model can be planned from the command line through a factory function that returns
``(module, input_shape)``:

    parplan plan --model examples/import_torch_model.py:build --array a100:4,h100:4 --batch 8
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from parplan.costmodel.evaluate import evaluate
from parplan.costmodel.hardware import parse_array
from parplan.costmodel.problem import Problem
from parplan.models.importers import from_torch
from parplan.reporting.report import plan_report
from parplan.solvers.planners import make_plan


class Block(nn.Module):
    """A pre-LN transformer block: fused qkv, scaled dot-product attention, GELU MLP."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyLM(nn.Module):
    """A small GPT-style language model (the LM head shares the token embedding)."""

    def __init__(
        self,
        vocab: int = 32000,
        hidden: int = 1024,
        heads: int = 16,
        layers: int = 4,
        seq: int = 512,
    ) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, hidden), nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.size(1), device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build() -> tuple[nn.Module, tuple[int, ...]]:
    """Factory for ``parplan plan --model examples/import_torch_model.py:build``."""
    return TinyLM(), (512,)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--array", default="a100:4,h100:4", help="accelerator array (default a100:4,h100:4)"
    )
    parser.add_argument(
        "--batch", type=int, default=8, help="global batch in sequences (default 8)"
    )
    parser.add_argument("--plot", default=None, metavar="PNG", help="also draw the plan")
    args = parser.parse_args()

    model, input_shape = build()
    graph = from_torch(model, input_shape, name="tiny-lm")  # token ids: (seq,) per sample
    torch_params = sum(p.numel() for p in model.parameters())
    print(
        f"imported {graph.name}: {len(graph.layers)} layers, {len(graph.weighted_layers())} weighted, "
        f"{graph.parameter_count():,} parameters (torch counts {torch_params:,})\n"
    )

    problem = Problem(graph, parse_array(args.array), batch=args.batch)
    plan = make_plan(problem, "accpar")
    report = plan_report(
        problem, plan, evaluate(problem, plan), evaluate(problem, make_plan(problem, "data"))
    )
    print(report.text())
    if args.plot:
        from parplan.reporting.plot import plot_plan

        print(f"\nwrote {plot_plan(report, args.plot)}")


if __name__ == "__main__":
    main()
