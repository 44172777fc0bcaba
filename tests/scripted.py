"""Deterministic scripted sessions for dashboard tests and snapshots."""

from __future__ import annotations

import math

from bsmon.probes.wire import protocol
from bsmon.probes.wire.protocol import (
    BatchChange,
    BatchReading,
    Capability,
    DeviceReading,
    HostReading,
    MemoryPoint,
    MetricsPoint,
    NoiseScaleReading,
)
from bsmon.tui.app import BsmonApp
from bsmon.tui.sources import ScriptedSource

START = 1_700_000_000.0
NOW = START + 754.0  # 12 min 34 s into the run


def session(name: str = "resnet-cifar") -> protocol.SessionInfo:
    return protocol.SessionInfo(
        name=name,
        pid=4242,
        host="gpu-box-7",
        argv=["train.py"],
        start_time=START,
        python="3.11.7",
        torch_version="2.13.0",
        bsmon_version="0.1.0",
        cwd="/work",
    )


def gpu_devices() -> list[DeviceReading]:
    return [
        DeviceReading(
            index=0,
            name="NVIDIA H100 80GB HBM3",
            uuid="GPU-1",
            util_percent=93.0,
            memory_used_bytes=int(61.2 * 2**30),
            memory_total_bytes=int(79.6 * 2**30),
            temperature_c=67.0,
            power_w=512.0,
            torch_allocated_bytes=int(48.3 * 2**30),
            torch_reserved_bytes=int(58.0 * 2**30),
            torch_peak_bytes=int(55.1 * 2**30),
            torch_reserved_peak_bytes=int(59.0 * 2**30),
            alloc_retries=0,
            ooms=0,
        )
    ]


NOISE_CAPABILITY = Capability(True, "per-example gradient norms in the backward pass (auto)")


def noise_reading(step: int) -> NoiseScaleReading | None:
    """A noise scale that rises over the run (as it does while the loss falls), with a 95%
    band that narrows as the averages fill; none before 30 measured steps."""
    if step < 30:
        return None
    b = 300 + 1100 * (1 - math.exp(-step / 900)) + 40 * math.sin(step / 170)
    rel = 0.35 / math.sqrt(min(step, 1000) / 30)
    return NoiseScaleReading(
        b_simple=b,
        stderr=b * rel / 1.96,
        estimator="per_example",
        coverage=1.0,
        samples=step,
        ci_low=b / (1 + rel),
        ci_high=b * (1 + rel),
        needed=30,
        effective=min(step, 1000.0),
        detail="per example, 100% of trainable parameters",
    )


def batch_reading(gpu: bool) -> BatchReading:
    memory = [
        MemoryPoint(batch_size=64, peak_bytes=int(31.0 * 2**30), steps=900),
        MemoryPoint(batch_size=128, peak_bytes=int(55.1 * 2**30), steps=2100),
    ]
    return BatchReading(
        control=True,
        min_size=1,
        next_up=192,  # a policy of steps of 64
        next_down=64,
        memory=memory if gpu else [],
        memory_budget_bytes=int(78.4 * 2**30) if gpu else None,
        predicted_max=164 if gpu else None,
        changes=[
            BatchChange(
                step=900,
                t=START + 225,
                old=64,
                new=128,
                reason="step up",
                source="monitor",
                samples_per_s_before=2210.0,
                samples_per_s_after=2990.0,
            )
        ],
    )


HELD_BY_MEMORY = (
    "holding at 128: 192 may not fit (192 is above every measured size (128) and the memory "
    "model predicts at most 164)"
)
NOISE_FACT = (
    "noise scale: B_simple ≈ 1.39k [1.21k, 1.6k]: a step at 128 is worth 8% of a noiseless one "
    "(raise B, counting steps alone; the advice weighs step time too)"
)
STEP_TIME_FACT = (
    "step time: throughput is half its limit at B½ ≈ 41 (fitted from 2 sizes); past it, a "
    "larger batch buys ever less speed"
)


def advice(noise: bool = True, probed: bool = False) -> protocol.Advice:
    """The advisor's answer: at 128, 192 may not fit (the memory model's 164) until the probe
    finds 263 fits; then raise to 192. Without the noise scale, it waits."""
    if not noise:
        return protocol.Advice(
            128,
            128,
            "wait",
            rule="estimate",
            reasons=["B_simple: not enabled"],
            would_change="B_simple: not enabled",
            headline="stay at 128",
            why="B_simple unresolved",
            step=3000,
        )
    if probed:
        return protocol.Advice(
            192,
            128,
            "raise",
            rule="goodput",
            reasons=[
                "goodput: 192 predicts 1.07× the progress per second of 128 (a change needs "
                "1.05×); heading toward 223, one change at a time",
                NOISE_FACT,
                STEP_TIME_FACT,
                "memory: up to 263 (the probe)",
            ],
            confidence="high",
            would_change="B_simple below ≈ 820 (B_simple ≈ 1.39k now), or 192's measured step time",
            target=223,
            gain=1.07,
            headline="raise → 192",
            why="1.07× progress/s",
            step=3000,
        )
    return protocol.Advice(
        128,
        128,
        "stay",
        rule="fit",
        reasons=[
            HELD_BY_MEMORY,
            NOISE_FACT,
            STEP_TIME_FACT,
            "memory: up to 164 (the memory model's prediction)",
        ],
        confidence="high",
        would_change="a size within one change that fits and is allowed",
        target=164,
        headline="stay at 128",
        why="192 may not fit",
        step=3000,
    )


