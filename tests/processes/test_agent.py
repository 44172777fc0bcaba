"""The agent inside the job: hooks, counts, logging, the data loader, and close()."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import warnings
import weakref

import pytest
import torch
from torch import nn

from bsmon.probes import attach
from bsmon.probes.record.reader import open_record
from bsmon.probes.runtime import hot_path
from bsmon.probes.wire import protocol
from bsmon.probes.wire.client import JobConnection

from ..helpers import wait_until
from ..jobs import TinyJob
from ..watch import metrics_until


def agent_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("bsmon-") and t.is_alive()]


@pytest.fixture
def job(bsmon_dir):
    return TinyJob()


def test_steps_samples_and_throughput_are_counted(job, bsmon_dir):
    with attach(job.model, job.optimizer, batch_size=8, name="count") as mon:
        for _ in range(25):
            job.step(mon)
        assert mon.flush()
        stats = mon.stats()
    assert stats["step"] == 25
    assert stats["samples"] == 25 * 8
    assert stats["step_time_s"] > 0
    assert stats["samples_per_s"] == pytest.approx(8 / stats["step_time_s"], rel=0.5)
    assert stats["scalars"]["loss"] >= 0
    assert stats["errors"] == 0


def test_subclass_calling_super_step_counts_once(bsmon_dir):
    class MyAdamW(torch.optim.AdamW):
        def step(self, closure=None):
            return super().step(closure)

    model = nn.Linear(3, 1)
    torch.optim.AdamW(nn.Linear(1, 1).parameters())  # patches AdamW.step too: hooks fire twice
    optimizer = MyAdamW(model.parameters())
    with attach(model, optimizer, batch_size=2) as mon:
        for _ in range(5):
            model(torch.randn(2, 3)).sum().backward()
            optimizer.step()
        assert mon.step == 5


def test_a_step_that_raises_does_not_stop_the_count(bsmon_dir):
    class Flaky(torch.optim.SGD):
        fail = True

        def step(self, closure=None):
            if Flaky.fail:
                Flaky.fail = False
                raise RuntimeError("user bug")
            return super().step(closure)

    model = nn.Linear(3, 1)
    torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)
    optimizer = Flaky(model.parameters(), lr=0.1)
    with attach(model, optimizer, batch_size=2) as mon:
        model(torch.randn(2, 3)).sum().backward()
        with pytest.raises(RuntimeError, match="user bug"):
            optimizer.step()
        for _ in range(3):
            optimizer.step()
        assert mon.step == 3


def test_close_removes_every_hook_and_thread_and_the_socket(job, bsmon_dir):
    before = (
        len(job.optimizer._optimizer_step_pre_hooks),
        len(job.optimizer._optimizer_step_post_hooks),
    )
    mon = attach(job.model, job.optimizer, batch_size=8)
    socket_path = mon.socket_path
    assert socket_path.exists() and agent_threads()
    mon.close()
    mon.close()  # idempotent
    assert (
        len(job.optimizer._optimizer_step_pre_hooks),
        len(job.optimizer._optimizer_step_post_hooks),
    ) == before
    assert not socket_path.exists()
    assert not socket_path.with_suffix(".json").exists()
    wait_until(lambda: not agent_threads(), message="agent threads to stop")
    job.step()
    assert mon.step == 0  # no hook left to count


def test_an_exception_in_bsmon_code_never_reaches_the_job(job, bsmon_dir, monkeypatch):
    mon = attach(job.model, job.optimizer, batch_size=8, name="faulty")
    conn = JobConnection(mon.socket_path)
    try:
        conn.hello()

        def broken():
            raise ZeroDivisionError("injected")

        # inside the optimizer's post-step hook, on every step: its clock reading
        monkeypatch.setattr(hot_path, "perf_counter", broken)
        for _ in range(10):
            job.step(mon)  # must not raise
        monkeypatch.undo()
        assert mon.flush()
        assert mon.stats()["errors"] == 10 and mon.step == 10
        event = conn.wait_for(protocol.Event, timeout=60)
        while event.kind != "agent_error":
            event = conn.wait_for(protocol.Event, timeout=60)
        assert "ZeroDivisionError" in event.message and event.level == "error"
        assert metrics_until(conn, lambda m: m.errors == 10).errors == 10
    finally:
        conn.close()
        mon.close()


def test_a_failing_tick_is_an_event_and_the_agent_goes_on(job, bsmon_dir):
    """A bug in the agent's tick (here the telemetry's poll, once) is reported like one on
    the training thread, and the agent keeps ticking: no step is lost and flush returns."""
    with attach(job.model, job.optimizer, batch_size=8, name="tick", serve=False) as mon:
        poll, failures = mon.job.telemetry.poll, []

        def poll_failing_once() -> None:
            if not failures:
                failures.append(1)
                raise ZeroDivisionError("injected")
            poll()

        mon.job.telemetry.poll = poll_failing_once
        for _ in range(5):
            job.step(mon)
        assert mon.flush(10)
        for _ in range(5):
            job.step(mon)
        assert mon.flush(10) and mon._service.is_alive()
        errors = [e for e in mon.job.telemetry.events if e.kind == "agent_error"]
        assert len(errors) == 1 and "ZeroDivisionError in the agent's tick" in errors[0].message
        stats = mon.stats()
        assert stats["step"] == 10 and stats["samples"] == 80 and stats["errors"] == 1


@pytest.mark.filterwarnings("error")  # reading a tensor that requires grad warns on item()
def test_the_agent_reads_the_losses_and_the_training_thread_frees_them(job, bsmon_dir):
    """Freeing a tensor lets go of the GIL, so the agent thread hands the job's tensors back:
    they die at the training thread's next step, as in a bare loop, and their values are
    read without a warning."""
    freed_on: list[str] = []
    with attach(job.model, job.optimizer, batch_size=8) as mon:
        losses = [job.step(mon) for _ in range(5)]
        values = [loss.item() for loss in losses]
        for loss in losses:
            weakref.finalize(loss, lambda: freed_on.append(threading.current_thread().name))
        del losses, loss
        assert mon.flush()  # the agent has read all five
        assert mon.job.telemetry.scalars["loss"] == values[-1]
        assert freed_on == []  # and kept them for the training thread
        job.step(mon)
        assert 1 <= len(freed_on) < 5  # a few a step, as a bare loop frees one a step
        for _ in range(4):
            job.step(mon)
        assert freed_on == ["MainThread"] * 5
        assert mon.flush()
        assert mon.stats()["errors"] == 0


def test_log_accepts_floats_ints_and_tensors_and_reports_bad_values(job, bsmon_dir):
    with attach(job.model, job.optimizer, batch_size=8) as mon:
        mon.log(a=1.5, b=2, c=torch.tensor(3.0), d=torch.tensor([4.0]))
        mon.log(bad="text", vector=torch.ones(3), flag=True)
        assert mon.flush()
        scalars = mon.stats()["scalars"]
        assert scalars == {"a": 1.5, "b": 2.0, "c": 3.0, "d": 4.0}
        assert mon.stats()["errors"] == 3
        events = [e.message for e in mon.job.telemetry.events]
    assert any("str is not a number" in m for m in events)
    assert any("shape (3,) is not a scalar" in m for m in events)


def test_integer_and_bool_tensors_are_read_as_floats(job, bsmon_dir):
    """Read a tick at a time, as floats: the metrics and the record take only floats."""
    with attach(job.model, job.optimizer, batch_size=8, record=bsmon_dir / "r.jsonl") as mon:
        for _ in range(3):
            mon.log(count=torch.tensor(7), flag=torch.tensor(True))
        assert mon.flush()
        scalars = mon.stats()["scalars"]
    assert scalars == {"count": 7.0, "flag": 1.0}
    assert all(type(v) is float for v in scalars.values())
    with open_record(bsmon_dir / "r.jsonl") as reader:
        assert len(list(reader.lines())) >= 3  # every line decodes: the spans' scalars too
        assert reader.damage_note() is None


def test_nonfinite_loss_is_reported_once(job, bsmon_dir):
    with attach(job.model, job.optimizer, batch_size=8) as mon:
        for _ in range(3):
            mon.log(loss=float("nan"))
        assert mon.flush()
        warnings_ = [e for e in mon.job.telemetry.events if e.kind == "nonfinite_scalar"]
    assert len(warnings_) == 1 and "loss is nan" in warnings_[0].message


def test_bad_attach_arguments_are_clear_errors(job, bsmon_dir):
    for kwargs, message in [
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"batch_size": "64"}, "batch_size must be a positive integer"),
        ({"noise_window": -1}, "noise_window must be a positive integer"),
        ({"noise_scale": "magic"}, "noise_scale must be one of"),
        ({"name": ""}, "name must be a non-empty string"),
    ]:
        with pytest.raises(ValueError, match=message):
            attach(job.model, job.optimizer, **kwargs)
    with pytest.raises(TypeError, match=r"torch\.optim\.Optimizer"):
        attach(job.model, object())
    with pytest.raises(TypeError, match=r"nn\.Module"):
        attach("model", job.optimizer)


def test_an_unusable_socket_dir_degrades_to_a_warning(job, tmp_path):
    target = tmp_path / "real"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon = attach(job.model, job.optimizer, batch_size=8, socket_dir=link)
    try:
        assert mon.socket_path is None and not mon.job.serving.available
        assert any("symbolic link" in str(w.message) for w in caught)
        job.step(mon)
        assert mon.step == 1  # the job goes on, still counted
    finally:
        mon.close()


def test_dataloader_follows_the_batch_size_and_counts_samples(bsmon_dir):
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    dataset = torch.utils.data.TensorDataset(torch.arange(100.0).reshape(50, 2), torch.zeros(50))
    with attach(model, optimizer, batch_size=16) as mon:
        loader = mon.dataloader(dataset, shuffle=True, generator=torch.Generator().manual_seed(0))
        sizes = []
        for x, _ in loader:
            sizes.append(len(x))
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        assert sizes == [16, 16, 16, 2]
        assert mon.flush()
        assert mon.stats()["samples"] == 50
    with pytest.raises(ValueError, match="sets batch_size itself"):
        mon.dataloader(dataset, batch_size=4)


def test_commands_a_job_cannot_do_say_why(job, bsmon_dir):
    with attach(job.model, job.optimizer) as mon:  # no batch size declared
        reply = mon.request_batch_size(16)
        assert not reply.ok and "declared no batch size" in reply.error
        assert mon.batch_size is None
        result = mon.probe()
        assert result.status == "refused" and "needs attach(..., batch_size=N)" in result.error


def test_a_job_that_exits_without_close_leaves_no_socket(bsmon_dir, processes):
    script = (
        "import torch\n"
        "from bsmon.probes import attach\n"
        "m = torch.nn.Linear(2, 1)\n"
        "o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "mon = attach(m, o, batch_size=4, name='atexit')\n"
        "print(mon.socket_path, flush=True)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    socket_path = result.stdout.strip()
    assert socket_path.endswith(".sock")
    assert [p.name for p in bsmon_dir.iterdir()] == ["records"]  # only the session record stays


def test_monitor_is_collectable_after_close(job, bsmon_dir):
    mon = attach(job.model, job.optimizer, batch_size=8)
    mon.close()
    import weakref

    ref = weakref.ref(mon)
    del mon
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("record", [True, False])
def test_ctrl_c_still_exits_with_130_when_bsmon_is_attached(bsmon_dir, record):
    script = (
        "import time, torch\n"
        "from bsmon.probes import attach\n"
        "m = torch.nn.Linear(2, 1)\n"
        "o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        f"mon = attach(m, o, batch_size=4, record={record})\n"
        "time.sleep(0.5)  # the record's writer is up\n"
        "raise KeyboardInterrupt\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert result.returncode == -2 or result.returncode == 130, result.stderr.decode()[-500:]
