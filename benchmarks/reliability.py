"""The job's speed under each fault and load, as a ratio to an undisturbed run of the same job
measured in the same benchmark; the faults it survived, the inputs it was sent, and the
samples bsmon lost (must be 0).

Each row is a fresh workloads/reliability_job.py (a real training loop, as fast as it goes,
recording its session) measured over ``--window`` seconds while one disturbance runs beside
it. The undisturbed run is measured first and last; the ratio is against their mean.

    python benchmarks/reliability.py              # about two minutes on 2 cores
    python benchmarks/reliability.py --window 8
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import pty
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bsmon.probes.summary.build import summarize_record  # noqa: E402
from bsmon.probes.wire import discovery, protocol  # noqa: E402
from bsmon.probes.wire.client import JobConnection  # noqa: E402
from workloads.reliability_kit import JobProcess, kill_attached_monitors, raw_client  # noqa: E402

REDRAW_GAP_S = 0.005
Disturb = Callable[["Bench", JobProcess, float], "Tally"]


@dataclass
class Tally:
    faults: int = 0  # faults survived
    inputs: int = 0  # lines, connections or clients sent at the job
    note: str = ""


@dataclass
class Row:
    name: str
    rate: float
    tally: Tally
    lost: int  # samples the job made that bsmon did not count
    lost_in_record: int | None  # samples missing from the session record


class Bench:
    def __init__(self, directory: Path, window: float) -> None:
        self.directory = directory
        self.window = window
        self.children: list[subprocess.Popen] = []

    def start(self, args: list[str], **kwargs: object) -> subprocess.Popen:
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        kwargs.setdefault("stdin", subprocess.PIPE)
        env = {**os.environ, "BSMON_DIR": str(self.directory)}
        process = subprocess.Popen(args, text=True, env=env, start_new_session=True, **kwargs)  # type: ignore[call-overload]
        self.children.append(process)
        return process

    def cleanup(self) -> None:
        for process in self.children:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def run(self, name: str, disturb: Disturb, preexec: Callable[[], None] | None = None) -> Row:
        """One job under one disturbance. A job run with ``preexec`` (a file-size limit) is
        expected to stop recording, so its record is not counted for lost samples."""
        job = JobProcess(lambda a: self.start(a, preexec_fn=preexec), name, "--sleep", "0")
        job.wait_ready()
        settle = time.monotonic() + 1.0
        while time.monotonic() < settle or len(job.progress) < 2:
            time.sleep(0.05)
        t0 = time.time()
        tally = disturb(self, job, time.monotonic() + self.window)
        rate = job.rate_since(t0)
        done = job.stop()
        in_record = None
        if done.record is not None and preexec is None:
            in_record = done.samples - summarize_record(done.record).samples
        return Row(name, rate, tally, done.samples - done.bsmon_samples, in_record)


def until(deadline: float) -> bool:
    return time.monotonic() < deadline


def undisturbed(bench: Bench, job: JobProcess, deadline: float) -> Tally:
    time.sleep(max(0.0, deadline - time.monotonic()))
    return Tally()


def monitors_sigkilled(bench: Bench, job: JobProcess, deadline: float) -> Tally:
    tally = Tally(note="monitors attached, reading metrics, then SIGKILLed")
    while until(deadline):
        tally.faults += kill_attached_monitors(bench.start, job.socket, 10, batch=10)  # type: ignore[arg-type]
    return tally


def socket_deleted(bench: Bench, job: JobProcess, deadline: float) -> Tally:
    tally = Tally(note="socket file deleted; made again each time")
    path = job.socket
    assert path is not None
    while until(deadline):
        discovery.remove_job_files(path)
        back = time.monotonic() + 5
        while not path.exists() and time.monotonic() < back:
            time.sleep(0.02)
        if path.exists():
            with JobConnection(path) as conn:
                tally.faults += conn.request(protocol.Ping()).ok
    return tally


def hostile_line(rng: random.Random) -> bytes:
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 200)).replace(b"\n", b" ")
    fields = {"type": rng.choice(["ping", "set_batch_size", "step_batch_size", "x", 5, None])}
    for key in rng.sample(["id", "value", "direction", "confirm", "timeout_s"], rng.randrange(4)):
        fields[key] = rng.choice([-1, 0, 2**70, 1.5, "up", "sideways", [], {}, True, None])
    line = json.dumps(fields).encode()
    if kind == 2:
        cut = rng.randrange(len(line))
        line = line[:cut] + rng.randbytes(3).replace(b"\n", b" ") + line[cut + 1 :]
    return line


def hostile_lines(bench: Bench, job: JobProcess, deadline: float) -> Tally:
    tally = Tally(note="generated bad lines, one reply each")
    rng = random.Random(8)
    with JobConnection(job.socket, timeout=30) as conn:  # type: ignore[arg-type]
        conn.hello()
        while until(deadline):
            lines = [hostile_line(rng) for _ in range(500)]
            conn.send_raw(b"".join(line + b"\n" for line in lines))
            marker = conn.send(protocol.Ping())
            while conn.wait_for(protocol.Reply, timeout=30).id != marker:
                tally.inputs += 1
    tally.note += f" ({tally.inputs} replies)"
    return tally


def idle_clients(bench: Bench, job: JobProcess, deadline: float) -> Tally:
    clients = [raw_client(job.socket, timeout=None) for _ in range(100)]  # type: ignore[arg-type]
    undisturbed(bench, job, deadline)
    for sock in clients:
        sock.close()
    return Tally(inputs=100, note="connected, never sending or reading")


def never_reading(bench: Bench, job: JobProcess, deadline: float) -> Tally:
    with raw_client(job.socket, timeout=None):  # type: ignore[arg-type]
        undisturbed(bench, job, deadline)
    return Tally(inputs=1, note="a client that never reads while metrics flow")


def rapid_connects(bench: Bench, job: JobProcess, deadline: float) -> Tally:
    tally = Tally(note="connect and close at once, as fast as possible")
    while until(deadline):
        raw_client(job.socket, timeout=None).close()  # type: ignore[arg-type]
        tally.inputs += 1
    return tally


def record_disk_full(bench: Bench, job: JobProcess, deadline: float) -> Tally:
    tally = Tally(note="record file limited to 4 kB (RLIMIT_FSIZE)")
    with JobConnection(job.socket) as conn:  # type: ignore[arg-type]
        while until(deadline):
            for message in conn.messages(0.1):
                is_error = isinstance(message, protocol.Event) and message.kind == "record_error"
                tally.faults += is_error
    return tally


def tiny_file_limit() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4000, 4000))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def dashboard(bench: Bench, job: JobProcess, deadline: float) -> Tally:
    """``bsmon attach`` in a 120x40 pseudo-terminal: its CPU use and how often it redraws."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "BSMON_DIR": str(bench.directory)}
    ui = subprocess.Popen(
        [sys.executable, "-m", "bsmon.tui.cli", "attach", str(job.socket)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
    )
    bench.children.append(ui)
    os.close(slave)
    frames = [0]  # bursts of output: a frame is written at once, frames come apart in time

    def drain() -> None:
        last = 0.0
        with contextlib.suppress(OSError):
            while os.read(master, 1 << 16):
                now = time.monotonic()
                frames[0] += now - last > REDRAW_GAP_S
                last = now

    threading.Thread(target=drain, daemon=True).start()
    time.sleep(min(3.0, max(0.0, deadline - time.monotonic())))  # startup is not the figure
    cpu0, frames0, t0 = cpu_seconds(ui.pid), frames[0], time.monotonic()
    undisturbed(bench, job, max(deadline, t0 + 3.0))
    elapsed = time.monotonic() - t0
    cpu = (cpu_seconds(ui.pid) - cpu0) / elapsed
    redraws = (frames[0] - frames0) / elapsed
    ui.kill()
    ui.wait()
    os.close(master)
    return Tally(note=f"dashboard CPU {cpu:.0%} of a core, {redraws:.1f} redraws/s")


SCENARIOS: list[tuple[str, Disturb, Callable[[], None] | None]] = [
    ("monitor SIGKILLed while attached", monitors_sigkilled, None),
    ("socket file deleted", socket_deleted, None),
    ("record disk full", record_disk_full, tiny_file_limit),
    ("hostile lines", hostile_lines, None),
    ("100 idle clients", idle_clients, None),
    ("client that never reads", never_reading, None),
    ("rapid connect/disconnect", rapid_connects, None),
    ("dashboard attached", dashboard, None),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=6.0, help="seconds measured per row")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="bsm-rel-", dir="/tmp"))
    bench = Bench(directory, args.window)
    try:
        first = bench.run("undisturbed (first)", undisturbed)
        rows = [bench.run(name, disturb, preexec) for name, disturb, preexec in SCENARIOS]
        last = bench.run("undisturbed (last)", undisturbed)
    finally:
        bench.cleanup()
        shutil.rmtree(directory, ignore_errors=True)
    base = (first.rate + last.rate) / 2
    job = "workloads/reliability_job.py"
    print(f"job: {job}, as fast as it goes; {args.window:.0f} s per row; ", end="")
    print(f"{os.cpu_count()} cores; undisturbed {base:,.0f} steps/s")
    print()
    header = "| condition | steps/s | ratio | faults survived | inputs | samples lost | notes |"
    print(header)
    print("|---|---:|---:|---:|---:|---:|---|")
    for row in [first, *rows, last]:
        in_record = "stopped" if row.lost_in_record is None else row.lost_in_record
        lost = f"{row.lost} (record {in_record})"
        print(
            f"| {row.name} | {row.rate:,.0f} | {row.rate / base:.3f} | {row.tally.faults} | "
            f"{row.tally.inputs} | {lost} | {row.tally.note} |"
        )
    total_lost = sum(r.lost + (r.lost_in_record or 0) for r in [first, *rows, last])
    print()
    print(
        f"faults survived: {sum(r.tally.faults for r in rows)}; "
        f"inputs tried: {sum(r.tally.inputs for r in rows)}; samples lost: {total_lost}"
    )
    return 1 if total_lost else 0


if __name__ == "__main__":
    sys.exit(main())
