"""Step anatomy: where each step's time goes, against jobs whose truth is known."""

from __future__ import annotations

import itertools
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bsmon.probes import attach
from bsmon.probes.anatomy import marks as anatomy_marks
from bsmon.probes.anatomy.marks import PassMarks, StepMarks
from bsmon.probes.anatomy.phases import phases_of
from bsmon.probes.anatomy.sampling import (
    DEFAULT_STRIDE,
    STRIDE_VARIABLE,
    TIMED_PER_SECOND,
    AnatomySampler,
    stride_from_environment,
)
from bsmon.probes.anatomy.seconds import Phases, PhaseTotals
from bsmon.probes.anatomy.verdict import (
    SETTLE,
    Judgement,
    LoaderFacts,
    VerdictKeeper,
    judge,
)
from bsmon.probes.anatomy.window import RECENT_STEPS, PhaseWindow
from bsmon.probes.wire.protocol import StepAnatomy

# -- phases from marks (pure) -------------------------------------------------------------------


def one_pass(batch: float | None, start: float, end: float) -> PassMarks:
    return PassMarks(batch, start, end, start)


def test_a_plain_step_splits_into_data_forward_backward_optimizer_and_the_rest():
    # previous step ended at 0; zero_grad/logging 0-1, batch drawn 1-3, forward 3-6,
    # backward 6-10, clipping 10-11, optimizer 11-12
    marks = StepMarks((one_pass(3.0, 6.0, 10.0),), 11.0, 11.0, 2.0, 1)
    phases = phases_of(marks, 0.0, 12.0, 12.0)
    assert phases == Phases(data=2.0, forward=3.0, backward=4.0, optimizer=1.0, other=2.0)


def test_without_a_dataloader_data_is_not_measured_and_forward_starts_at_the_step():
    marks = StepMarks((one_pass(None, 5.0, 9.0),), 9.0, 9.0, 0.0, 0)
    phases = phases_of(marks, 0.0, 10.0, 10.0)
    assert phases == Phases(data=None, forward=5.0, backward=4.0, optimizer=1.0, other=0.0)


def test_accumulated_micro_batches_add_up():
    passes = (one_pass(1.0, 2.0, 4.0), one_pass(5.0, 6.0, 8.0))
    marks = StepMarks(passes, 8.0, 8.0, 2.0, 2)  # two draws of 1 s each: 0-1 and 4-5
    phases = phases_of(marks, 0.0, 9.0, 9.0)
    assert phases == Phases(data=2.0, forward=2.0, backward=4.0, optimizer=1.0, other=0.0)


def test_a_closure_step_keeps_forward_and_backward_out_of_the_optimizer():
    # Lightning's automatic optimization: optimizer.step(closure) at 1 runs forward 1-3 and
    # backward 3-6 inside, then updates 6-7
    marks = StepMarks((one_pass(1.0, 3.0, 6.0),), 1.0, 1.0, 1.0, 1)
    phases = phases_of(marks, 0.0, 7.0, 7.0)
    assert phases == Phases(data=1.0, forward=2.0, backward=3.0, optimizer=1.0, other=0.0)


def test_evaluation_hidden_in_the_forward_gap_is_taken_out_of_the_forward():
    # no DataLoader; an evaluation pass of 4 s ran between the steps (out of the training time)
    marks = StepMarks((one_pass(None, 6.0, 8.0),), 8.0, 8.0, 0.0, 0)
    phases = phases_of(marks, 0.0, 9.0, training_s=5.0)
    assert phases == Phases(data=None, forward=2.0, backward=2.0, optimizer=1.0, other=0.0)


def test_a_step_without_a_backward_pass_is_not_split():
    assert phases_of(StepMarks((), 1.0, 1.0, 0.0, 0), 0.0, 2.0, 2.0) is None
    assert phases_of(StepMarks((one_pass(None, 1, 2),), 2.0, 2.0, 0, 0), None, 3.0, 3.0) is None


# -- totals, window, verdict --------------------------------------------------------------------


