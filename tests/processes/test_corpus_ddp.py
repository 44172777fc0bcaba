"""DistributedDataParallel behind a framework's wrapper (tests/corpus/ddp_wrapped.py: the DDP
model is an attribute of a module the script calls, as in Lightning Fabric and timm), two
real ranks over gloo started by torchrun: recognised under `bsmon run` and with `attach()` of
the wrapper — B_simple from the ranks' all-reduce, the all-reduce wait in the step anatomy,
every rank's compute in rank 0's ranks view; and a distributed run whose ranks train alone
told so in the words of the mode it runs in."""

from __future__ import annotations

import sys

import msgspec
import pytest

from bsmon.probes.wire import protocol
from bsmon.probes.wire.client import JobConnection

from ..watch import job_socket, kill_run_processes, metrics_until
from .test_corpus import ATTACH, CORPUS, RUN, Outcome, bare, run, summary_of

TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
SCRIPT = "ddp_wrapped.py"
STEPS = 200
TIMEOUT_S = 300


@pytest.fixture(autouse=True)
def no_strays(bsmon_dir):
    """torchrun's workers run in sessions of their own: killed after each test."""
    yield
    kill_run_processes(bsmon_dir)


# torch's own teardown, seen once in a bare run (no bsmon loaded): both ranks abort at exit
# after the script's last line, a std::thread destroyed while joinable
TEARDOWN_ABORT = "terminate called without an active exception"


def reference_run(args: tuple[str, ...], tmp: str) -> Outcome:
    """The bare run the bsmon runs are compared with; taken again, up to twice, when torch
    aborted at exit after printing everything (the reference is the script's output, not
    torch's teardown; under CI's load a bare run aborted so twice in a row)."""
    plain = bare(SCRIPT, args, tmp, TORCHRUN)
    for attempt in range(2):
        if plain.code == 0 or TEARDOWN_ABORT not in plain.stderr:
            break
        plain = bare(SCRIPT, args, f"{tmp}/again{attempt}", TORCHRUN)
    return plain


@pytest.mark.slow
@pytest.mark.parametrize("mode", [RUN, ATTACH])
def test_ddp_inside_a_wrapper_is_recognised(mode, bsmon_dir, tmp_path):
    args = ("--steps", str(STEPS))
    plain = reference_run(args, str(tmp_path))
    assert plain.code == 0, plain.stderr[:1500] + " … " + plain.stderr[-1500:]
    outcome = run(SCRIPT, args, mode, bsmon_dir, TORCHRUN, TIMEOUT_S)
    assert outcome.code == 0, outcome.stderr[-2000:]
    assert outcome.stdout == plain.stdout
    assert len(outcome.records) == 2, outcome.records  # one per rank
    for record in outcome.records:
        summary = summary_of(record)
        assert summary.steps == STEPS and summary.samples == STEPS * 32
        assert summary.b_simple.end is not None, summary.b_simple.note
        anatomy = summary.anatomy
        assert anatomy is not None and anatomy.comm_s is not None, anatomy  # the all-reduce wait
        header = msgspec.json.decode(record.read_bytes().split(b"\n", 1)[0])
        assert header["session"]["ddp"] is True  # found inside the wrapper, as the noise scale does


@pytest.mark.slow
def test_rank_zero_sees_both_ranks_compute_and_the_ddp_estimator(bsmon_dir, processes, tmp_path):
    done = tmp_path / "done"
    command = [sys.executable, *TORCHRUN, SCRIPT, "--steps", str(STEPS), "--until", str(done)]
    job = processes.start(
        [sys.executable, "-m", "bsmon.tui.cli", "run", "--headless", "--", *command],
        cwd=CORPUS,
        text=True,
    )
    with JobConnection(job_socket("ddp_wrapped", bsmon_dir, timeout=120)) as conn:
        hello = conn.hello()
        assert "DDP comm hook" in hello.noise_scale.reason

        def both_ranks_timed(metrics: protocol.Metrics) -> bool:
            ranks = metrics.ranks.ranks if metrics.ranks is not None else []
            return len(ranks) == 2 and all(r.forward_s and r.backward_s for r in ranks)

        metrics = metrics_until(conn, both_ranks_timed, timeout=180)
    assert metrics.ranks is not None and all(r.comm_wait_s is not None for r in metrics.ranks.ranks)
    done.touch()
    assert job.wait(TIMEOUT_S) == 0


@pytest.mark.slow
def test_ranks_that_train_alone_are_told_why_in_bsmon_runs_words(bsmon_dir, tmp_path):
    outcome = run(SCRIPT, ("--steps", "40", "--alone"), RUN, bsmon_dir, TORCHRUN, TIMEOUT_S)
    assert outcome.code == 0, outcome.stderr[-2000:]
    for record in outcome.records:
        note = summary_of(record).b_simple.note or ""
        assert "is not DistributedDataParallel and holds none" in note, note
        assert "each rank training on its own" in note and "the noise scale is off" in note
        assert "attach(" not in note  # bsmon run's user never called it
