"""A GPT-style character model trained the way nanoGPT-like scripts train: batches cut from
one long tensor with get_batch (no DataLoader), a position embedding indexed with arange(T),
the token embedding tied to the head, an evaluation pass under no_grad, and the whole model
saved with torch.save."""

from __future__ import annotations

import argparse
import math
import tempfile

import torch
import torch.nn.functional as F
from torch import nn

from common import maybe_attach, setup


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, block: int, width: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(block, width)
        self.blocks = nn.ModuleList(Block(width, 4) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.wte.weight = self.head.weight  # weight tying

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--accumulate", type=int, default=1)
    args = parser.parse_args()
    setup()
    text = torch.tensor([math.floor(8 * (1 + math.sin(i / 3))) for i in range(4000)])
    text = (text + torch.randint(0, 3, text.shape)) % 20
    model = GPT(vocab=20, block=args.block)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    maybe_attach(model, optimizer, name="gpt")

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(text) - args.block - 1, (args.batch,))
        x = torch.stack([text[i : i + args.block] for i in ix])
        y = torch.stack([text[i + 1 : i + 1 + args.block] for i in ix])
        return x, y

    @torch.no_grad()
    def estimate_loss() -> float:
        model.eval()
        losses = [model(*get_batch()).item() for _ in range(5)]
        model.train()
        return sum(losses) / len(losses)

    for step in range(args.steps):
        if step % 40 == 0:
            print(f"step {step}: eval loss {estimate_loss():.4f}")
        for _ in range(args.accumulate):
            loss = model(*get_batch()) / args.accumulate
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item() * args.accumulate:.4f}")
    with tempfile.TemporaryDirectory() as directory:
        torch.save(model, f"{directory}/model.pt")  # the whole model, not only its state
        again = torch.load(f"{directory}/model.pt", weights_only=False)
    print("saved and loaded:", type(again).__name__, sum(p.numel() for p in again.parameters()))


if __name__ == "__main__":
    main()