def autopilot_reading() -> protocol.AutopilotReading:
    """The autopilot steering: it grew 64 → 128 at step 900 and holds, with its claim."""
    decision = protocol.AutopilotDecision(
        step=900,
        t=START + 225,
        old=64,
        new=128,
        kind="grow",
        b_simple=1010.0,
        b_simple_low=820.0,
        b_simple_high=1290.0,
        half_batch=41.0,
        target=183,
        predicted_gain=1.21,
    )
    return protocol.AutopilotReading(
        state="on",
        waiting=f"{HELD_BY_MEMORY}; next decision at step 3,025",
        held="holds: 192 may not fit",
        start_size=64,
        size=128,
        b_simple=1390.0,
        b_simple_low=1210.0,
        b_simple_high=1600.0,
        half_batch=41.0,
        half_batch_how="fitted from 2 sizes",
        target=164,
        ceiling=164,
        ceiling_why="the memory model's prediction",
        next_decision_step=3025,
        claimed_gain=1.23,
        claimed_note="against a fixed batch of 64",
        decisions=[decision],
    )


def anatomy_reading(step: int, step_time: float, final: bool = False) -> protocol.StepAnatomy:
    """A job that turns input-bound after step 2,000 (its DataLoader has no workers)."""
    data = 0.06 if step < 2000 else 0.31
    rest = 1.0 - data
    anatomy = protocol.StepAnatomy(
        steps=100,
        step_s=step_time,
        data_s=data * step_time,
        forward_s=0.30 * rest * step_time,
        backward_s=0.58 * rest * step_time,
        optimizer_s=0.08 * rest * step_time,
        other_s=0.04 * rest * step_time,
        clock="CUDA events",
    )
    if final:
        anatomy.verdict = "input-bound"
        anatomy.evidence = f"{data:.0%} of each step waits for data (12.7 ms of 41.0 ms)"
        anatomy.advice = (
            "DataLoader(num_workers=4 or more): batches are made on the training thread; "
            "pin_memory=True; persistent_workers=True"
        )
    return anatomy


def points(steps: int = 3000, every: int = 25, noise: bool = True) -> list[MetricsPoint]:
    out = []
    for step in range(every, steps + 1, every):
        wobble = 0.05 * math.sin(step / 90)
        step_time = 0.041 + wobble * 0.04
        out.append(
            MetricsPoint(
                t=START + step * 0.25,
                step=step,
                steps=every,
                batch_size=128,
                step_time_s=step_time,
                samples_per_s=128 / step_time,
                samples=step * 128,
                scalars={
                    "loss": 2.3 * math.exp(-step / 700) + 0.35 + 0.03 * math.sin(step / 13),
                    "accuracy": 1 - math.exp(-step / 500),
                },
                noise=noise_reading(step) if noise else None,
                anatomy=anatomy_reading(step, step_time),
            )
        )
    return out


def messages(
    gpu: bool = True, steps: int = 3000, noise: bool = True, autopilot: bool = False
) -> list[protocol.Message]:
    pts = points(steps, noise=noise)
    last = pts[-1]
    devices = gpu_devices() if gpu else []
    gpu_cap = Capability(True) if gpu else Capability(False, "torch 2.13.0+cpu is a CPU-only build")
    hello = protocol.Hello(
        protocol=1,
        session=session(),
        step=last.step,
        batch_size=128,
        capabilities={
            "ping": Capability(True),
            "set_batch_size": Capability(True),
            "step_batch_size": Capability(True),
            "probe": Capability(True),
            "autopilot": Capability(True),
        },
        gpu=gpu_cap,
        noise_scale=NOISE_CAPABILITY if noise else Capability(False, "not enabled"),
        devices=devices,
    )
    events = [
        protocol.Event(
            t=START + 0.2,
            step=0,
            kind="attached",
            message="bsmon attached to resnet-cifar (pid 4242)",
        ),
        protocol.Event(
            t=START + 400,
            step=1600,
            kind="nonfinite_scalar",
            level="warning",
            message="grad_norm is inf at step 1600 (shown as a gap in the chart)",
        ),
    ]
    metrics = protocol.Metrics(
        t=NOW,
        step=last.step,
        batch_size=128,
        step_time_s=last.step_time_s,
        samples_per_s=last.samples_per_s,
        b_simple=last.noise.b_simple if last.noise else None,
        samples=last.samples,
        steps_in_window=0,
        idle_s=0.1,
        scalars={},
        noise=last.noise or NoiseScaleReading(),
        anatomy=anatomy_reading(last.step, last.step_time_s or 0.041, final=True),
        devices=devices,
        gpu=gpu_cap,
        host=HostReading(cpu_percent=187.0, rss_bytes=int(5.4 * 2**30), threads=24),
        batch=batch_reading(gpu),
        autopilot=autopilot_reading() if autopilot else None,
        advice=advice(noise),
    )
    if autopilot:
        events.append(
            protocol.Event(
                t=START + 225,
                step=900,
                kind="autopilot",
                message="autopilot: batch 64 → 128 at step 900 (B_simple 1.01k [820, "
                "1.29k], B½ 41, target 183; 1.21× progress per second predicted)",
            )
        )
    return [hello, protocol.History(points=pts), *events, metrics]


