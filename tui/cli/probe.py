"""``bsmon probe TARGET``: ask a job to probe its largest batch size and print the result."""

from __future__ import annotations

import contextlib
import json
import sys
import time

import msgspec

from bsmon.probes.wire import (
    ConnectionLost,
    JobConnection,
    describe_prediction,
    describe_recommendation,
    describe_what_if,
    discovery,
)
from bsmon.probes.wire.protocol import Metrics, ProbeCommand, ProbePoint, ProbeResult

from .. import format as fmt
from ..errors import CliError

SIDECAR_MODULE = "bsmon.probes.maxbatch.sidecar"  # how the job starts it: python -m ...


def run_probe(target: str, *, as_json: bool, memory_budget: int | None, timeout: float) -> int:
    try:
        path = discovery.resolve_target(target)
    except LookupError as exc:
        raise CliError(str(exc)) from None
    job_pid = None
    try:
        with JobConnection(path) as conn:
            job_pid = conn.hello().session.pid
            reply = conn.request(ProbeCommand(memory_budget=memory_budget, timeout_s=timeout))
            if not reply.ok:
                raise CliError(reply.error or "the job refused the probe")
            result = follow(conn, time.time(), timeout + 60, quiet=as_json)
    except (ConnectionError, TimeoutError) as exc:
        raise CliError(str(exc)) from None
    except KeyboardInterrupt:
        say_interrupted(job_pid)
        return 130
    if as_json:
        print(json.dumps(msgspec.to_builtins(result), indent=2))
    else:
        print(describe(result))
    return 0 if result.status == "ok" else 1


def stop_sidecar(job_pid: int) -> int | None:
    """SIGTERM to the probe's sidecar (a child of the job, in a session of its own); its pid,
    or None when none runs."""
    import psutil

    try:
        children = psutil.Process(job_pid).children()
    except psutil.Error:
        return None
    for child in children:
        with contextlib.suppress(psutil.Error):
            if SIDECAR_MODULE in child.cmdline():
                child.terminate()
                return child.pid
    return None


def say_interrupted(job_pid: int | None) -> None:
    """Ctrl-C: stop what this command started, and say so (the job goes on either way)."""
    stopped = stop_sidecar(job_pid) if job_pid is not None else None
    if stopped is not None:
        what = f"stopped the probe's sidecar (pid {stopped}); the job goes on"
    else:
        what = "no probe sidecar was running; the job goes on"
    print(f"bsmon: probe interrupted: {what}", file=sys.stderr)


def follow(conn: JobConnection, started: float, timeout: float, quiet: bool) -> ProbeResult:
    """Print the probe's progress to stderr until its result arrives: its status as each
    metrics message has it, and every size it measured (from the cumulative list of points:
    a probe quicker than a tick still shows each one)."""
    deadline = time.monotonic() + timeout
    said, shown = "", 0
    while time.monotonic() < deadline:
        try:
            messages = conn.messages(0.2)
        except ConnectionLost:
            raise CliError("the job went away before the probe finished") from None
        if conn.eof:
            raise CliError("the job went away before the probe finished")
        for message in messages:
            if not isinstance(message, Metrics):
                continue
            reading = message.probe
            fresh = reading.started is not None and reading.started >= started - 1
            done = reading.status == "done" and reading.result is not None and fresh
            points = reading.result.points if done else reading.points if fresh else []
            if not quiet:
                for point in points[shown:]:
                    print(f"probe: {describe_point(point)}", file=sys.stderr)
                shown = max(shown, len(points))
                if reading.message and reading.message != said:
                    print(
                        reading.message
                        if reading.message.startswith("probe")
                        else f"probe: {reading.message}",
                        file=sys.stderr,
                    )
                    said = reading.message
            if done:
                return reading.result
    raise CliError(f"no probe result within {timeout:.0f} s")


def describe_point(point: ProbePoint) -> str:
    """One measured size, as the progress shows it."""
    if not point.fits:
        return f"batch {point.batch_size:,} did not fit" + (f": {point.note}" if point.note else "")
    return (
        f"batch {point.batch_size:,} ran: peak {fmt.bytes_(point.peak_bytes)}, "
        f"a step {fmt.duration(point.step_time_s)}"
    )


def describe(result: ProbeResult) -> str:
    if result.status != "ok":
        return f"probe {result.status}: {result.error}"
    lines = [f"{'batch':>8}  {'fits':<4}  {'peak':>10}  {'step':>9}  {'samples/s':>10}  note"]
    for p in result.points:
        lines.append(
            f"{p.batch_size:>8,}  {'yes' if p.fits else 'no':<4}  "
            f"{fmt.bytes_(p.peak_bytes):>10}  {fmt.duration(p.step_time_s):>9}  "
            f"{fmt.rate(p.samples_per_s, ''):>10}  {p.note or ''}"
        )
    lines.append(f"largest batch that ran: {result.max_batch_size:,} on {result.device}")
    if (prediction := describe_prediction(result)) is not None:
        lines.append(prediction)
    lines.extend(f"  {describe_what_if(w)}" for w in result.what_ifs)
    if result.recommendation is not None:
        lines.append(
            f"recommended: {describe_recommendation(result.recommendation)} — "
            + "; ".join(result.recommendation.reasons)
        )
    lines.extend(f"note: {note}" for note in result.notes)
    return "\n".join(lines)
