"""How long `bsmon export` takes, and how much memory it needs, on records of a million steps.

Two synthetic records of 1,000,000 steps are made:

- "agent": written by the real recorder and writer (fake clock, 40 steps/s for ~7 h, a GPU
  reading every second, a loss every step), compacted as the agent compacts it;
- "flat": the same run with no compaction at all, one span per 10 steps (100,000 spans), the
  worst case a reader can meet.

Each is exported in a fresh process, twice: once for the wall time, once under tracemalloc
for the peak of Python allocations; "peak RSS" is the process's peak resident memory (VmHWM:
interpreter and imports included; an export of a tiny record gives the baseline). The
recorder's own cost, on the agent thread, is printed too (the training thread does nothing
more for the record: its only work stays one deque.append per step).

    python benchmarks/export.py [--steps 1000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START = 1_700_000_000.0
BATCH = 64


def session(start: float):
    from bsmon.probes.wire.protocol import SessionInfo

    return SessionInfo(
        name="bench", pid=1, host="bench", argv=["bench.py"], start_time=start,
        python="3", torch_version="2", bsmon_version="0",
    )  # fmt: skip


def device_sample(k: int):
    from bsmon.probes.runtime.devices import DeviceSample
    from bsmon.probes.wire.protocol import Capability, DeviceReading, HostReading

    util = float(60 + (k * 7) % 41)
    return DeviceSample(
        devices=[
            DeviceReading(index=0, name="Bench GPU", util_percent=util,
                          memory_used_bytes=(40 + k % 9) << 30, memory_total_bytes=80 << 30,
                          temperature_c=65.0, power_w=350.0, torch_peak_bytes=38 << 30)
        ],
        gpu=Capability(True),
        host=HostReading(cpu_percent=100.0, rss_bytes=4 << 30),
    )  # fmt: skip


def agent_record(path: Path, steps: int, per_bucket: int = 20) -> dict:
    """Drive the real Recorder: ``per_bucket`` steps every half second of fake time."""
    from bsmon.probes.record.recorder import Recorder
    from bsmon.probes.runtime.steps import StepDone
    from bsmon.probes.runtime.telemetry import Telemetry
    from bsmon.probes.wire.protocol import Capability, Event

    telemetry = Telemetry()
    telemetry.batch_size = BATCH
    failures: list[Event] = []
    recorder = Recorder(path, session(START), telemetry, failures.append,
                        clock=lambda: START)  # fmt: skip
    recorder.start()
    noise = Capability(False, "off")
    step_cost = tick_cost = 0.0
    sample = device_sample(0)
    buckets = math.ceil(steps / per_bucket)
    step = 0
    on_step, on_scalar = recorder.on_step, recorder.on_scalar
    for k in range(buckets):
        first, last = step + 1, min(step + per_bucket, steps)
        inputs = [(s, 0.025 * (1 + 0.2 * math.sin(s / 500)), 2.0 / (1 + s / 1e4))
                  for s in range(first, last + 1)]  # fmt: skip
        t0 = time.perf_counter()
        for s, duration, loss in inputs:
            on_step(StepDone(s, duration, BATCH, BATCH))
            on_scalar("loss", loss)
        t1 = time.perf_counter()
        step = last
        if k % 2 == 0:
            sample = device_sample(k)  # the sampler reads devices once a second
        events = (
            [Event(t=START + k * 0.5, step=step, kind="bench", message="checkpoint")]
            if (k % 7200 == 0)
            else []
        )
        recorder.tick(START + (k + 1) * 0.5 + 0.01, events, sample, noise)
        step_cost += t1 - t0
        tick_cost += time.perf_counter() - t1
        while recorder.writer._queue.qsize() > 2000:  # a real job writes 2 lines a second
            time.sleep(0.001)
    recorder.close("closed", step, timeout=600)
    if failures:
        raise SystemExit(f"the recorder failed: {failures[0].message}")
    return {
        "step_us": 1e6 * step_cost / steps,
        "tick_us": 1e6 * tick_cost / buckets,
        "compactions": recorder.writer.compactions,
    }


def flat_record(path: Path, steps: int, per_span: int = 10) -> None:
    """No compaction: one span line per ``per_span`` steps, straight from the format."""
    from bsmon.probes.record.buckets import StatAcc, single, step_bin
    from bsmon.probes.record.conversions import device_span
    from bsmon.probes.record.format import End, HostSpan, Span, encode_line, header_for

    with open(path, "wb") as f:
        f.write(encode_line(header_for(session(START), BATCH, START)))
        t = START
        for first in range(1, steps + 1, per_span):
            acc, hist, loss = StatAcc(), {}, StatAcc()
            for s in range(first, first + per_span):
                d = 0.025 * (1 + 0.2 * math.sin(s / 500))
                acc.add(d)
                hist[step_bin(d)] = hist.get(step_bin(d), 0) + 1
                loss.add(2.0 / (1 + s / 1e4))
            sample = device_sample(first // per_span)
            timed = acc.total
            span = Span(
                t0=t, t1=t + timed, step=first + per_span - 1, steps=per_span,
                samples=(first + per_span - 1) * BATCH, batch_size=BATCH,
                timed_steps=per_span, timed_s=timed, timed_samples=per_span * BATCH,
                step_time=acc.stat(), step_hist=hist, throughput=single(per_span * BATCH / timed),
                scalars={"loss": loss.stat()}, devices=[device_span(sample.devices[0])],
                host=HostSpan(cpu=single(100.0), rss=single(4 << 30)),
            )  # fmt: skip
            f.write(encode_line(span))
            t += timed
        f.write(encode_line(End(t=t, reason="closed", step=steps, samples=steps * BATCH)))


def export_in_a_fresh_process(record: Path, out: Path, trace: bool) -> dict:
    code = (
        "import json, resource, sys, time, tracemalloc\n"
        "from bsmon.probes.summary.build import export_record\n"
        "from bsmon.probes.summary import markdown as summary_md\n"
        f"trace = {trace}\n"
        "if trace: tracemalloc.start()\n"
        "t = time.perf_counter()\n"
        "export_record(sys.argv[1], sys.argv[2])\n"
        "wall = time.perf_counter() - t\n"
        "peak = tracemalloc.get_traced_memory()[1] if trace else None\n"
        "try:\n"  # VmHWM: this process's peak RSS (ru_maxrss would include the parent's)
        "    hwm = next(int(line.split()[1]) for line in open('/proc/self/status')"
        " if line.startswith('VmHWM:'))\n"
        "except (OSError, StopIteration):\n"
        "    hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(json.dumps({'wall_s': wall, 'tracemalloc_peak': peak, 'maxrss_kib': hwm}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(record), str(out)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(result.stdout)


def mib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, default=None, help="keep the records here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bsm-export-bench-"))
    try:
        records = {}
        t = time.perf_counter()
        cost = agent_record(work / "agent.jsonl", args.steps)
        made_agent = time.perf_counter() - t
        records["agent"] = work / "agent.jsonl"
        t = time.perf_counter()
        flat_record(work / "flat.jsonl", args.steps)
        made_flat = time.perf_counter() - t
        records["flat"] = work / "flat.jsonl"
        tiny = work / "tiny.jsonl"
        flat_record(tiny, 10)
        records["tiny (baseline)"] = tiny

        print(f"{args.steps:,} steps; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
        print(
            f"recorder (agent thread): {cost['step_us']:.2f} µs a step and its loss, "
            f"{cost['tick_us']:.1f} µs a tick (span closes included), "
            f"{cost['compactions']} compactions; made in {made_agent:.1f} s "
            f"(flat record: {made_flat:.1f} s)"
        )
        print(f"{'record':<16}{'size':>11}{'lines':>9}{'export':>10}{'py peak':>12}", end="")
        print(f"{'peak RSS':>12}")
        for name, path in records.items():
            lines = path.read_bytes().count(b"\n")
            timed = export_in_a_fresh_process(path, work / f"out-{name[:4]}", trace=False)
            traced = export_in_a_fresh_process(path, work / f"out-{name[:4]}", trace=True)
            with open(work / f"out-{name[:4]}" / "summary.json") as f:
                steps = json.load(f)["steps"]
            assert steps == (10 if path == tiny else args.steps), steps
            print(
                f"{name:<16}{mib(path.stat().st_size):>11}{lines:>9,}"
                f"{timed['wall_s']:>9.2f}s{mib(traced['tracemalloc_peak']):>12}"
                f"{mib(timed['maxrss_kib'] * 1024):>12}"
            )
        print(
            "(export: wall time of summarize + summary.json + summary.md; py peak: the "
            "tracemalloc peak of the export; peak RSS: the whole process, imports included)"
        )
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for path in records.values():
                shutil.copy(path, args.keep / path.name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
