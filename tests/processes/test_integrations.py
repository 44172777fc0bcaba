"""The Lightning callback and the Hugging Face TrainerCallback on tiny models: steps, samples
and loss seen through the socket, and the batch size changed through the integration."""

from __future__ import annotations

import subprocess
import sys

import lightning.pytorch as pl
import pytest
import torch
import transformers
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

from bsmon.probes.integrations import hf, lightning
from bsmon.probes.maxbatch.recipe import RecipeError
from bsmon.probes.wire import protocol
from bsmon.probes.wire.client import JobConnection

from ..helpers import Patience
from ..watch import events_of, metrics_until

# -- Lightning -----------------------------------------------------------------------------------


class Data(pl.LightningDataModule):
    def __init__(self, batch_size: int | None = 8) -> None:
        super().__init__()
        if batch_size is not None:
            self.batch_size = batch_size
        generator = torch.Generator().manual_seed(0)
        self.dataset = torch.utils.data.TensorDataset(
            torch.randn(64, 4, generator=generator), torch.randn(64, 1, generator=generator)
        )

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        size = getattr(self, "batch_size", 8)
        return torch.utils.data.DataLoader(self.dataset, batch_size=size, shuffle=True)


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.seen: list[tuple[int, int]] = []  # (epoch, batch length) per training step

    def training_step(self, batch, _index):
        x, y = batch
        self.seen.append((self.current_epoch, len(x)))
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Watcher:
    """A person at the monitor: connected from the first step, reading everything the job
    sends; ``at(step)`` acts after that step."""

    def __init__(self, last_step: int) -> None:
        self.last_step = last_step
        self.conn: JobConnection | None = None
        self.messages: list[protocol.Message] = []
        self.seen: dict[str, object] = {}

    def after_step(self, monitor, step: int) -> None:
        if self.conn is None:
            self.conn = JobConnection(monitor.socket_path)
            self.seen["hello"] = self.conn.hello()
        self.at(monitor, step)
        if step == self.last_step:
            assert monitor.flush()
            self.messages += self.conn.messages(0.5)
            self.conn.close()
        else:
            self.messages += self.conn.messages(0.01)

    def at(self, monitor, step: int) -> None:
        """Override: what to do after ``step``."""

    def metrics(self) -> list[protocol.Metrics]:
        return [m for m in self.messages if isinstance(m, protocol.Metrics)]


class LightningDriver(pl.Callback, Watcher):
    """Asks for batch 16 after step 3."""

    def __init__(self, bsmon: lightning.BsmonCallback, last_step: int) -> None:
        pl.Callback.__init__(self)
        Watcher.__init__(self, last_step)
        self.bsmon = bsmon

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after_step(self.bsmon.monitor, trainer.global_step)

    def at(self, monitor, step: int) -> None:
        if step == 3:
            with pytest.raises(RecipeError, match="loss_fn"):  # the batch is there; the loss not
                monitor.job.probe_source.check()
            self.seen["reply"] = self.conn.request(protocol.SetBatchSize(value=16, confirm=True))
            assert monitor.flush()
            self.seen["pending"] = metrics_until(self.conn, lambda m: m.batch.pending == 16)


def fit(module: pl.LightningModule, data: pl.LightningDataModule, *callbacks, epochs: int = 3):
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        callbacks=list(callbacks),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=data)
    return trainer


def test_lightning_callback_shows_the_job_and_changes_the_datamodule_batch(bsmon_dir):
    bsmon = lightning.BsmonCallback(name="pl-test")
    driver = LightningDriver(bsmon, last_step=8 + 4 + 4)  # 64 samples: 8 batches of 8, then 16
    module, data = Regression(), Data(batch_size=8)
    fit(module, data, bsmon, driver)

    reply = driver.seen["reply"]
    assert reply.ok and reply.result["applies_at"] == "at the end of the epoch"
    pending = driver.seen["pending"]
    assert pending.batch.applies_at == "at the end of the epoch" and pending.batch_size == 8
    assert module.seen == [(0, 8)] * 8 + [(1, 16)] * 4 + [(2, 16)] * 4  # the next epoch, whole
    assert data.batch_size == 16
    last = driver.metrics()[-1]
    assert last.step == 16 and last.samples == 3 * 64 and last.batch_size == 16
    assert any(m.samples_per_s for m in driver.metrics())
    assert any("loss" in m.scalars for m in driver.metrics())
    changes = [e for e in events_of(driver.messages) if e.kind == "batch_size"]
    assert [(e.data["old"], e.data["new"], e.step) for e in changes] == [(8, 16, 8)]
    hello = driver.seen["hello"]
    assert hello.session.name == "pl-test" and hello.capabilities["set_batch_size"].available
    assert bsmon.monitor is None and not list(bsmon_dir.glob("*.sock"))  # closed at fit end


