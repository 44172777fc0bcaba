"""``bsmon list``: the running jobs, their step and age, as a table or as JSON."""

from __future__ import annotations

import json
import time

from bsmon.probes.wire import JobConnection, discovery

from .. import format as fmt


def job_rows(timeout: float = 1.0) -> list[dict[str, object]]:
    rows = []
    now = time.time()
    for job in discovery.iter_jobs():
        row: dict[str, object] = {
            "name": job.name,
            "pid": job.pid,
            "host": job.host,
            "socket": str(job.socket),
            "start_time": job.start_time,
            "age_s": round(now - job.start_time, 1) if job.start_time else None,
            "step": None,
        }
        try:
            with JobConnection(job.socket, timeout=timeout) as conn:
                hello = conn.hello(timeout)
            row["step"] = hello.step
            row["batch_size"] = hello.batch_size
        except (ConnectionError, TimeoutError) as exc:
            row["error"] = str(exc)
        rows.append(row)
    return rows


def cmd_list(as_json: bool) -> int:
    rows = job_rows()
    if as_json:
        print(json.dumps({"dir": str(discovery.default_dir()), "jobs": rows}, indent=2))
        return 0
    if not rows:
        print(
            f"no running jobs in {discovery.default_dir()} (start one with "
            "`bsmon run -- python train.py`, or try `bsmon demo`)"
        )
        return 0
    print(f"{'NAME':<20} {'PID':>8} {'HOST':<16} {'STEP':>10} {'AGE':>10}  SOCKET")
    for row in rows:
        step = row["step"]
        print(
            f"{row['name']!s:<20} {row['pid']:>8} {row['host']!s:<16} "
            f"{(f'{step:,}' if isinstance(step, int) else 'n/a'):>10} "
            f"{fmt.clock(row['age_s']):>10}  {row['socket']}"
        )  # type: ignore[arg-type]
    return 0
