"""The dashboard's session model: states, history pooling, and a job that restarts."""

from __future__ import annotations

from bsmon.probes.wire import protocol
from bsmon.tui.session import ConnState, SessionModel

from ..scripted import messages, session


def live_metrics(t: float, step: int, steps: int = 5, loss: float = 1.0) -> protocol.Metrics:
    return protocol.Metrics(
        t=t,
        step=step,
        batch_size=8,
        step_time_s=0.01,
        samples_per_s=800.0,
        b_simple=None,
        steps_in_window=steps,
        scalars={"loss": loss},
    )


def test_states_follow_the_connection():
    model = SessionModel("job", clock=lambda: 0.0)
    assert model.snapshot().state is ConnState.CONNECTING
    for message in messages():
        model.feed(message)
    assert model.snapshot().state is ConnState.LIVE
    model.disconnected("gone")
    snap = model.snapshot()
    assert snap.state is ConnState.DISCONNECTED and snap.detail == "gone"
    assert snap.latest is not None and snap.points  # the last data is kept
    model.feed(messages()[0])  # the same job's hello again: reconnected
    assert model.snapshot().state is ConnState.LIVE and model.snapshot().points


def test_live_metrics_are_pooled_into_one_second_points():
    model = SessionModel("job")
    model.feed(messages()[0])
    base = len(model.snapshot().points)
    for i in range(25):  # 2.5 s of 10 Hz metrics
        model.feed(live_metrics(t=100.0 + i * 0.1, step=5 * (i + 1), loss=float(i)))
    points = model.snapshot().points[base:]
    assert 2 <= len(points) <= 3  # two full seconds and the second in progress
    assert sum(p.steps for p in points) == 125
    assert points[-1].step == 125
    assert points[0].scalars["loss"] < points[-1].scalars["loss"]


def test_a_restarted_job_replaces_the_old_history():
    model = SessionModel("job")
    for message in messages():
        model.feed(message)
    assert model.snapshot().points and model.snapshot().events
    restarted = protocol.Hello(
        protocol=1,
        session=session(),
        step=0,
        batch_size=8,
        capabilities={},
        gpu=protocol.Capability(False, "x"),
        noise_scale=protocol.Capability(False, "x"),
    )
    restarted.session.pid = 9999
    model.feed(restarted)
    snap = model.snapshot()
    assert snap.points == () and snap.events == () and snap.latest is None
    assert snap.session.pid == 9999


def test_bye_means_finished_and_is_not_overridden_by_the_disconnect():
    model = SessionModel("job")
    for message in messages():
        model.feed(message)
    model.feed(protocol.Bye(reason="closed", t=5.0))
    model.disconnected("the job closed the connection")
    assert model.snapshot().state is ConnState.FINISHED


def test_live_points_carry_the_step_anatomy_and_keep_it_when_merged():
    """The `t` view's run chart is drawn from the points' anatomy: live points must carry
    it (they did not: the chart stayed empty when the dashboard opened with the job)."""
    from bsmon.probes.record.history import merge_anatomy

    from ..scripted import anatomy_reading

    model = SessionModel("job")
    model.feed(messages()[0])
    base = len(model.snapshot().points)
    for i in range(25):
        metrics = live_metrics(t=100.0 + i * 0.1, step=5 * (i + 1))
        metrics.anatomy = anatomy_reading(2500 if i >= 10 else 100, 0.04)
        model.feed(metrics)
    points = model.snapshot().points[base:]
    assert points and all(p.anatomy is not None for p in points)
    early, late = points[0].anatomy, points[-1].anatomy
    assert early.data_s / early.step_s < 0.1 < late.data_s / late.step_s  # it follows the job
    one, two = anatomy_reading(100, 0.04), anatomy_reading(2500, 0.04)
    both = merge_anatomy(one, two)
    assert both.steps == one.steps + two.steps
    assert abs(both.data_s - (one.data_s + two.data_s) / 2) < 1e-12
    assert merge_anatomy(None, two) is two and merge_anatomy(one, None) is one
