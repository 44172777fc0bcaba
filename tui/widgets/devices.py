"""Per-GPU utilization and memory meters, temperature, power; the job's CPU and memory."""

from __future__ import annotations

from textual.markup import escape
from textual.widgets import Static

from bsmon.probes.wire.protocol import DeviceReading, HostReading

from .. import format as fmt
from ..session import Snapshot

LABEL = 5  # "util " / "mem  "


def level_style(fraction: float | None) -> str:
    if fraction is None:
        return "$text-muted"
    if fraction >= 0.9:
        return "$error"
    if fraction >= 0.75:
        return "$warning"
    return "$success"


def meter(fraction: float | None, width: int) -> str:
    return f"[{level_style(fraction)}]{fmt.bar(fraction, width)}[/]"


def meter_neutral(fraction: float | None, width: int) -> str:
    """Utilization has no bad level: high is what a training job wants."""
    return f"[$accent]{fmt.bar(fraction, width)}[/]"


def torch_line(device: DeviceReading, width: int) -> str:
    """The job's allocator: allocated, reserved and peak allocated (terser when narrow)."""
    alloc, rsvd, peak = (
        fmt.bytes_(v)
        for v in (
            device.torch_allocated_bytes,
            device.torch_reserved_bytes,
            device.torch_peak_bytes,
        )
    )
    wide = f"torch alloc {alloc} · rsvd {rsvd} · peak {peak}"
    if len(wide) <= width:
        return wide
    unit = " GiB"
    if all(v.endswith(unit) for v in (alloc, rsvd, peak)):
        alloc, rsvd, peak = (v.removesuffix(unit) for v in (alloc, rsvd, peak))
        return f"torch {alloc}/{rsvd}{unit} peak {peak}"
    return f"torch {alloc}/{rsvd} pk {peak}"


def allocator_line(device: DeviceReading, width: int) -> str | None:
    """The allocator's cudaMalloc retries and OOMs when there are any (the agent's warning
    says what they mean), with its peak reserved memory as a share of the device. Without
    them the line is left out: at 80×24 it would take the noise panel's line."""
    counts = " · ".join(
        f"{fmt.count(n)} {one if n == 1 else many}"
        for n, one, many in (
            (device.alloc_retries, "retry", "retries"),
            (device.ooms, "OOM", "OOMs"),
        )
        if n
    )
    if not counts:
        return None
    share = _ratio(device.torch_reserved_peak_bytes, device.memory_total_bytes)
    percent = fmt.percent(100 * share if share is not None else None)
    label, end = f"rsvd peak {fmt.bytes_(device.torch_reserved_peak_bytes)} (", ")"
    if len(label) + len(percent) + len(end) + len(" · ") + len(counts) > width:
        label, end = "rsvd pk ", ""
    return f"{label}[{level_style(share)}]{percent}[/]{end} · [$warning]{counts}[/]"


def truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


def _ratio(used: float | None, total: float | None) -> float | None:
    return used / total if used is not None and total else None


def device_lines(device: DeviceReading, width: int) -> list[str]:
    memory = _ratio(device.memory_used_bytes, device.memory_total_bytes)
    util = device.util_percent / 100 if device.util_percent is not None else None
    bar_width = max(4, min(30, width - LABEL - 16))
    extras = " ".join(
        x
        for x in (
            f"{device.temperature_c:.0f}°C" if device.temperature_c is not None else "",
            f"{device.power_w:.0f} W" if device.power_w is not None else "",
        )
        if x
    )
    used = fmt.bytes_(device.memory_used_bytes).removesuffix(" GiB")
    label = f"GPU{device.index}"
    name = truncate(device.name or "unknown", width - len(label) - len(extras) - 2)
    lines = [
        f"[b]{label}[/b] {escape(name)} {extras}",
        f"util {meter_neutral(util, bar_width)} {fmt.percent(device.util_percent):>4}",
        f"mem  {meter(memory, bar_width)} {used}/{fmt.bytes_(device.memory_total_bytes)}",
        torch_line(device, width),
    ]
    if (allocator := allocator_line(device, width)) is not None:
        lines.append(allocator)
    if device.throttled is not None:  # left out when not: as the allocator's line
        clock = f" · {device.sm_clock_mhz:.0f} MHz" if device.sm_clock_mhz is not None else ""
        said = truncate(f"throttled: {device.throttled}{clock}", width)
        lines.append(f"[$warning]{escape(said)}[/]")
    if device.error:
        lines.append(f"[$text-muted]n/a — {escape(device.error)}[/]")
    return lines


def host_line(host: HostReading) -> str:
    if host.error:
        return f"CPU  [$text-muted]n/a — {escape(host.error)}[/]"
    return f"CPU  {fmt.percent(host.cpu_percent)} · RSS {fmt.bytes_(host.rss_bytes)}"


class DevicePanel(Static):
    DEFAULT_CSS = "DevicePanel { height: auto; }"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._snap: Snapshot | None = None

    def show(self, snap: Snapshot) -> None:
        self._snap = snap
        self.update("\n".join(self._lines(self.content_size.width or 34)))

    def on_resize(self) -> None:
        if self._snap is not None:
            self.show(self._snap)

    def _lines(self, width: int) -> list[str]:
        snap = self._snap
        metrics = snap.latest if snap else None
        if metrics is None:
            return ["[$text-muted]waiting for the first reading…[/]"]
        lines: list[str] = []
        for device in metrics.devices:
            lines.extend(device_lines(device, width))
        if not metrics.devices:
            reason = metrics.gpu.reason or "no GPU in use"
            lines.append(f"GPU  [$text-muted]n/a — {escape(reason)}[/]")
        lines.append(host_line(metrics.host))
        return lines