CPU_MFU_NOTE = "MFU n/a: the model runs on the CPU (no peak FLOP/s)"  # the agent's words


def with_throughput(
    script: list[protocol.Message], reading: protocol.ThroughputReading
) -> list[protocol.Message]:
    """The script with ``reading`` as every metrics message's tokens/s and MFU."""
    for message in script:
        if isinstance(message, protocol.Metrics):
            message.throughput = reading
    return script


def scripted_app(
    gpu: bool = True,
    disconnect: str | None = None,
    finished: bool = False,
    noise: bool = True,
    autopilot: bool = False,
    **kwargs: object,
) -> BsmonApp:
    script = messages(gpu=gpu, noise=noise, autopilot=autopilot)
    if finished:
        script.append(protocol.Bye(reason="closed", t=NOW))
    source = ScriptedSource(
        "resnet-cifar", script, clock=lambda: NOW, disconnect=disconnect, **kwargs
    )  # type: ignore[arg-type]
    return BsmonApp(source)


def probe_result() -> protocol.ProbeResult:
    gib = 2**30
    measured = (  # batch, peak GiB, step s, samples/s
        (128, 30.1, 0.043, 2980.0),
        (192, 42.3, 0.061, 3150.0),
        (230, 49.6, 0.072, 3190.0),
        (263, 55.8, 0.082, 3200.0),
    )
    points = [
        protocol.ProbePoint(
            batch_size=size,
            fits=True,
            peak_bytes=int(peak * gib),
            static_bytes=int(6.0 * gib),
            step_time_s=step,
            samples_per_s=speed,
        )
        for size, peak, step, speed in measured
    ]
    points[-1].note, points[-1].confirmation = "confirmation", True
    return protocol.ProbeResult(
        status="ok",
        max_batch_size=263,
        confirmed_max=263,
        confirmation="confirmed: a full step at 263 ran within the budget",
        points=points,
        predicted_max=263,
        extrapolation=1.2,
        budget_bytes=int(78.4 * gib),
        device="cuda:0",
        fit_intercept_bytes=5.6 * gib,
        fit_slope_bytes=0.19 * gib,
        duration_s=41.0,
        what_ifs=[
            protocol.WhatIf("as is", 277, measured=True),
            protocol.WhatIf(
                "bf16 autocast", 448, measured=True, note="peak 31 GiB at 230; 1.71× the throughput"
            ),
            protocol.WhatIf(
                "activation checkpointing",
                None,
                measured=False,
                note="measured for nn.Sequential models with a loss_fn",
            ),
        ],
        recommendation=protocol.Recommendation(
            batch_size=192,
            reasons=advice(probed=True).reasons,
            current=128,
            confidence="high",
            would_change=advice(probed=True).would_change,
        ),
    )


def probed_messages() -> list[protocol.Message]:
    script = messages()
    result = probe_result()
    script[-1].probe = protocol.ProbeReading(
        status="done", message="done", started=NOW - 41, points=result.points, result=result
    )
    script[-1].advice = advice(probed=True)
    return script


def ranks_reading(world: int = 64, per_node: int = 8) -> protocol.RanksReading:
    readings = []
    for rank in range(world):
        slow = rank == 37
        late = rank == 12
        readings.append(
            protocol.RankReading(
                rank=rank,
                host=f"gpu-node-{rank // per_node}",
                local_rank=rank % per_node,
                step=3000 if not late else 2991,
                step_time_s=0.0429,
                samples_per_s=2980.0,
                batch_size=128,
                util_percent=71.0 if slow else 97.0 - (rank % 5),
                memory_used_bytes=int((61.2 + (rank % 3)) * 2**30),
                memory_total_bytes=int(79.6 * 2**30),
                forward_s=0.021 if slow else 0.0122 + 0.0002 * (rank % 4),
                backward_s=0.0205,
                comm_wait_s=0.0021 if slow else 0.0095,
                verdict="compute-bound" if slow else "communication-bound",
                age_s=14.0 if late else 0.8,
                late=late,
            )
        )
    return protocol.RanksReading(
        world_size=world,
        ranks=readings,
        straggler=37,
        straggler_ratio=1.27,
        straggler_cause="r37 is slow in compute: 41.5 ms a step against the median rank's 33.0 ms",
        timing="compute = forward + backward (DDP runtime statistics)",
        global_batch_size=128 * world,
    )


def distributed_messages() -> list[protocol.Message]:
    script = messages()
    script[0].session.rank, script[0].session.world_size = 0, 64
    script[-1].ranks = ranks_reading()
    return script
