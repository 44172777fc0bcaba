"""The job's side of the probe: start the sidecar, read its lines, guard the job, conclude.

The runner has its own thread; the training thread is never involved. A watchdog checks every
50 ms: on a GPU, the device's free memory (the sidecar is killed before the job could run out);
on the CPU, the sidecar's resident memory against its budget; and the deadline. A sidecar that
crashes (even with a signal), hangs, or goes over its budget becomes a result that says so.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import psutil

from ..runtime.audience import ENV_RESIZABLE, ENV_RUN
from ..runtime.context import JobContext
from ..runtime.service import Extension, MetricsPart
from ..wire.describe import extrapolation_note
from ..wire.protocol import Event, Metrics, ProbePoint, ProbeReading, ProbeResult
from ..wire.routing import CommandRefused
from . import plan
from . import recipe as recipes

WATCH_INTERVAL_S = 0.05
DEFAULT_TIMEOUT_S = 600.0
STDERR_TAIL = 2000
STOP_WAIT_S = 5.0  # at close, for the probe thread to see its sidecar die and tidy up


class _Line(msgspec.Struct):
    type: str
    message: str = ""
    point: ProbePoint | None = None
    result: ProbeResult | None = None


class ProbeRunner:
    def __init__(
        self,
        *,
        check: Callable[[], None],
        prepare: Callable[[int | None], recipes.Recipe],
        directory: Path | None,
        ctx: JobContext,
        on_result: Callable[[ProbeResult], None],
        device_free: Callable[[], tuple[int, int] | None] = lambda: None,
    ) -> None:
        self._check = check
        self._prepare = prepare
        self._directory = directory
        self._emit = ctx.emit
        self._on_result = on_result
        self._step = ctx.progress
        self._device_free = device_free
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._done.set()
        self._reading = ProbeReading()
        self._decoder = msgspec.json.Decoder(_Line)
        self._process: subprocess.Popen | None = None
        self._closing: str | None = None  # why the job's end stopped a running probe
        self._ended_at = float("-inf")

    def reading(self) -> ProbeReading:
        """The probe's state; when idle, with the reason a probe could not start now."""
        reading = self._reading
        if self.running:
            return reading
        try:
            self._check()
        except recipes.RecipeError as exc:
            return msgspec.structs.replace(reading, blocked=str(exc))
        return reading

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    def ran_since(self, t: float) -> bool:
        """A sidecar shared the job's device at some time after ``t`` (wall clock): the job's
        throughput since then is not its own."""
        return self.running or self._ended_at > t

    def start(self, memory_budget: int | None, timeout_s: float | None) -> dict[str, object]:
        """Begin a probe in the background; raises CommandRefused when it cannot run."""
        with self._lock:
            if self.running:
                age = time.time() - (self._reading.started or time.time())
                raise CommandRefused(f"a probe is already running (started {age:.0f} s ago)")
            if memory_budget is not None and memory_budget <= 0:
                raise CommandRefused("memory_budget must be a positive number of bytes")
            if timeout_s is not None and timeout_s <= 0:
                raise CommandRefused("timeout_s must be positive")
            try:
                self._check()
            except recipes.RecipeError as exc:
                raise CommandRefused(str(exc)) from None
            timeout = timeout_s or DEFAULT_TIMEOUT_S
            self._done.clear()
            self._reading = ProbeReading(
                status="running", message="preparing the recipe", started=time.time()
            )
            threading.Thread(
                target=self._run, args=(memory_budget, timeout), name="bsmon-probe", daemon=True
            ).start()
        self._emit(
            Event(
                t=time.time(),
                step=self._step(),
                kind="probe_started",
                message=f"probe started (up to {timeout:.0f} s); the job slows while "
                "the sidecar shares the device",
            )
        )
        return {"started": True, "timeout_s": timeout}

    def wait(self, timeout: float | None = None) -> ProbeResult | None:
        self._done.wait(timeout)
        return self._reading.result

    def stop(self) -> None:
        """Kill a running sidecar (the job is closing), saying so now, and wait a little for
        its thread to tidy up (the recipe file)."""
        if not self.running:
            return
        age = time.time() - (self._reading.started or time.time())
        why = f"the job ended {age:.0f} s into it, before it finished (press p earlier, "
        self._closing = why + "or probe a longer job)"  # what the thread's result then says
        self._announce(ProbeResult(status="killed", error=self._closing))
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
        self._done.wait(STOP_WAIT_S)

    # -- the probe thread --------------------------------------------------------------------

    def _run(self, memory_budget: int | None, timeout: float) -> None:
        started = time.monotonic()
        try:
            recipe = self._prepare(memory_budget)  # on this thread: pickling takes a while
            self._reading = msgspec.structs.replace(
                self._reading, message=f"starting the sidecar on {recipe.device}"
            )
            result = self._run_sidecar(recipe, timeout)
        except recipes.RecipeError as exc:
            result = ProbeResult(status="refused", error=str(exc))
        except Exception as exc:  # a bug here must still end the probe with a result
            result = ProbeResult(status="failed", error=f"{type(exc).__name__}: {exc}")
        result.duration_s = time.monotonic() - started
        self._finish(result)

    def _run_sidecar(self, recipe: recipes.Recipe, timeout: float) -> ProbeResult:
        if self._directory is not None:
            return self._run_sidecar_in(self._directory, recipe, timeout)
        # no socket directory: a private one for this probe's recipe, gone with it
        with tempfile.TemporaryDirectory(prefix="bsmon-probe-") as directory:
            return self._run_sidecar_in(Path(directory), recipe, timeout)

    def _run_sidecar_in(
        self, directory: Path, recipe: recipes.Recipe, timeout: float
    ) -> ProbeResult:
        path = recipes.write(recipe, directory)
        process = None
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "bsmon.probes.maxbatch.sidecar", str(path)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                env=sidecar_environment(),
                cwd=os.getcwd(),
                start_new_session=True,
            )
            self._process = process
            if self._closing is not None:  # stop() came before there was a process to kill
                process.kill()
            return self._follow(process, recipe, time.monotonic() + timeout, timeout)
        finally:
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
            path.unlink(missing_ok=True)

    def _follow(
        self, process: subprocess.Popen, recipe: recipes.Recipe, deadline: float, timeout: float
    ) -> ProbeResult:
        selector = selectors.DefaultSelector()
        selector.register(process.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        buffer = b""
        result: ProbeResult | None = None
        points: list[ProbePoint] = []
        stopped: str | None = None
        while True:
            for _key, _ in selector.select(WATCH_INTERVAL_S):
                chunk = os.read(process.stdout.fileno(), 1 << 16)  # type: ignore[union-attr]
                if not chunk:
                    selector.unregister(process.stdout)  # type: ignore[arg-type]
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    result = self._take_line(line, points) or result
            if process.poll() is not None and not selector.get_map():
                break
            if process.poll() is not None:
                continue  # drain what is left
            stopped = self._watchdog(process, recipe, deadline, timeout)
            if stopped is not None:
                process.kill()
                process.wait()
                break
        selector.close()
        if stopped is not None:
            return ProbeResult(
                status="timeout" if "timed out" in stopped else "killed",
                points=points,
                error=stopped,
                max_batch_size=max((p.batch_size for p in points if p.fits), default=0),
            )
        if result is not None:
            return result
        return crashed(process, points)

    def _take_line(self, line: bytes, points: list[ProbePoint]) -> ProbeResult | None:
        if not line.strip():
            return None
        try:
            message = self._decoder.decode(line)
        except msgspec.DecodeError:
            return None
        if message.type == "progress":
            self._reading = msgspec.structs.replace(self._reading, message=message.message)
        elif message.type == "point" and message.point is not None:
            points.append(message.point)
            self._reading = msgspec.structs.replace(self._reading, points=list(points))
        elif message.type == "result":
            return message.result
        return None

    def _watchdog(
        self, process: subprocess.Popen, recipe: recipes.Recipe, deadline: float, timeout: float
    ) -> str | None:
        """Why the sidecar must be stopped now, or None."""
        if time.monotonic() > deadline:
            return f"timed out after {timeout:.0f} s"
        if recipe.device.startswith("cuda"):
            reading = self._device_free()
            if reading is not None:
                free, total = reading
                floor = max(512 << 20, int(0.02 * total))
                if free < floor:
                    return (
                        f"killed by the watchdog: {recipe.device} free memory fell to "
                        f"{free / 2**20:.0f} MiB (floor {floor / 2**20:.0f} MiB)"
                    )
        elif recipe.memory_budget:
            try:
                rss = psutil.Process(process.pid).memory_info().rss
            except psutil.Error:
                return None
            if rss > plan.RUNAWAY_FACTOR * recipe.memory_budget:
                return (
                    f"killed by the watchdog: the sidecar used {rss / 2**20:.0f} MiB, over "
                    f"{plan.RUNAWAY_FACTOR}× its {recipe.memory_budget / 2**20:.0f} MiB budget"
                )
        return None

    def _finish(self, result: ProbeResult) -> None:
        if self._closing is not None:  # killed by stop(): say why, keep what it measured
            result = msgspec.structs.replace(result, status="killed", error=self._closing)
        self._reading = ProbeReading(
            status="done",
            message=summary(result),
            started=self._reading.started,
            points=result.points,
            result=result,
        )
        try:
            self._on_result(result)
        finally:
            if self._closing is None:  # stop() has announced it
                self._announce(result)
            self._ended_at = time.time()
            self._done.set()

    def _announce(self, result: ProbeResult) -> None:
        self._emit(
            Event(
                t=time.time(),
                step=self._step(),
                kind="probe_result",
                level="info" if result.status == "ok" else "warning",
                message=summary(result),
                data=msgspec.to_builtins(result),
            )
        )


class ProbeExtension(Extension):
    """Puts the probe's state into every metrics message."""

    def __init__(self, runner: ProbeRunner) -> None:
        self._runner = runner

    def metrics_part(self, metrics: Metrics) -> MetricsPart:
        return {"probe": self._runner.reading()}

    def detach(self) -> None:
        """A sidecar still probing is killed (its result says the job ended first)."""
        self._runner.stop()


def crashed(process: subprocess.Popen, points: list[ProbePoint]) -> ProbeResult:
    code = process.returncode
    status = "crashed"
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = f"the sidecar crashed ({name})"
        if -code in (signal.SIGTERM, signal.SIGINT):  # `bsmon probe` interrupted, or a person
            why = f"the sidecar was stopped ({name}) from outside the job"
            status = "killed"
    else:
        why = f"the sidecar exited with code {code} without a result"
    tail = (
        process.stderr.read()[-STDERR_TAIL:].decode(errors="replace").strip()
        if (process.stderr)
        else ""
    )
    if tail:
        why += f": {tail.splitlines()[-1]}"
    return ProbeResult(
        status=status,
        points=points,
        error=why,
        max_batch_size=max((p.batch_size for p in points if p.fits), default=0),
    )


def summary(result: ProbeResult) -> str:
    if result.status != "ok":
        return f"probe {result.status}: {result.error}"
    predicted = ""
    if result.predicted_max:
        predicted = (
            f"; predicted max ≈{result.predicted_max:,} "
            f"({extrapolation_note(result.extrapolation)})"
        )
    if result.confirmation:
        predicted += f"; {result.confirmation}"
    return f"probe: {result.max_batch_size:,} ran on {result.device}{predicted}" + (
        f"; recommended {result.recommendation.batch_size:,}" if result.recommendation else ""
    )


def sidecar_environment() -> dict[str, str]:
    """The job's environment, with its import path, so the sidecar imports what it imports;
    without ``bsmon run``'s variables, or bsmon would attach to the sidecar too."""
    env = dict(os.environ)
    for name in (ENV_RUN, ENV_RESIZABLE):  # bsmon run's: the sidecar is not a job to watch
        env.pop(name, None)
    paths = [p for p in sys.path if p]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    # glibc: serve blocks of 64 KiB and more with mmap and give them back on free, so the
    # sidecar's resident memory follows its live memory (the CPU probe measures RSS)
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    env.setdefault("MALLOC_TRIM_THRESHOLD_", "131072")
    return env
