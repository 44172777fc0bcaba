"""The corpus (tests/corpus/README.md): scripts that reproduce the patterns of real training
code, each run bare, under `bsmon run --headless`, and with `attach()` in the script. bsmon
must leave the job's output and exit code as they are, attach or say in one line why not,
count steps and samples right, and show B_simple where it can or say why it cannot."""

from __future__ import annotations

import functools
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from bsmon.probes.anatomy.sampling import DEFAULT_STRIDE, STRIDE_VARIABLE
from bsmon.probes.launch import autoattach
from bsmon.probes.noise.budget import BUDGET_VARIABLE, EVERY_STEP
from bsmon.probes.record.reader import open_record
from bsmon.probes.summary.build import paths_beside
from bsmon.probes.summary.schema import Summary
from bsmon.probes.wire import protocol

from ..helpers import ROOT, Processes

CORPUS = ROOT / "tests" / "corpus"
TIMEOUT_S = 240
RUN, ATTACH = "run", "attach"
ESTIMATE = "an estimate"  # B_simple is expected, not a reason
STOPS = "stops: "  # + the reason the note gives at the end, whether or not it estimated first


@dataclass(frozen=True)
class Case:
    script: str
    steps: int
    samples: dict[str, int | None] | None  # per mode; None: not checked (see the case)
    noise: dict[str, str]  # per mode: ESTIMATE, or what the reason for none must say
    args: tuple[str, ...] = ()
    exit_code: int = 0
    noise_budget: str | None = None  # BSMON_NOISE_BUDGET, where the default's is not the point

    @property
    def name(self) -> str:
        return " ".join((self.script.removesuffix(".py"), *self.args))

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(self.noise)


def both(value: object) -> dict:
    return {RUN: value, ATTACH: value}


# The first step of a job without a DataLoader has no count: bsmon registers its hooks only
# once the first step is over (by then torch.compile, if the job uses it, has shown itself).
CASES = [
    Case("gpt.py", 80, both(79 * 12), both(ESTIMATE)),
    # the micro-batch estimator measured on every step: the warm-up's allowance, priced from
    # step times, bought 27 to 60 measured steps of these 60 on a busy machine, and the
    # estimate resolves after about 30 (the warm-up's own tests are tests/unit/test_noise_warmup.py)
    Case(
        "gpt.py",
        60,
        both(59 * 12 * 4),
        both(ESTIMATE),
        args=("--steps", "60", "--accumulate", "4"),
        noise_budget=EVERY_STEP,
    ),
    Case("lstm_lm.py", 80, both(79 * 8), both(ESTIMATE)),
    Case("ema.py", 56, both(8 * 200), both(ESTIMATE)),
    Case("hf_order.py", 60, both(59 * 16), both(ESTIMATE)),
    Case("lbfgs.py", 12, both(11 * 64), both("LBFGS evaluates its closure several times")),
    # a GAN's discriminator sees real and generated batches and the generator's pass too:
    # there is no one right count of its samples, so none is checked
    Case("gan.py", 60, None, both("ran through this model"), exit_code=3),
    Case("compiled.py", 40, {RUN: 39 * 16, ATTACH: None}, both("compile")),
    Case("lightning_job.py", 60, both(15 * 100), both(ESTIMATE)),
    # the model and its EMA copy held by one module the script calls (timm's TrainingTask)
    Case("ema.py", 56, both(8 * 200), both(ESTIMATE), args=("--task",)),
    # accelerate: 3 epochs of 128 micro-batches of 16, 4 per optimizer step
    Case("accelerate_accum.py", 96, both(3 * 2048), both(ESTIMATE)),
    # a loss summed over the batch (pytorch/examples' VAE): 2 epochs of 32 batches of 32
    Case("vae.py", 64, both(2 * 1024), both(ESTIMATE)),
    # one optimizer per layer, the second from the second epoch on: bsmon run follows it once
    # it steps alone (attach() is given the first, and counts its steps only); the noise scale
    # measured the first's parameters and stops, saying why (whether its first 200 steps
    # resolved an estimate depends on how many a busy machine lets it measure)
    Case("layerwise.py", 400, {RUN: 2 * 3200}, {RUN: STOPS + "SGD stopped stepping at step 200"}),
    Case("layerwise.py", 400, both(2 * 3200), both(ESTIMATE), args=("--together",)),
]


