"""A loss summed over the batch is labelled so (issue 43): its reduction is read on the agent
thread from the loss tensor's graph, the metrics carry the label, and the Loss panel's title
shows the job's words."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bsmon.probes import attach
from bsmon.probes.runtime.losses import SUMMED, reduction_of
from bsmon.probes.wire import protocol
from bsmon.probes.wire.client import JobConnection
from bsmon.tui.session import ConnState, Snapshot
from bsmon.tui.widgets.charts import ScalarChart

torch.manual_seed(0)
X = torch.rand(8, 16)
LABELS = torch.zeros(8, dtype=torch.long)
MODEL = nn.Linear(16, 16)


def summed() -> torch.Tensor:
    return F.mse_loss(MODEL(X), X, reduction="sum")


def vae_like() -> torch.Tensor:
    """pytorch/examples' VAE: a summed binary cross-entropy plus a KL term under torch.sum."""
    out = MODEL(X)
    recon, mu = torch.sigmoid(out), out[:, :4]
    kld = -0.5 * torch.sum(1 + mu - mu.pow(2) - mu.exp())
    return F.binary_cross_entropy(recon, X, reduction="sum") + kld


LOSSES = {
    "a VAE's sum": (vae_like, "sum"),
    "mse, reduction='sum'": (summed, "sum"),
    "AMP's scaled sum": (lambda: summed() * torch.tensor(2.0**16), "sum"),
    "cross-entropy's mean": (lambda: F.cross_entropy(MODEL(X), LABELS), "mean"),
    "a mean by hand": (lambda: (MODEL(X) - X).pow(2).mean(), "mean"),
    "a sum divided by the batch": (lambda: summed() / 8, None),
    "a number": (lambda: 1.5, None),
}  # fmt: skip


@pytest.mark.parametrize("name", LOSSES)
def test_the_reduction_is_read_from_the_losss_graph(name):
    make, expected = LOSSES[name]
    assert reduction_of(make()) == expected


@pytest.mark.parametrize("sums", [True, False])
def test_a_summed_loss_is_labelled_in_the_metrics_and_an_event_once(bsmon_dir, sums):
    model = nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    mon = attach(model, optimizer, name="units", record=False)
    with mon, JobConnection(mon.socket_path) as conn:
        conn.hello()
        for _ in range(40):
            loss = F.mse_loss(model(X), X, reduction="sum" if sums else "mean")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mon.log(loss=loss)
        assert mon.flush()
        metrics = conn.wait_matching(
            lambda m: isinstance(m, protocol.Metrics) and m.step >= 40, "metrics at step 40"
        )
        said = [e for e in mon.job.telemetry.events if e.kind == "loss_units"]
    if sums:
        assert metrics.scalar_notes == {"loss": SUMMED}
        assert len(said) == 1 and "per example it is the value shown divided" in said[0].message
    else:
        assert metrics.scalar_notes == {} and said == []


def test_the_loss_panels_title_is_the_jobs_label():
    point = protocol.MetricsPoint(t=1.0, step=10, scalars={"loss": 35_238.0})
    latest = protocol.Metrics(
        t=1.0, step=10, batch_size=64, step_time_s=0.1, samples_per_s=640.0, b_simple=None,
        scalars={"loss": 35_238.0}, scalar_notes={"loss": SUMMED},
    )  # fmt: skip
    snap = Snapshot(ConnState.LIVE, "", "vae", latest=latest, points=(point,))
    assert ScalarChart.title(snap) == "Loss (summed over the batch)"
    plain = Snapshot(ConnState.LIVE, "", "vae", points=(point,))
    assert ScalarChart.title(plain) == "Loss"