def test_phase_totals_merge_exactly_and_keep_unmeasured_phases_none():
    a, b = PhaseTotals(), PhaseTotals()
    a.add(10.0, Phases(None, 4.0, 4.0, 1.0, 1.0))
    b.add(6.0, Phases(2.0, 1.0, 2.0, None, 1.0))
    b.add(6.0, Phases(2.0, 1.0, 2.0, None, 1.0))
    merged = a.merged(b)
    assert merged == PhaseTotals(3, 22.0, 4.0, 6.0, 8.0, 1.0, 3.0)
    assert a.merged(None) == a and a.steps == 1  # a copy; ``a`` itself unchanged


def test_the_window_averages_the_last_steps_only():
    window = PhaseWindow()
    for _ in range(RECENT_STEPS):
        window.add(1.0, Phases(0.5, 0.2, 0.2, 0.1, 0.0))
    for _ in range(RECENT_STEPS):
        window.add(2.0, Phases(0.0, 1.0, 0.8, 0.2, 0.0))
    recent = window.recent()
    assert recent is not None and recent.steps == RECENT_STEPS
    assert recent.step_s == pytest.approx(2.0) and recent.data_s == pytest.approx(0.0, abs=1e-9)
    assert recent.forward_s == pytest.approx(1.0)
    interval = window.take_interval()
    assert interval is not None and interval.steps == 2 * RECENT_STEPS
    assert window.take_interval() is None


def anatomy(**shares: float) -> StepAnatomy:
    values = {f"{k}_s": v for k, v in shares.items()}
    return StepAnatomy(steps=50, step_s=1.0, **values)


def test_the_verdicts_follow_the_stated_shares():
    assert judge(anatomy(data=0.25, forward=0.3, backward=0.4, other=0.05)).verdict == (
        "input-bound"
    )
    assert judge(anatomy(data=0.1, backward=0.4, comm=0.3)).verdict == "communication-bound"
    assert judge(anatomy(data=0.05, forward=0.2, backward=0.3, other=0.45)).verdict == (
        "host-bound"
    )
    assert judge(anatomy(data=0.05, forward=0.3, backward=0.6), gpu_util=40).verdict == (
        "host-bound"
    )
    compute = judge(anatomy(data=0.05, forward=0.35, backward=0.55, other=0.05))
    assert compute.verdict == "compute-bound" and "90%" in compute.evidence
    assert judge(StepAnatomy(steps=3, step_s=1.0, data_s=0.9)) is None  # too few steps


def test_input_advice_names_what_the_loader_lacks():
    bare = judge(anatomy(data=0.5), gpu_util=95, loader=LoaderFacts(0, False, None))
    assert "num_workers" in bare.advice and "pin_memory=True" in bare.advice
    busy = judge(anatomy(data=0.5), gpu_util=95, loader=LoaderFacts(8, True, 2))
    assert "now 8" in busy.advice and "pin_memory" not in busy.advice


def test_a_verdict_changes_only_after_it_settles():
    keeper = VerdictKeeper()
    compute = Judgement("compute-bound", "", "")
    data = Judgement("input-bound", "", "")
    assert keeper.update(compute) and keeper.current == compute
    for _ in range(SETTLE - 1):
        assert not keeper.update(data)
    assert not keeper.update(compute)  # a single slow spell does not flip it
    for _ in range(SETTLE - 1):
        assert not keeper.update(data)
    assert keeper.update(data) and keeper.current == data


# -- real loops ---------------------------------------------------------------------------------

FEATURES = 64


class SleepyImages(Dataset):
    """Each item sleeps ``delay`` seconds; the time spent inside ``__getitem__`` is the truth."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.inside = 0.0

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        began = time.perf_counter()
        time.sleep(self.delay)
        item = torch.randn(FEATURES), torch.tensor(index % 10)
        self.inside += time.perf_counter() - began
        return item


def mlp(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, width), nn.ReLU(), nn.Linear(width, 10))


def train(loader, model, steps: int, **options):
    """Train ``steps`` steps; the anatomy and the truth over the same steps (the first left
    out: it has no start)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ends = []
    inside = []
    with attach(model, optimizer, serve=False, record=False, **options) as mon:
        for step, (x, y) in enumerate(loader, 1):
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ends.append(time.perf_counter())
            inside.append(loader.dataset.inside if hasattr(loader.dataset, "inside") else 0.0)
            if step == steps:
                break
        assert mon.flush()
        stats = mon.stats()
    assert stats["errors"] == 0
    wall = ends[-1] - ends[0]
    truth = (inside[-1] - inside[0]) / wall
    return stats["anatomy"], truth