RECORD_LINE = "bsmon: the record of "


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str
    records: list[Path]


def run(
    script: str,
    args: tuple[str, ...],
    mode: str,
    bsmon_dir: Path,
    launcher: tuple[str, ...] = (),
    timeout: float = TIMEOUT_S,
) -> Outcome:
    """``script`` run bare, under ``bsmon run``, or attaching itself (``mode``); with
    ``launcher`` (``-m torch.distributed.run ...``) started through it."""
    env = {**os.environ, "BSMON_DIR": str(bsmon_dir)}
    env.pop("CORPUS_ATTACH", None)
    command = [sys.executable, *launcher, script, *args]
    if mode == ATTACH:
        env["CORPUS_ATTACH"] = "1"
    elif mode == RUN:
        command = [sys.executable, "-m", "bsmon.tui.cli", "run", "--headless", "--", *command]
    processes = Processes()
    try:
        process = processes.start(command, cwd=CORPUS, env=env, text=True)
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        processes.cleanup()
    records = sorted((bsmon_dir / "records").glob("*.jsonl"))
    if mode == RUN:  # bsmon run's own last line says where the record is: the job's stay
        said = [line for line in stderr.splitlines(keepends=True) if RECORD_LINE in line]
        assert len(said) == len(records), (said, records)
        assert all(str(record) in "".join(said) for record in records), (said, records)
        stderr = "".join(line for line in stderr.splitlines(keepends=True) if line not in said)
    return Outcome(process.returncode, stdout, stderr, records)


@functools.cache
def bare(script: str, args: tuple[str, ...], tmp: str, launcher: tuple[str, ...] = ()) -> Outcome:
    """The script without bsmon (one run per script, shared by the modes)."""
    return run(script, args, "bare", Path(tmp), launcher)


@pytest.fixture(scope="module")
def bare_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("bare"))


def summary_of(record: Path) -> Summary:
    return msgspec.json.decode(paths_beside(record)[0].read_bytes(), type=Summary)


@pytest.mark.parametrize(
    "case, mode",
    [(case, mode) for case in CASES for mode in case.modes],
    ids=lambda v: v.name if isinstance(v, Case) else v,
)
def test_bsmon_changes_nothing_and_measures_right(case, mode, bsmon_dir, bare_dir, monkeypatch):
    # the anatomy's base stride, held: left to follow the step rate it widens from the first
    # tick on fast steps (compiled.py's 38 after compiling once got 2 sampled, not ≥ 3)
    monkeypatch.setenv(STRIDE_VARIABLE, "-".join(map(str, DEFAULT_STRIDE)))
    if case.noise_budget is not None:
        monkeypatch.setenv(BUDGET_VARIABLE, case.noise_budget)
    plain = bare(case.script, case.args, bare_dir)
    assert plain.code == case.exit_code, plain.stderr[-2000:]
    outcome = run(case.script, case.args, mode, bsmon_dir)
    assert outcome.code == plain.code, outcome.stderr[-2000:]
    assert outcome.stdout == plain.stdout
    assert outcome.stderr == plain.stderr
    assert len(outcome.records) == 1, outcome.records  # attached: one session, recorded
    summary = summary_of(outcome.records[0])
    assert summary.steps == case.steps
    if case.samples is not None:
        assert summary.samples == case.samples[mode]
    expected = case.noise[mode]
    if expected == ESTIMATE:
        assert summary.b_simple.end is not None, summary.b_simple.note
    elif expected.startswith(STOPS):
        assert expected.removeprefix(STOPS) in (summary.b_simple.note or "")
    else:
        assert summary.b_simple.end is None
        assert expected in (summary.b_simple.note or ""), summary.b_simple.note
    stalls = [w for w in summary.warnings if "stall" in w.message]
    assert not stalls, stalls
    anatomy = summary.anatomy  # every sampled step has a backward pass to split it at
    _, high = DEFAULT_STRIDE  # one step sampled in every 4 to `high`
    assert anatomy is not None and anatomy.steps >= (case.steps - 2) // high, anatomy
    phases = (anatomy.data_s, anatomy.forward_s, anatomy.backward_s, anatomy.optimizer_s)
    parts = sum(p or 0.0 for p in (*phases, anatomy.comm_s, anatomy.other_s))
    assert parts == pytest.approx(anatomy.step_s, rel=1e-3)


