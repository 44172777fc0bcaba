"""`bsmon run --resizable`: the batch size of a script's own DataLoader, from the keys.

Every test runs tests/resizable_job.py (a script that never imports bsmon) as a real process
under `bsmon run --resizable --headless` and drives it over its socket.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bsmon.probes.maxbatch.seen_step import NOT_REPRODUCIBLE, WAITING
from bsmon.probes.wire import protocol
from bsmon.probes.wire.client import JobConnection

from ..helpers import ROOT, wait_until
from ..watch import events_of, job_socket, kill_run_processes, metrics_until

JOB = str(ROOT / "tests" / "resizable_job.py")
GPT = str(ROOT / "tests" / "corpus" / "gpt.py")
BSMON = [sys.executable, "-m", "bsmon.tui.cli", "run", "--resizable", "--headless"]
STEP = re.compile(r"step (\d+) epoch (\d+) batch (\d+)(?: lr [\d.]+)?: ([\d ]+)")
LR = re.compile(r"step (\d+) epoch \d+ batch (\d+) lr ([\d.]+)")
RANK_STEP = re.compile(r"rank (\d) step (\d+) epoch (\d+) batch (\d+): ([\d ]+)")


@pytest.fixture(autouse=True)
def no_strays(bsmon_dir):
    yield
    kill_run_processes(bsmon_dir)


def start(
    processes, name: str, *job_args: str, script: str = JOB, launcher: tuple[str, ...] = ()
) -> subprocess.Popen:
    command = [*BSMON, "--name", name, "--", sys.executable, *launcher, script, *job_args]
    return processes.start(command, cwd=ROOT, text=True)


def steps_of(output: str) -> list[tuple[int, int, list[int]]]:
    """(epoch, batch size, indices) of each step the job printed."""
    return [(int(m[2]), int(m[3]), [int(i) for i in m[4].split()]) for m in STEP.finditer(output)]


def finish(run: subprocess.Popen) -> str:
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    assert out.rstrip().endswith("done"), out
    return out


@pytest.mark.parametrize("workers", ["0", "2"])
def test_until_a_key_is_pressed_the_job_draws_exactly_its_own_batches(
    bsmon_dir, processes, workers
):
    args = ("--epochs", "2", "--workers", workers)
    bare = subprocess.run(
        [sys.executable, JOB, *args], capture_output=True, text=True, timeout=120, check=True
    )
    resizable = finish(start(processes, "twin", *args))
    assert resizable == bare.stdout  # the same batches, in the same order


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_key_resizes_the_loader_at_a_step_boundary_and_no_sample_is_lost(
    bsmon_dir, processes, tmp_path, workers
):
    gate = tmp_path / "gate"
    run = start(processes, "keys", "--workers", workers, "--read-len", "--gate", str(gate))
    with JobConnection(job_socket("keys", bsmon_dir)) as conn:
        hello = conn.hello()
        assert hello.capabilities["set_batch_size"].available
        metrics_until(conn, lambda m: m.step >= 3)
        reply = conn.request(protocol.SetBatchSize(value=16, reason="+", confirm=True))
        assert reply.ok, reply.error
        gate.touch()
        seen: list[protocol.Message] = []
        metrics = metrics_until(conn, lambda m: m.batch_size == 16 and m.step >= 8, keep=seen)
        events = events_of([*seen, *conn.messages(0.5)])
    steps = steps_of(finish(run))
    for epoch in (0, 1):  # every sample once an epoch: none dropped, none repeated
        drawn = Counter(i for e, _, ids in steps if e == epoch for i in ids)
        assert sorted(drawn) == list(range(96)) and set(drawn.values()) == {1}, drawn
    sizes = [size for _, size, _ in steps]
    switch = sizes.index(16)
    assert switch >= 4 and set(sizes[:switch]) == {8}
    rest_of_epoch = [size for e, size, _ in steps[switch:] if e == 0]
    assert set(rest_of_epoch[:-1]) == {16} and 0 < rest_of_epoch[-1] <= 16  # may end short
    assert [size for e, size, _ in steps if e == 1] == [16] * 6  # the next epoch: 96 / 16
    assert metrics.batch_size == 16
    (resized,) = [e for e in events if "the script's DataLoader cuts batches of 16" in e.message]
    if workers == "2":
        assert "batches its workers already prefetched" in resized.message
    else:
        assert "from the next batch" in resized.message
    assert "the script read len(loader) = 12 before" in resized.message
    assert "(now 6 an epoch)" in resized.message
    (change,) = [e for e in events if e.kind == "batch_size"]
    assert "batch 8 → 16" in change.message and "lr 0.01 → 0.02 (linear rule" in change.message


def test_every_optimizer_the_job_steps_follows_the_batch(bsmon_dir, processes, tmp_path):
    """A GAN's two optimizers: the one bsmon watches (SGD, linear rule) and the other (Adam,
    square-root rule) both move their learning rate at the change, and the event says so."""
    gate = tmp_path / "gate"
    run = start(processes, "gan", "--two-optimizers", "--gate", str(gate))
    with JobConnection(job_socket("gan", bsmon_dir)) as conn:
        conn.hello()
        seen: list[protocol.Message] = []
        metrics_until(
            conn,
            lambda m: (
                m.step >= 3 and any("another optimizer" in e.message for e in events_of(seen))
            ),
            keep=seen,
        )
        reply = conn.request(protocol.SetBatchSize(value=32, reason="+", confirm=True))
        assert reply.ok, reply.error
        gate.touch()
        metrics_until(conn, lambda m: m.batch_size == 32, keep=seen)
        events = events_of([*seen, *conn.messages(0.5)])
    out = finish(run)
    (noticed,) = [e for e in events if "another optimizer" in e.message]
    assert "its learning rate follows the batch size too" in noticed.message
    assert "whether it holds after a change is not judged" in noticed.message
    (change,) = [e for e in events if e.kind == "batch_size"]
    assert "lr 0.01 → 0.04 (linear rule for SGD)" in change.message
    assert "the other optimizer (Adam): lr 0.001 → 0.002" in change.message
    assert "lrs 0.040000 0.002000" in out  # what the job's own optimizers hold at the end


@pytest.mark.parametrize(
    ("job_args", "reason"),
    [
        (("--iterable",), "the training data is an IterableDataset"),
        (("--own-sampler",), "its own batch_sampler (PairsSampler), which bsmon cannot resize"),
    ],
)
def test_a_loader_bsmon_cannot_resize_turns_the_keys_off_with_the_reason(
    bsmon_dir, processes, job_args, reason
):
    run = start(processes, "off", "--epochs", "1", "--gate", "never", *job_args)
    with JobConnection(job_socket("off", bsmon_dir)) as conn:
        capabilities = conn.hello().capabilities
    run.kill()
    capability, probe = capabilities["set_batch_size"], capabilities["probe"]
    assert not capability.available and reason in capability.reason
    assert capability.reason.startswith("bsmon run --resizable: ")
    assert not probe.available and reason in probe.reason  # the reason, not "use --resizable"
    assert probe.reason.startswith("the probe needs the batch size under control; bsmon cannot")


def test_sizes_the_job_cannot_train_at_are_refused_with_the_reason(bsmon_dir, processes, tmp_path):
    gate = tmp_path / "gate"
    run = start(processes, "hazards", "--batch-norm", "--one-cycle", "--gate", str(gate))
    with JobConnection(job_socket("hazards", bsmon_dir)) as conn:
        metrics_until(conn, lambda m: m.step >= 3)
        ones = conn.request(protocol.SetBatchSize(value=19, confirm=True))  # 96 = 5 × 19 + 1
        smaller = conn.request(protocol.SetBatchSize(value=4, confirm=True))
        larger = conn.request(protocol.SetBatchSize(value=16, confirm=True))
        gate.touch()
        metrics_until(conn, lambda m: m.batch_size == 16)
    finish(run)
    assert not ones.ok and "19 leaves a last batch of 1 sample" in ones.error
    assert "BatchNorm" in ones.error
    assert not smaller.ok and "OneCycleLR raises once stepped past its total_steps" in smaller.error
    assert larger.ok, larger.error  # fewer steps than OneCycleLR allows: it never raises


def test_a_script_that_cuts_its_own_batches_says_why_the_keys_are_off(bsmon_dir, processes):
    run = start(processes, "gpt", "--steps", "400", script=GPT)
    with JobConnection(job_socket("gpt", bsmon_dir)) as conn:
        capability = conn.hello().capabilities["set_batch_size"]
    run.kill()
    assert not capability.available
    assert "the script cuts its own batches" in capability.reason
    assert "docs/zero-code.md" in capability.reason


def test_under_torchrun_every_rank_changes_at_the_same_step(bsmon_dir, processes, tmp_path):
    gate = tmp_path / "gate"
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
    # the ranks agree on a change every few steps (batch control's step sync): six epochs
    run = start(processes, "ddp", "--ddp", "--epochs", "6", "--gate", str(gate), launcher=torchrun)
    with JobConnection(job_socket("ddp", bsmon_dir, timeout=120)) as conn:
        metrics_until(conn, lambda m: m.step >= 3, timeout=120)
        reply = conn.request(protocol.SetBatchSize(value=16, reason="+", confirm=True))
        assert reply.ok, reply.error
        gate.touch()
        metrics_until(conn, lambda m: m.batch_size == 16, timeout=120)
    out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err
    by_rank: dict[int, list[tuple[int, int, int, list[int]]]] = {0: [], 1: []}
    for m in RANK_STEP.finditer(out):
        by_rank[int(m[1])].append((int(m[2]), int(m[3]), int(m[4]), [int(i) for i in m[5].split()]))
    sizes = {rank: [size for _, _, size, _ in steps] for rank, steps in by_rank.items()}
    assert sizes[0] == sizes[1] and 8 in sizes[0] and 16 in sizes[0], sizes  # the same step
    for epoch in range(6):  # the two shards: every sample once an epoch, none dropped
        drawn = Counter(
            i for steps in by_rank.values() for _, e, _, ids in steps if e == epoch for i in ids
        )
        assert sorted(drawn) == list(range(96)) and set(drawn.values()) == {1}, drawn


def test_under_torchrun_a_change_the_job_ends_before_is_said_in_rank_0s_record(
    bsmon_dir, processes, tmp_path
):
    from bsmon.probes.record.reader import open_record

    gate = tmp_path / "gate"
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
    # 4 steps a rank: the exchange that would carry the change comes after the job's end
    args = ("--ddp", "--epochs", "1", "--samples", "64", "--gate", str(gate))
    run = start(processes, "ends", *args, launcher=torchrun)
    with JobConnection(job_socket("ends", bsmon_dir, timeout=120)) as conn:
        metrics_until(conn, lambda m: m.step >= 3, timeout=120)
        reply = conn.request(protocol.SetBatchSize(value=16, reason="+", confirm=True))
        assert reply.ok, reply.error
        assert reply.result["applies_after_step"] > 4
        gate.touch()
    out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err
    assert {int(m[4]) for m in RANK_STEP.finditer(out)} == {8}  # never applied, on either rank
    said = {}
    for path in (bsmon_dir / "records").glob("*.jsonl"):
        with open_record(path) as reader:
            said[path.name] = [
                e.message
                for e in reader.lines()
                if isinstance(e, protocol.Event) and e.kind == "batch_size_unapplied"
            ]
    (rank0,) = [messages for name, messages in said.items() if "rank" not in name]
    assert len(said) == 2 and len(rank0) == 1, said
    never = "the change to batch 16 (+) was never applied: the job ended at step 4"
    assert rank0[0].startswith(never)


def test_a_framework_s_own_loop_is_left_to_its_callback(bsmon_dir, processes):
    run = start(processes, "lit", script=str(ROOT / "tests" / "corpus" / "lightning_job.py"))
    out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err
    assert "epoch 14: val_loss" in out  # it trained to the end, as it would
    (record,) = (bsmon_dir / "records").glob("*.jsonl")
    said = "batch-size control is off: bsmon run --resizable: Lightning's loop counts"
    assert said in record.read_text() and "Lightning callback" in record.read_text()


def probe_reading(conn: JobConnection, condition) -> protocol.ProbeReading:
    return metrics_until(conn, lambda m: condition(m.probe), timeout=180).probe


def test_the_probe_replays_the_scripts_loss_module(bsmon_dir, processes, tmp_path):
    gate = tmp_path / "gate"
    run = start(processes, "probe", "--loss", "criterion", "--gate", str(gate))
    with JobConnection(job_socket("probe", bsmon_dir)) as conn:
        probe_reading(conn, lambda p: p.blocked is None)  # the step was seen: it can start
        reply = conn.request(protocol.ProbeCommand(memory_budget=700 << 20, timeout_s=150))
        assert reply.ok, reply.error
        result = probe_reading(conn, lambda p: p.status == "done").result
        gate.touch()
    finish(run)
    assert result.status == "ok", result.error
    assert result.points[0].batch_size == 8 and result.points[0].fits  # the job's own size
    assert result.confirmed_max and result.confirmed_max > 8
    assert result.recommendation is not None
    records = sorted(p.name for p in (bsmon_dir / "records").glob("*.jsonl"))
    assert len(records) == 1 and "-probe-" in records[0]  # the job's; the sidecar is not a job


def test_a_loss_bsmon_cannot_replay_blocks_the_probe_with_the_reason(bsmon_dir, processes):
    run = start(processes, "noprobe", "--gate", "never")  # the loss: x.pow(2).mean() in the loop
    with JobConnection(job_socket("noprobe", bsmon_dir)) as conn:
        reading = probe_reading(conn, lambda p: p.blocked != WAITING)
        reply = conn.request(protocol.ProbeCommand(memory_budget=700 << 20))
    run.kill()
    assert reading.blocked == NOT_REPRODUCIBLE
    assert not reply.ok and reply.error == f"probe: {NOT_REPRODUCIBLE}"


def test_a_scheduler_that_sets_the_lr_every_step_follows_the_batch(bsmon_dir, processes, tmp_path):
    """Cosine annealing overwrites the lr at every step: its base rates are scaled, so after
    8 → 16 each step's lr is twice what the same step's is without the change."""
    args = ("--cosine", "--epochs", "2")
    bare = subprocess.run(
        [sys.executable, JOB, *args], capture_output=True, text=True, timeout=120, check=True
    )
    gate = tmp_path / "gate"
    run = start(processes, "cosine", *args, "--gate", str(gate))
    with JobConnection(job_socket("cosine", bsmon_dir)) as conn:
        metrics_until(conn, lambda m: m.step >= 3)
        assert conn.request(protocol.SetBatchSize(value=16, confirm=True)).ok
        gate.touch()
        seen: list[protocol.Message] = []
        metrics_until(conn, lambda m: m.batch_size == 16, keep=seen)
        events = events_of([*seen, *conn.messages(0.5)])
    resized = {int(m[1]): (int(m[2]), float(m[3])) for m in LR.finditer(finish(run))}
    plain = {int(m[1]): float(m[3]) for m in LR.finditer(bare.stdout)}
    (change,) = [e for e in events if e.kind == "batch_size"]
    assert "lr 0.00998 → 0.02 (linear rule for SGD)" in change.message  # cosine's lr then
    assert "owns the lr" not in change.message  # the scheduler was found: its base rates
    first = min(step for step, (size, _) in resized.items() if size == 16)
    for step in range(first, first + 4):  # the same schedule, at twice the rate
        assert resized[step][1] == pytest.approx(2 * plain[step], rel=1e-3), (step, resized, plain)


def test_an_accumulating_script_is_told_what_the_keys_change(bsmon_dir, processes, tmp_path):
    gate = tmp_path / "gate"
    run = start(processes, "accumulate", "--accumulate", "2", "--gate", str(gate))
    with JobConnection(job_socket("accumulate", bsmon_dir)) as conn:
        backlog = conn.messages(0.5)
        metrics_until(conn, lambda m: m.step >= 1)
        assert conn.request(protocol.SetBatchSize(value=16, confirm=True)).ok
        gate.touch()
        metrics = metrics_until(conn, lambda m: m.batch_size == 16)
    steps = steps_of(finish(run))
    (attached,) = [e for e in events_of(backlog) if e.message.startswith("bsmon run: watching")]
    assert "the keys change the batch size of the script's DataLoader (8); each optimizer " in (
        attached.message
    )
    assert "step trains about 2 of them" in attached.message
    assert metrics.batch_size == 16 and steps[-1][1] == 16


def test_a_loader_built_anew_each_epoch_gets_the_new_size_from_its_second_batch(
    bsmon_dir, processes, tmp_path
):
    gate = tmp_path / "gate"
    run = start(processes, "fresh", "--fresh", "--gate", str(gate))
    with JobConnection(job_socket("fresh", bsmon_dir)) as conn:
        metrics_until(conn, lambda m: m.step >= 3)
        assert conn.request(protocol.SetBatchSize(value=16, confirm=True)).ok
        gate.touch()
    steps = steps_of(finish(run))
    second_epoch = [size for epoch, size, _ in steps if epoch == 1]
    assert second_epoch == [8] + [16] * 5 + [8]  # 96 = 8 + 5 × 16 + 8
    drawn = Counter(i for epoch, _, ids in steps if epoch == 1 for i in ids)
    assert sorted(drawn) == list(range(96)) and set(drawn.values()) == {1}


def ask_and_open(
    conn: JobConnection, value: int, gate: Path
) -> tuple[protocol.Reply, list[protocol.Event]]:
    """Ask for ``value``, open the job's gate, and wait for the size: the reply, the events."""
    reply = conn.request(protocol.SetBatchSize(value=value, reason="+", confirm=True))
    gate.touch()
    assert reply.ok, reply.error
    seen: list[protocol.Message] = []
    metrics_until(conn, lambda m: m.batch_size == value, keep=seen)
    return reply, events_of([*seen, *conn.messages(0.5)])