def test_lightning_without_a_batch_size_attribute_says_why_control_is_off(bsmon_dir):
    bsmon = lightning.BsmonCallback(name="pl-fixed")
    seen = {}

    class Peek(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.setdefault("cap", bsmon.monitor.job.router.capabilities()["set_batch_size"])
            seen["step"] = bsmon.monitor.step

    fit(Regression(), Data(batch_size=None), bsmon, Peek(), epochs=1)
    assert seen["step"] == 8
    assert not seen["cap"].available and "'batch_size' attribute" in seen["cap"].reason


class NoisyClasses(pl.LightningDataModule):
    """Ten noisy classes in 20 dimensions (a noise scale in the hundreds), 2,048 examples:
    256 steps an epoch at the start batch of 8."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_size = 8
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(2048, 20, generator=generator)
        w = torch.randn(20, 10, generator=generator)
        y = (x @ w + 2.0 * torch.randn(2048, 10, generator=generator)).argmax(1)
        self.dataset = torch.utils.data.TensorDataset(x, y)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(self.dataset, batch_size=self.batch_size, shuffle=True)


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10))
        self.seen: list[tuple[int, int, float]] = []  # (epoch, batch length, lr) per step

    def training_step(self, batch, _index):
        x, y = batch
        lr = self.trainer.optimizers[0].param_groups[0]["lr"]
        self.seen.append((self.current_epoch, len(x), lr))
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.02, momentum=0.9)


class StopOnceGrown(pl.Callback):
    """Stops the fit after the first whole epoch at a larger batch, keeping the autopilot's
    reading from before the monitor closes; fails once ``at_most`` epochs and a minute have
    gone by."""

    def __init__(self, bsmon: lightning.BsmonCallback, at_most: int = 200) -> None:
        self.bsmon, self.patience = bsmon, Patience(at_most)
        self.reading: protocol.AutopilotReading | None = None

    def on_train_epoch_end(self, trainer, pl_module):
        if pl_module.seen[-1][1] > 8:
            self.reading = self.bsmon.monitor.job.autopilot_reading()
            trainer.should_stop = True
        elif self.patience.spent(trainer.current_epoch + 1):
            reading = self.bsmon.monitor.job.autopilot_reading()
            pytest.fail(f"no growth by epoch {trainer.current_epoch}: {reading.waiting}")


def test_lightning_autopilot_grows_the_batch_at_an_epoch_end_with_the_learning_rate(bsmon_dir):
    bsmon = lightning.BsmonCallback(name="pl-auto", autopilot=True, max_batch_size=64)
    stop = StopOnceGrown(bsmon)
    module, data = Classifier(), NoisyClasses()
    fit(module, data, bsmon, stop, epochs=1000)

    first = stop.reading.decisions[0]
    assert (first.old, first.new, first.kind) == (8, 16, "grow")
    assert first.b_simple_low > 0 and first.predicted_gain > 1.05
    epochs = sorted({epoch for epoch, _, _ in module.seen})
    before = [(size, lr) for epoch, size, lr in module.seen if epoch < epochs[-1]]
    last = [(size, lr) for epoch, size, lr in module.seen if epoch == epochs[-1]]
    assert set(before) == {(8, 0.02)}  # the change waited for the epoch's end
    sizes, rates = {size for size, _ in last}, {lr for _, lr in last}
    assert sizes == {16} and len(last) == 2048 // 16  # a whole epoch (the next may be 32)
    assert sorted(rates) == pytest.approx([0.04])  # linear, for SGD
    assert stop.reading.state == "on" and stop.reading.start_size == 8


# -- Hugging Face Trainer -----------------------------------------------------------------------


class TinyConfig(transformers.PretrainedConfig):
    model_type = "bsmon-tiny"

    def __init__(self, features: int = 4, **kwargs) -> None:
        super().__init__(**kwargs)
        self.features = features


class TinyModel(transformers.PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config: TinyConfig) -> None:
        super().__init__(config)
        self.linear = nn.Linear(config.features, 1)
        self.sizes: list[int] = []  # batch length of each training forward
        self.post_init()

    def forward(self, x=None, labels=None):
        if self.training:
            self.sizes.append(len(x))
        out = self.linear(x).squeeze(-1)
        loss = nn.functional.mse_loss(out, labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=out)


class Pairs(torch.utils.data.Dataset):
    def __init__(self, samples: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(samples, 4, generator=generator)
        self.y = self.x.sum(1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "labels": self.y[index]}


class HfDriver(transformers.TrainerCallback, Watcher):
    """Asks for batch 4 (refused) and 16 after step 3."""

    def __init__(self, bsmon: hf.BsmonCallback, last_step: int) -> None:
        Watcher.__init__(self, last_step)
        self.bsmon = bsmon

    def on_step_end(self, args, state, control, **kwargs):
        self.after_step(self.bsmon.monitor, state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.seen["stats"] = self.bsmon.monitor.stats()  # after bsmon has seen the log

    def at(self, monitor, step: int) -> None:
        if step == 3:
            monitor.job.probe_source.check()  # `p` would start: a dict batch, a model with a loss
            self.seen["down"] = self.conn.request(protocol.SetBatchSize(value=4))
            self.seen["up"] = self.conn.request(protocol.SetBatchSize(value=16, confirm=True))


def train_hf(tmp_path, model, dataset, *callbacks, steps: int = 12):
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        max_steps=steps,
        per_device_train_batch_size=8,
        logging_steps=4,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=model, args=arguments, train_dataset=dataset, callbacks=list(callbacks)
    )
    trainer.train()
    return trainer


def test_hf_callback_shows_the_job_and_changes_the_batch_mid_epoch(bsmon_dir, tmp_path):
    bsmon = hf.BsmonCallback(name="hf-test")
    driver = HfDriver(bsmon, last_step=12)
    model = TinyModel(TinyConfig())
    train_hf(tmp_path, model, Pairs(1024), bsmon, driver)

    down, up = driver.seen["down"], driver.seen["up"]
    assert not down.ok and "below the minimum batch size 8" in down.error
    assert "Trainer fixed the number of steps" in down.error
    assert up.ok and up.result["applies_after_step"] == 4
    # the switch after step 4; accelerate had already cut step 5's batch
    assert model.sizes == [8] * 5 + [16] * 7
    last = driver.metrics()[-1]
    assert last.step == 12 and last.batch_size == 16 and last.samples == sum(model.sizes)
    assert any("loss" in m.scalars for m in driver.metrics())  # from the model's output
    stats = driver.seen["stats"]
    assert {"loss", "grad_norm", "learning_rate"} <= set(stats["scalars"])
    assert driver.seen["hello"].session.name == "hf-test"
    assert bsmon.monitor is None and not list(bsmon_dir.glob("*.sock"))


def test_resizable_batch_sampler_follows_its_size_and_drop_last():
    sampler = hf.ResizableBatchSampler(range(10), batch_size=3, drop_last=True)
    batches = []
    for batch in sampler:
        batches.append(batch)
        sampler.batch_size = 2
    assert batches == [[0, 1, 2], [3, 4], [5, 6], [7, 8]]
    assert len(hf.ResizableBatchSampler(range(10), batch_size=4, drop_last=False)) == 3


def test_a_missing_framework_is_a_clear_import_error():
    code = (
        "import sys\n"
        "for name in ('lightning', 'pytorch_lightning', 'transformers'): sys.modules[name] = None\n"
        "for module in ('lightning', 'hf'):\n"
        "    try:\n"
        "        __import__(f'bsmon.probes.integrations.{module}')\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    for line, extra in zip(lines, ("lightning", "hf"), strict=True):
        assert line.startswith(f"bsmon.probes.integrations.{extra} needs ")
        assert line.endswith(f"install it with: pip install 'bsmon[{extra}]'")
