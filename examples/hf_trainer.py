"""The Hugging Face Trainer with bsmon: one callback. Needs `pip install 'bsmon[hf]'`.

    python examples/hf_trainer.py     # then `bsmon` in another terminal

A tiny transformer classifier (randomly initialised, nothing downloaded) learns whether a
sequence of tokens holds more of one token than another. `+` in the dashboard doubles
`per_device_train_batch_size` from the next step on; `-` goes back down, but not below the
size the Trainer started with (docs/integrations.md says why).
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from bsmon.probes.integrations.hf import BsmonCallback

VOCAB, LENGTH = 32, 16


class Tokens(torch.utils.data.Dataset):
    """Random token sequences; the label says whether token 1 outnumbers token 2."""

    def __init__(self, samples: int = 4096) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(3, VOCAB, (samples, LENGTH), generator=generator)
        marks = torch.randint(0, 3, (samples, LENGTH), generator=generator)
        self.ids[marks == 1] = 1
        self.ids[marks == 2] = 2
        self.labels = ((self.ids == 1).sum(1) > (self.ids == 2).sum(1)).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.labels[index]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps")
    args = parser.parse_args()

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=LENGTH,
        num_labels=2,
    )
    with tempfile.TemporaryDirectory() as output:
        training = TrainingArguments(
            output_dir=output,
            max_steps=args.steps,
            per_device_train_batch_size=16,
            learning_rate=1e-3,
            logging_steps=50,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=BertForSequenceClassification(config),
            args=training,
            train_dataset=Tokens(),
            callbacks=[BsmonCallback(name="hf-example")],
        )
        result = trainer.train()
    print(f"hf-example: {result.global_step} steps, loss {result.training_loss:.4f}")


if __name__ == "__main__":
    main()