@pytest.fixture
def every_step(monkeypatch):
    """The anatomy times every step (it samples one in 4 to 12 by default)."""
    monkeypatch.setenv(STRIDE_VARIABLE, "1")


def test_an_input_bound_job_shows_its_injected_data_share_within_five_points(every_step):
    torch.manual_seed(0)
    loader = DataLoader(SleepyImages(0.003), batch_size=8)  # 24 ms of sleep per batch
    reading, truth = train(loader, mlp(256), steps=60)
    assert reading is not None and reading["steps"] == 59
    share = reading["data_s"] / reading["step_s"]
    assert truth > 0.2  # the injected share really is large
    assert abs(share - truth) <= 0.05, (share, truth, reading)
    assert reading["verdict"] == "input-bound", reading
    assert "num_workers" in reading["advice"]
    parts = sum(reading[k] for k in ("data_s", "forward_s", "backward_s", "optimizer_s", "other_s"))
    assert parts == pytest.approx(reading["step_s"], rel=1e-6)


def test_sampled_steps_are_split_as_truly_as_every_step():
    torch.manual_seed(0)
    model = mlp(256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = SleepyImages(0.003)
    sampled_wall = sampled_inside = 0.0
    with attach(model, optimizer, serve=False, record=False, noise_scale=None) as mon:
        before = (time.perf_counter(), 0.0)
        for step, (x, y) in enumerate(DataLoader(dataset, batch_size=8), 1):
            sampled = mon._hot.sampling  # decided at the previous step's end
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            now = (time.perf_counter(), dataset.inside)
            if sampled:
                sampled_wall += now[0] - before[0]
                sampled_inside += now[1] - before[1]
            before = now
            if step == 160:
                break
        assert mon.flush()
        reading = mon.stats()["anatomy"]
    assert reading is not None and 159 // 12 <= reading["steps"] <= 159 // 4 + 1
    share = reading["data_s"] / reading["step_s"]
    assert abs(share - sampled_inside / sampled_wall) <= 0.05, (share, reading)


def test_the_stride_variable_is_read_and_a_wrong_one_is_said():
    assert stride_from_environment("1") == ((1, 1), None)
    assert stride_from_environment("2-6") == ((2, 6), None)
    for wrong in ("0", "6-2", "every", "1-x"):
        stride, why = stride_from_environment(wrong)
        assert stride == DEFAULT_STRIDE and why is not None and STRIDE_VARIABLE in why


def test_the_sampler_times_one_step_in_its_stride_and_never_two_in_a_row():
    sampler = AnatomySampler((4, 12))
    timed = [step for step in range(1, 2001) if sampler.due(step)]
    gaps = [b - a for a, b in itertools.pairwise(timed)]
    assert timed[0] == 2 and min(gaps) == 4 and max(gaps) == 12
    assert 7.0 < sum(gaps) / len(gaps) < 9.0  # uniform on 4..12: a mean of 8


def mean_gap(sampler: AnatomySampler, steps: int = 200_000) -> float:
    timed = [step for step in range(1, steps) if sampler.due(step)]
    return (timed[-1] - timed[0]) / (len(timed) - 1)


def test_on_fast_steps_the_sampler_times_about_so_many_a_second_and_on_slow_ones_its_stride():
    sampler = AnatomySampler()
    sampler.follow_rate(300e-6)  # a small model on a CPU: 3,333 steps a second
    expected = 1 / (300e-6 * TIMED_PER_SECOND)  # ~133 steps between timed ones
    assert expected * 0.9 < mean_gap(sampler) < expected * 1.1
    assert sampler.stride[0] < expected < sampler.stride[1]  # still drawn at random
    sampler.follow_rate(0.5)  # a slow step: the base stride again
    assert sampler.stride == DEFAULT_STRIDE
    sampler.follow_rate(None)  # no step time yet: as it was
    assert sampler.stride == DEFAULT_STRIDE


def test_a_stride_set_by_hand_holds_whatever_the_step_time():
    sampler = AnatomySampler((1, 1), follows_rate=False)
    sampler.follow_rate(300e-6)
    assert sampler.stride == (1, 1) and mean_gap(sampler, 1000) == 1


def test_a_compute_heavy_job_is_compute_bound(every_step):
    torch.manual_seed(0)
    # whole batches made ahead (collating 256 samples one by one would itself take a share)
    batches = [(torch.randn(256, FEATURES), torch.randint(0, 10, (256,))) for _ in range(30)]
    loader = DataLoader(batches, batch_size=None)
    model = nn.Sequential(
        nn.Linear(FEATURES, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 10),
    )  # fmt: skip
    reading, _ = train(loader, model, steps=30)
    assert reading["verdict"] == "compute-bound", reading
    model_share = (reading["forward_s"] + reading["backward_s"]) / reading["step_s"]
    assert model_share > 0.6
    assert reading["data_s"] / reading["step_s"] < 0.2


def test_the_backward_wrapper_is_there_only_on_sampled_steps_and_closing_removes_it(monkeypatch):
    monkeypatch.setenv(STRIDE_VARIABLE, "4-12")  # held, whatever these small steps' time
    model = mlp(8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    original = torch.autograd.backward
    x, y = torch.randn(4, FEATURES), torch.randint(0, 10, (4,))

    def wrapped_steps(mon, steps: int) -> int:
        wrapped = 0
        for _ in range(steps):
            wrapped += torch.autograd.backward is not original
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        return wrapped

    with attach(model, optimizer, serve=False, record=False, step_anatomy=False) as mon:
        assert wrapped_steps(mon, 20) == 0 and mon.stats()["anatomy"] is None
    with attach(model, optimizer, serve=False, record=False, noise_scale=None) as mon:
        wrapped = wrapped_steps(mon, 200)
        assert 199 // 12 <= wrapped <= 199 // 4 + 1  # one step in 4 to 12
    assert torch.autograd.backward is original and not anatomy_marks.backward_calls.installed


def test_a_backward_on_another_thread_is_not_this_jobs():
    import threading

    model, other = mlp(8), mlp(8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, optimizer, serve=False, record=False) as mon:
        x, y = torch.randn(4, FEATURES), torch.randint(0, 10, (4,))
        for _ in range(3):
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        thread = threading.Thread(
            target=lambda: nn.functional.cross_entropy(other(x), y).backward()
        )
        thread.start()
        thread.join()
        marks = mon._phases.take()
    assert marks.passes == ()


def test_the_record_summary_and_replay_carry_the_breakdown(tmp_path, every_step):
    from bsmon.probes.summary.build import summarize_record
    from bsmon.probes.summary.markdown import render_markdown
    from bsmon.tui.replay import RecordSource, load_replay

    torch.manual_seed(0)
    model = mlp(64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "run.jsonl"
    loader = DataLoader(SleepyImages(0.003), batch_size=8)
    with attach(model, optimizer, serve=False, record=path, noise_scale=None):
        for step, (x, y) in enumerate(loader, 1):
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            if step == 40:
                break
    summary = summarize_record(path)
    anatomy = summary.anatomy
    assert anatomy is not None and anatomy.steps == 39
    assert anatomy.verdict == "input-bound" and anatomy.data_s / anatomy.step_s > 0.2
    assert anatomy.step_s * anatomy.steps == pytest.approx(summary.time.steps_s, rel=0.01)
    assert any(note.kind == "step_input_bound" for note in summary.recommendations)
    markdown = render_markdown(summary)
    assert "## Where the step time went" in markdown and "**input-bound**" in markdown
    assert "| waiting for data |" in markdown and "all-reduce" in markdown
    anatomy.steps, anatomy.verdict = 8, None  # a short run: too few sampled steps
    assert (
        "No verdict: 8 steps were split, and a verdict needs 10 (bsmon splits one step in 4 to 12"
        in (render_markdown(summary))
    )

    data = load_replay(path)
    assert sum(span.phases.steps for span in data.spans if span.phases) == 39
    latest = RecordSource(data)._metrics(len(data.spans) - 1, data.stop - 1e-6)
    assert latest.anatomy is not None and latest.anatomy.data_s is not None
    assert latest.anatomy.verdict in (None, "input-bound")  # a short last span: maybe none
    assert latest.anatomy.steps < 39  # before the end: the last span's steps
    at_end = RecordSource(data)._metrics(len(data.spans) - 1, data.stop).anatomy
    assert at_end is not None and at_end.steps == 39  # at the end: the whole run (finding 19)
    assert at_end.verdict == "input-bound" and at_end.step_s == pytest.approx(anatomy.step_s)
