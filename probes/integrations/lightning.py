"""bsmon for Lightning: ``Trainer(callbacks=[BsmonCallback()])``.

Telemetry (steps, step time, samples, the loss a ``training_step`` returns), the noise scale
and everything else a ``Monitor`` does, plus batch-size control through the ``batch_size``
attribute Lightning's own batch-size finder uses: on the LightningModule, its ``hparams``, or
the datamodule, read by ``train_dataloader()``.

When a change applies: Lightning builds the train DataLoader once per epoch (or every
``reload_dataloaders_every_n_epochs``), and the number of batches in an epoch is fixed when
it does. So a change asked for during an epoch is held (the dashboard shows it pending, "at
the end of the epoch") and applied when the epoch ends: ``batch_size`` is set and the train
DataLoader is rebuilt for the next epoch, which then runs entirely at the new size, with its
length, progress bar and validation interval recomputed by Lightning. In a multi-process job
every rank applies it at the same epoch end. Import errors name the extra to install
(``pip install 'bsmon[lightning]'``). See docs/integrations.md.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..batch.loader import batch_length
from ..runtime.losses import loss_of
from .common import disable_batch_control, guarded, note, rank_name, require

APPLY_AT = "at the end of the epoch"


def _package() -> str:
    """``lightning.pytorch`` if it is importable, else the standalone ``pytorch_lightning``."""
    try:
        importlib.import_module("lightning.pytorch")
    except ImportError:
        try:
            importlib.import_module("pytorch_lightning")
        except ImportError:
            require("lightning.pytorch", "lightning", "Lightning")  # raises, saying what to do
        return "pytorch_lightning"
    return "lightning.pytorch"


class _BsmonLightning:
    """The callback's behaviour; ``callback_class`` mixes it with a Lightning ``Callback``."""

    _package: str = "lightning.pytorch"

    def __init__(
        self, name: str | None = None, batch_arg_name: str = "batch_size", **attach_options: Any
    ) -> None:
        """``name``: the job's name (default: the script's); ``batch_arg_name``: the attribute
        that holds the batch size; other keywords go to ``attach`` (``max_batch_size``,
        ``batch_step``, ``lr_scaling``, ``noise_scale``, ``socket_dir``, ...)."""
        super().__init__()
        self.name = name
        self.batch_arg_name = batch_arg_name
        self.attach_options = attach_options
        self.monitor: Any = None
        self._trainer: Any = None
        self._pl_module: Any = None
        self._expect: int | None = None  # the size the next epoch's first batch should have

    # -- lifecycle ------------------------------------------------------------------------------

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        from ..agent import attach
        from ..runtime.session import default_name

        if not trainer.optimizers:
            return  # nothing to hook: a module without configure_optimizers
        self._trainer, self._pl_module = trainer, pl_module
        parsing = importlib.import_module(f"{self._package}.utilities.parsing")
        size = None
        if parsing.lightning_hasattr(pl_module, self.batch_arg_name):
            size = parsing.lightning_getattr(pl_module, self.batch_arg_name)
        options = dict(self.attach_options)
        schedulers = trainer.lr_scheduler_configs
        if options.get("lr_scaling", "auto") and "lr_scheduler" not in options and schedulers:
            options["lr_scheduler"] = schedulers[0].scheduler
        name = rank_name(self.name or default_name(), trainer.global_rank, trainer.world_size)
        controllable = isinstance(size, int) and not isinstance(size, bool) and size > 0
        self.monitor = attach(
            trainer.model,
            trainer.optimizers[0],
            name=name,
            batch_size=size if controllable else None,
            **options,
        )
        if controllable:
            self.monitor.job.defer_batch_changes(APPLY_AT)
            self.monitor.on_batch_size_change(self._resize)
        else:
            disable_batch_control(
                self.monitor,
                f"neither the LightningModule, its hparams nor the datamodule has an integer "
                f"{self.batch_arg_name!r} attribute for train_dataloader() to use",
            )
        if len(trainer.optimizers) > 1:
            note(
                self.monitor,
                "integration",
                f"{len(trainer.optimizers)} optimizers: bsmon counts the steps of the first",
            )

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._close("fit ended")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close(f"fit raised {type(exception).__name__}")

    def _close(self, reason: str) -> None:
        if self.monitor is not None:
            self.monitor.close(reason)
            self.monitor = None

    # -- per batch and per epoch (training thread) ----------------------------------------------

    @guarded
    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        monitor = self.monitor
        if monitor is None:
            return
        n = batch_length(batch)
        if n is not None:
            monitor.job.count_samples(n, n)
            monitor.job.probe_source.offer(batch, n)  # the probe needs loss_fn= or probe_step= too
            if self._expect is not None:
                self._check_reloaded(n)

    @guarded
    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        monitor = self.monitor
        if monitor is None:
            return
        loss = loss_of(outputs)
        if loss is not None:
            monitor.log(loss=loss)

    @guarded
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        monitor = self.monitor
        if monitor is not None and monitor.job.batch_control is not None:
            monitor.job.batch_control.apply_deferred()

    def _resize(self, old: int, new: int) -> None:
        """The held change is being applied (epoch end): set the attribute, rebuild the loader."""
        parsing = importlib.import_module(f"{self._package}.utilities.parsing")
        parsing.lightning_setattr(self._pl_module, self.batch_arg_name, new)
        loop = self._trainer.fit_loop
        if hasattr(loop, "_combined_loader"):
            loop._combined_loader = None  # as Lightning's batch-size finder does: rebuild it
        elif not self._trainer.reload_dataloaders_every_n_epochs:
            self.monitor.job.ctx.warn(
                "integration",
                "this Lightning version cannot be asked to rebuild the train DataLoader; set "
                "Trainer(reload_dataloaders_every_n_epochs=1) for batch-size changes to apply",
            )
        self._expect = new

    def _check_reloaded(self, n: int) -> None:
        expected, self._expect = self._expect, None
        if n != expected and (self._trainer.num_training_batches or 0) > 1:
            self.monitor.job.ctx.warn(
                "integration",
                f"the train DataLoader yields batches of {n}, not the {expected} just set in "
                f"{self.batch_arg_name!r}: its train_dataloader() should use self."
                f"{self.batch_arg_name}",
            )


def callback_class(package: str) -> type:
    """A ``BsmonCallback`` class for ``package`` (``"lightning.pytorch"`` or
    ``"pytorch_lightning"``): a Trainer accepts only callbacks of its own package."""
    module = require(package, "lightning", "Lightning")
    return type(
        "BsmonCallback",
        (_BsmonLightning, module.Callback),
        {"_package": package, "__module__": __name__, "__doc__": _BsmonLightning.__doc__},
    )


BsmonCallback: Any = callback_class(_package())

__all__ = ["BsmonCallback", "callback_class"]