@pytest.mark.parametrize("mode", [RUN, ATTACH])
def test_a_loss_summed_over_the_batch_is_labelled_so(mode, bsmon_dir):
    """The VAE's loss is the batch's sum (the script prints it per example): the record's
    event, the summary and every metrics message say "summed over the batch" (issue 43)."""
    outcome = run("vae.py", (), mode, bsmon_dir)
    assert outcome.code == 0, outcome.stderr[-2000:]
    record = outcome.records[0]
    lines = [msgspec.json.decode(line) for line in record.read_bytes().splitlines()]
    said = [x for x in lines if x.get("type") == "event" and x["kind"] == "loss_units"]
    assert len(said) == 1 and said[0]["data"] == {"loss": "summed over the batch"}, said
    assert "divided by the batch size" in said[0]["message"]
    loss = summary_of(record).scalars["loss"]
    assert loss.note == "summed over the batch"
    assert loss.first > 32 * 40  # the sum of 32 examples of about 44 each, as computed


@pytest.mark.parametrize("mode", [RUN, ATTACH])
def test_a_gpt_script_s_tokens_per_example_and_flops_are_said_and_its_mfu_is_n_a_on_a_cpu(
    mode, bsmon_dir
):
    """gpt.py cuts batches of 12 sequences of 16 tokens by hand (docs/throughput.md): the
    record's one throughput event says 16 tokens per example, and why there is no MFU on a
    CPU."""
    outcome = run("gpt.py", (), mode, bsmon_dir)
    assert outcome.code == 0, outcome.stderr[-2000:]
    lines = [msgspec.json.decode(line) for line in outcome.records[0].read_bytes().splitlines()]
    said = [x for x in lines if x.get("type") == "event" and x["kind"] == "throughput"]
    assert len(said) == 1, said
    cpu = "MFU n/a: the model runs on the CPU (no peak FLOP/s)"
    assert said[0]["message"] == f"16 tokens per example · {cpu}"
    assert said[0]["data"]["seq_len"] == 16


def test_lightning_evaluation_and_short_batches_read_true(bsmon_dir, monkeypatch):
    """The validation loop's time is its own, and each epoch's short last batch (4 of 32)
    is not a change of batch size. The anatomy samples one step in 1–2 here: its means are
    then over ~40 of the 60 steps, not ~6, of which one step preempted under the suite's load
    once took the optimizer's mean past the bound. Evaluation counted in the steps would slow
    one step an epoch, 15 of the 59 timed: the 95th percentile shows it, where the 99th is
    the slowest step alone (one preempted under the suite's load read 25 ms against 1 ms)."""
    monkeypatch.setenv(STRIDE_VARIABLE, "1-2")
    outcome = run("lightning_job.py", (), RUN, bsmon_dir)
    summary = summary_of(outcome.records[0])
    assert [size.batch_size for size in summary.batch_sizes] == [32]
    assert [segment.batch_size for segment in summary.batch_size_history] == [32]
    assert summary.time.evaluation_s > 0
    assert summary.time.steps_s + summary.time.evaluation_s <= summary.duration_s
    assert summary.step_time_s.p95 < 20 * summary.step_time_s.p50
    anatomy = summary.anatomy  # Lightning's closure steps: forward and backward are not optimizer
    assert anatomy is not None and anatomy.data_s is not None and anatomy.optimizer_s is not None
    assert anatomy.optimizer_s < anatomy.forward_s + anatomy.backward_s


