"""A sequence-first LSTM language model, as in PyTorch's word_language_model example: the
corpus is cut into (T, B) batches by hand (no DataLoader), the hidden state is carried over
and detached, and the whole model is saved with torch.save every epoch and loaded back at
the end to evaluate it."""

from __future__ import annotations

import tempfile

import torch
from torch import nn

from common import maybe_attach, setup

VOCAB, WIDTH, BPTT, BATCH = 30, 24, 12, 8


class RNNModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(VOCAB, WIDTH)
        self.rnn = nn.LSTM(WIDTH, WIDTH, 2)  # batch_first=False: (T, B, C)
        self.decoder = nn.Linear(WIDTH, VOCAB)

    def forward(self, x: torch.Tensor, hidden: tuple) -> tuple[torch.Tensor, tuple]:
        out, hidden = self.rnn(self.encoder(x), hidden)
        return self.decoder(out).view(-1, VOCAB), hidden


def main() -> None:
    setup()
    stream = (torch.arange(6000) * 7 % VOCAB + torch.randint(0, 2, (6000,))) % VOCAB
    data = stream[: len(stream) // BATCH * BATCH].view(BATCH, -1).t().contiguous()  # (T, B)
    model = RNNModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    maybe_attach(model, optimizer, name="lstm_lm")
    criterion = nn.CrossEntropyLoss()
    with tempfile.TemporaryDirectory() as directory:
        for epoch in range(2):
            hidden = (torch.zeros(2, BATCH, WIDTH), torch.zeros(2, BATCH, WIDTH))
            for i, start in enumerate(range(0, 40 * BPTT, BPTT)):
                x, y = data[start : start + BPTT], data[start + 1 : start + 1 + BPTT]
                hidden = tuple(h.detach() for h in hidden)
                output, hidden = model(x, hidden)
                loss = criterion(output, y.reshape(-1))
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
                optimizer.step()
                if i % 10 == 0:
                    print(f"epoch {epoch} batch {i}: loss {loss.item():.4f}")
            with open(f"{directory}/model.pt", "wb") as f:
                torch.save(model, f)  # the best model so far, whole
        with open(f"{directory}/model.pt", "rb") as f:
            best = torch.load(f, weights_only=False)
    hidden = (torch.zeros(2, BATCH, WIDTH), torch.zeros(2, BATCH, WIDTH))
    with torch.no_grad():
        output, _ = best(data[:BPTT], hidden)
    test_loss = criterion(output, data[1 : BPTT + 1].reshape(-1)).item()
    print(f"loaded {type(best).__name__}: test loss {test_loss:.4f}")


if __name__ == "__main__":
    main()
