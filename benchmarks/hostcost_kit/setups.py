"""What benchmarks/hostcost.py measures: the training step (a model, its optimizer and an
optional logging call) and the configurations set up around it, each a context manager that
sets a loop up and takes it down (bare, the floors, bsmon's, TensorBoard's, W&B's)."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

Step = Callable[[], None]


@dataclass
class Loop:
    """One training step of a model, with an optional logging call after it."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    x: torch.Tensor
    y: torch.Tensor
    log: Callable[[torch.Tensor], None] | None = None
    batches: Iterator | None = None  # a DataLoader's, drawn each step (else x and y again)
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.mse_loss

    def step(self) -> None:
        if self.batches is not None:
            self.x, self.y = next(self.batches)
        loss = self.criterion(self.model(self.x), self.y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.log is not None:
            self.log(loss)

    def all_done(self, done: bool) -> bool:
        """Whether every process stepping this model is ``done`` (one process: this one)."""
        return done


MODELS = ("tiny", "mid", "tiny-loader", "tiny-bn")
SHARDED = ("fsdp2", "ddp")  # workloads/sharded_job.py's model, on torchrun's ranks (sharded.py)


def endless(loader: DataLoader) -> Iterator:
    while True:
        yield from loader


def make_loop(model_name: str) -> Loop:
    """``tiny``, ``mid``, ``tiny-loader``: the tiny step drawing its batch from a DataLoader
    (the per-batch hook's cost), or ``tiny-bn``: the tiny step through a BatchNorm (the noise
    scale waits for gradient accumulation there); or one of ``SHARDED``, in a torchrun rank."""
    if model_name in SHARDED:
        from .sharded import sharded_loop

        return sharded_loop(model_name)
    torch.manual_seed(0)
    if model_name == "tiny-bn":
        model: nn.Module = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16))
        x, y = torch.randn(4, 16), torch.randn(4, 16)
    elif model_name.startswith("tiny"):
        model = nn.Linear(16, 16)
        x, y = torch.randn(4, 16), torch.randn(4, 16)
    else:
        model = nn.Sequential(
            nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )
        x, y = torch.randn(16, 256), torch.randn(16, 10)
    loop = Loop(model, torch.optim.SGD(model.parameters(), lr=1e-3), x, y)
    if model_name.endswith("loader"):
        data = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 16))
        loop.batches = endless(DataLoader(data, batch_size=4))
    return loop


# -- configurations: each one sets a loop up and gives back how to take it down ---------------

Setup = Callable[[Loop], contextlib.AbstractContextManager]


@contextlib.contextmanager
def bare(_loop: Loop) -> Iterator[None]:
    yield


@contextlib.contextmanager
def floor(loop: Loop) -> Iterator[None]:
    """The least the same step record could cost: one post-hook, one clock, one append."""
    inbox: deque = deque(maxlen=4096)
    clock, append = time.perf_counter, inbox.append
    handle = loop.optimizer.register_step_post_hook(lambda *_: append(clock()))
    yield
    handle.remove()


@contextlib.contextmanager
def floor_with_loss(loop: Loop) -> Iterator[None]:
    """The floor, and the loop's logging line keeping a reference to the loss as the least a
    monitor that shows the loss must (``latest.update(loss=loss)``: what ``mon.log(loss=loss)``
    is on a fast loop, without bsmon)."""
    with floor(loop):
        latest: dict[str, torch.Tensor] = {}
        loop.log = lambda loss: latest.update(loss=loss)
        yield
        loop.log = None


def bsmon(**options: object) -> Setup:
    @contextlib.contextmanager
    def setup(loop: Loop) -> Iterator[object]:  # the monitor
        from bsmon.probes import attach

        with tempfile.TemporaryDirectory() as where:
            record = Path(where) / "run.jsonl" if options.get("record") else False
            settings = {"serve": False, **options, "record": record}
            with attach(loop.model, loop.optimizer, **settings) as mon:  # type: ignore[arg-type]
                loop.log = lambda loss: mon.log(loss=loss)
                yield mon
                loop.log = None

    return setup


def zero_code(resizable: bool = False) -> Setup:
    """What ``bsmon run`` (``--resizable``) loads into an unmodified script (in this process:
    the same agent, without the process boot)."""

    @contextlib.contextmanager
    def setup(loop: Loop) -> Iterator[object]:  # the agent: its monitor from the first step
        from bsmon.probes.launch.autoattach import AutoAttach
        from bsmon.probes.runtime.audience import ENV_RESIZABLE

        os.environ[ENV_RESIZABLE] = "1" if resizable else "0"
        agent = AutoAttach("hostcost")
        del os.environ[ENV_RESIZABLE]
        agent.install()
        try:
            yield agent
        finally:
            agent.uninstall()

    return setup


@contextlib.contextmanager
def tensorboard(loop: Loop) -> Iterator[None]:
    from torch.utils.tensorboard import SummaryWriter

    with tempfile.TemporaryDirectory() as where:
        writer = SummaryWriter(where)
        steps = iter(range(10**9))
        loop.log = lambda loss: writer.add_scalar("loss", loss.item(), next(steps))
        yield
        loop.log = None
        writer.close()


@contextlib.contextmanager
def weights_and_biases(loop: Loop) -> Iterator[None]:
    import wandb

    with tempfile.TemporaryDirectory() as where:
        run = wandb.init(mode="offline", dir=where, project="hostcost")
        loop.log = lambda loss: run.log({"loss": loss.item()})
        yield
        loop.log = None
        run.finish()


NO_NOISE = {"noise_scale": None}
DECLARED = {"batch_size": 4}  # as the README's attach() does; bsmon run declares none
CONFIGS: dict[str, Setup] = {
    "bare": bare,
    "floor: perf_counter + append in a post-hook": floor,
    "floor + loss kept: latest.update(loss=loss)": floor_with_loss,
    "telemetry (noise, anatomy, record off)": bsmon(**NO_NOISE, **DECLARED, step_anatomy=False),
    "+ step anatomy": bsmon(**NO_NOISE, **DECLARED),
    "+ record": bsmon(**NO_NOISE, **DECLARED, record=True),
    "defaults (noise scale on its budget)": bsmon(**DECLARED, record=True),
    "noise scale every step": bsmon(**DECLARED, record=True, noise_budget=None),
    "defaults, no batch size declared": bsmon(record=True),
    "bsmon run (zero-code)": zero_code(),
    "bsmon run --resizable": zero_code(resizable=True),
    "TensorBoard add_scalar(loss.item())": tensorboard,
    "W&B offline run.log(loss.item())": weights_and_biases,
}
# Untimed steps before each block's timed ones. bsmon's run until its agent has ticked a few
# times: from the first tick the step anatomy's stride follows the step rate (before it, one
# step in 4–12 is timed, as at the start of any job: on this step ~600 steps, which a 200-step
# warm-up left in the timed block), and the noise scale's dense warm-up (≤ 300 steps) is over.
SETTLED = 3000
OTHERS = ("bare", "floor", "TensorBoard", "W&B")
WARMUP = {name: SETTLED for name in CONFIGS if not name.startswith(OTHERS)}


def available(name: str) -> str | None:
    """Why a configuration cannot run here, or None."""
    package = {"TensorBoard": "tensorboard", "W&B": "wandb"}.get(name.split(maxsplit=1)[0])
    if package is not None:
        try:
            __import__(package)
        except ImportError:
            return f"{name}: left out, {package} is not installed (pip install {package})"
    return None