def assert_each_sample_once(
    steps: list[tuple[int, int, list[int]]], epochs: int, samples: int
) -> None:
    for epoch in range(epochs):  # every sample once an epoch: none dropped, none repeated
        drawn = Counter(i for e, _, ids in steps if e == epoch for i in ids)
        assert sorted(drawn) == list(range(samples)) and set(drawn.values()) == {1}, drawn


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_size_asked_while_the_script_evaluates_applies_from_the_next_epoch(
    bsmon_dir, processes, tmp_path, workers
):
    """Between epochs the training iterator is gone but its loader is not: the request is
    accepted, and the next epoch is cut at the new size from its first batch."""
    gate = tmp_path / "gate"
    run = start(processes, "between", "--workers", workers, "--eval-gate", str(gate))
    with JobConnection(job_socket("between", bsmon_dir)) as conn:
        wait_until((tmp_path / "gate.evaluating").exists, 90, 0.05, "the evaluation")
        reply, events = ask_and_open(conn, 16, gate)
    steps = steps_of(finish(run))
    assert reply.result["applies_at"] == "from the next epoch's first batch (between epochs)"
    assert [size for epoch, size, _ in steps if epoch == 0] == [8] * 12
    assert [size for epoch, size, _ in steps if epoch == 1] == [16] * 6  # 96 / 16
    assert_each_sample_once(steps, 2, 96)
    (change,) = [e for e in events if e.kind == "batch_size"]
    assert change.step == 12 and "batch 8 → 16" in change.message
    (resized,) = [e for e in events if "the script's DataLoader cuts batches of 16" in e.message]
    assert resized.message.endswith("from the first batch of the epoch it starts now")


def test_workers_that_prefetched_the_whole_epoch_take_the_size_at_the_next_one(
    bsmon_dir, processes, tmp_path
):
    """Two workers prefetch four batches at the epoch's start: a 32-sample epoch of 8 is all
    cut before its first step. The keys stay on, and the change waits for the next epoch."""
    gate = tmp_path / "gate"
    args = ("--workers", "2", "--samples", "32", "--epochs", "3", "--gate", str(gate))
    run = start(processes, "prefetched", *args)
    with JobConnection(job_socket("prefetched", bsmon_dir)) as conn:
        capability = conn.hello().capabilities["set_batch_size"]
        assert capability.available, capability.reason
        metrics_until(conn, lambda m: m.step >= 3)
        reply, events = ask_and_open(conn, 16, gate)
    steps = steps_of(finish(run))
    why = "its workers already prefetched the rest of this epoch"
    assert reply.result["applies_at"] == f"from the next epoch's first batch ({why})"
    assert [size for _, size, _ in steps] == [8] * 4 + [16] * 4  # 32 = 4 × 8, then 2 × 16
    assert_each_sample_once(steps, 3, 32)
    (change,) = [e for e in events if e.kind == "batch_size"]
    assert change.step == 4  # at the next epoch's start, not at the step after the request
