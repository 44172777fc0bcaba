"""Lightning: a LightningModule with a validation loop after every epoch, on a DataLoader
whose epochs end in a short batch (100 samples in batches of 32: 32, 32, 32, 4)."""

from __future__ import annotations

import os
import warnings

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from common import setup

warnings.filterwarnings("ignore", ".*does not have many workers.*")


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple, _index: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch: tuple, _index: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class PrintLoss(pl.Callback):
    def on_train_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        print(f"epoch {trainer.current_epoch}: val_loss {trainer.callback_metrics['val_loss']:.4f}")


def main() -> None:
    setup()
    x = torch.randn(100, 6)
    y = x.sum(1, keepdim=True)
    train = DataLoader(TensorDataset(x, y), batch_size=32)
    val = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=32)
    callbacks: list[pl.Callback] = [PrintLoss()]
    if os.environ.get("CORPUS_ATTACH"):
        from bsmon.probes.integrations.lightning import BsmonCallback

        callbacks.append(BsmonCallback(name="lightning_job"))
    trainer = pl.Trainer(
        max_epochs=15,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )
    trainer.fit(Regression(), train, val)


if __name__ == "__main__":
    main()
