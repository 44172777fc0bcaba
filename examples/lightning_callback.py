"""Lightning with bsmon: one callback. Needs `pip install 'bsmon[lightning]'`.

    python examples/lightning_callback.py     # then `bsmon` in another terminal

`+` / `-` in the dashboard change the datamodule's `batch_size`; Lightning rebuilds the train
DataLoader at the end of the epoch and the next epoch runs at the new size (the dashboard
shows the change pending until then).
"""

from __future__ import annotations

import argparse

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bsmon.probes.integrations.lightning import BsmonCallback


class Regression(pl.LightningModule):
    def __init__(self, features: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _index: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss  # the callback shows it as the loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Data(pl.LightningDataModule):
    def __init__(self, batch_size: int = 32, samples: int = 4096, features: int = 32) -> None:
        super().__init__()
        self.batch_size = batch_size  # what bsmon changes; train_dataloader() must read it
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(samples, features, generator=generator)
        y = x @ torch.randn(features, 1, generator=generator)
        self.dataset = TensorDataset(x, y + 0.1 * torch.randn(samples, 1, generator=generator))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.dataset, batch_size=self.batch_size, shuffle=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps")
    args = parser.parse_args()

    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(
        max_steps=args.steps,
        accelerator="auto",
        devices=1,
        callbacks=[BsmonCallback(name="lightning-example")],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regression(), datamodule=Data())
    print(f"lightning-example: {trainer.global_step} steps")


if __name__ == "__main__":
    main()