def test_a_script_without_an_optimizer_is_not_monitored_and_says_why(bsmon_dir, bare_dir):
    plain = bare("manual_sgd.py", (), bare_dir)
    outcome = run("manual_sgd.py", (), RUN, bsmon_dir)
    assert outcome.code == plain.code == 0 and outcome.stdout == plain.stdout
    reason = f"bsmon: manual_sgd was not monitored: {autoattach.HAND_UPDATES}\n"
    assert outcome.stderr == plain.stderr + reason  # one line, after the job's own output
    (record,) = outcome.records
    summary = summary_of(record)
    assert summary.steps == 0
    assert summary.run.end_reason == f"bsmon did not attach: {autoattach.HAND_UPDATES}"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "bsmon now counts the steps of Adam over 2 tensors: it stepped 128 times in a row"),
        (("--together",), "bsmon counts a step each time SGD over 2 tensors steps"),
    ],
)
def test_optimizers_stepped_one_after_the_other_count_one_step_an_iteration(bsmon_dir, args, said):
    """One optimizer per layer, one after the other (layerwise.py): a step is an iteration,
    whichever optimizer steps in it, the loss shown is the iteration's, and an event says
    which optimizer's steps are counted."""
    outcome = run("layerwise.py", args, RUN, bsmon_dir)
    assert outcome.code == 0, outcome.stderr[-2000:]
    found = re.search(r"iterations (\d+), last loss (\S+)", outcome.stdout)
    assert found is not None, outcome.stdout
    (record,) = outcome.records
    summary = summary_of(record)
    assert summary.steps == int(found[1])
    assert summary.scalars["loss"].last == pytest.approx(float(found[2]), rel=1e-5)
    with open_record(record) as reader:
        events = [line.message for line in reader.lines() if isinstance(line, protocol.Event)]
    assert any(said in message for message in events), events
    assert summary.time.other_s < summary.time.steps_s / 4  # no second phase counted as other


def episode_examples(stdout: str) -> list[int]:
    """episodes.py's own count of each episode's examples (one episode per step)."""
    (line,) = [line for line in stdout.splitlines() if line.startswith("examples per episode")]
    return [int(n) for n in line.split()[3:]]


def test_episodes_of_every_length_show_a_batch_size_that_varies(bsmon_dir):
    """One step per episode, as long as the episode (pytorch/examples' reinforce.py): the
    size is not frozen at the first episode's; the stretch whose size varies says the range
    of the examples its steps had, by the script's own count."""
    outcome = run("episodes.py", (), RUN, bsmon_dir)
    examples = episode_examples(outcome.stdout)
    summary = summary_of(outcome.records[0])
    assert summary.samples == sum(examples[1:])  # the first step is not counted
    last = summary.batch_size_history[-1]
    covered = examples[last.from_step - 1 : last.to_step]
    assert last.to_step == len(examples) and last.from_step <= 4, summary.batch_size_history
    assert last.batch_size is None
    assert last.varies == f"varies {min(covered)}–{max(covered)} per step"


@pytest.mark.parametrize("mode", [RUN, ATTACH])
def test_a_one_dimensional_state_is_one_example_per_call(mode, bsmon_dir):
    """actor_critic.py's model takes a [4] state: one example, not four."""
    outcome = run("episodes.py", ("--unbatched",), mode, bsmon_dir)
    examples = episode_examples(outcome.stdout)
    assert summary_of(outcome.records[0]).samples == sum(examples[1:])


def test_a_one_dimensional_input_bsmon_cannot_explain_is_not_counted_and_says_why(bsmon_dir):
    outcome = run("episodes.py", ("--flat",), RUN, bsmon_dir)
    summary = summary_of(outcome.records[0])
    assert summary.samples is None
    reasons = [w.message for w in summary.warnings if w.message.startswith("samples not counted")]
    assert len(reasons) == 1 and "the model's input [8] has one dimension" in reasons[0], reasons
