"""Ctrl-C in a job with bsmon attached: the traceback names the user's code, not bsmon's
wrappers (as if bsmon had failed); other exceptions and the exit status are untouched."""

from __future__ import annotations

import signal
import subprocess
import sys

import msgspec
import pytest

from bsmon.probes.runtime.interrupts import INTERRUPTED
from bsmon.probes.summary.schema import Summary

from ..helpers import interruptible

SCRIPT = """
import sys
import torch
from torch import nn
from bsmon.probes import attach

class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        if i == 40:
            raise {error}("at item 40")
        return torch.randn(4), torch.randn(1)

model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
mon = attach(model, optimizer, batch_size=8, name="ki")
for x, y in mon.dataloader(Data()):
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def run_script(bsmon_dir, tmp_path, error: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(error=error))
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )


def end_reason(bsmon_dir) -> str | None:
    (summary,) = (bsmon_dir / "records").glob("*.summary.json")
    return msgspec.json.decode(summary.read_bytes(), type=Summary).run.end_reason


def frames(stderr: str) -> list[str]:
    return [line.strip() for line in stderr.splitlines() if line.strip().startswith("File ")]


def test_a_keyboard_interrupt_shows_the_users_line_not_bsmons_wrappers(bsmon_dir, tmp_path):
    done = run_script(bsmon_dir, tmp_path, "KeyboardInterrupt")
    assert done.returncode == -signal.SIGINT  # killed by SIGINT, as without bsmon
    shown = frames(done.stderr)
    assert shown and all("/probes/" not in frame for frame in shown), done.stderr
    assert 'train.py", line 18' in shown[0]  # the user's loop, then torch's DataLoader
    assert any("dataloader.py" in frame for frame in shown)
    assert done.stderr.rstrip().endswith("KeyboardInterrupt: at item 40")
    assert end_reason(bsmon_dir) == "interrupted: KeyboardInterrupt (Ctrl-C)"  # not "exited"


def test_other_exceptions_keep_their_whole_traceback(bsmon_dir, tmp_path):
    done = run_script(bsmon_dir, tmp_path, "ValueError")
    assert done.returncode == 1
    assert any("/probes/" in frame for frame in frames(done.stderr))  # nothing hidden
    assert done.stderr.rstrip().endswith("ValueError: at item 40")
    assert end_reason(bsmon_dir) == "the job raised ValueError"


TWICE = """
import os
import signal
import torch
from torch import nn
from bsmon.probes import attach
from bsmon.probes.runtime import interrupts


def ctrl_c_again(what):
    # a second Ctrl-C while bsmon's exit path runs
    def again(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10**5):  # Python code, where a signal's handler runs
            pass
        return what(*args, **kwargs)
    return again


def cut_short(what):
    def raises(*args, **kwargs):
        raise KeyboardInterrupt  # as a signal would, where nothing holds it back
    return raises


model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
mon = attach(model, optimizer, batch_size=8, name="twice")
interrupts.without_bsmon = ctrl_c_again(interrupts.without_bsmon)  # in the excepthook
mon._service.stop = {at_close}(mon._service.stop)  # while the monitor closes, at exit
for step in range(10**6):
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
    if step == 5:
        os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C
"""


@pytest.mark.parametrize(
    "at_close, ending",
    [
        ("ctrl_c_again", INTERRUPTED),
        ("cut_short", f"{INTERRUPTED}; bsmon's close was cut short (KeyboardInterrupt)"),
    ],
)
def test_a_second_ctrl_c_while_bsmon_closes_leaves_no_trace_and_a_record_that_ends(
    bsmon_dir, tmp_path, at_close, ending
):
    """The job's traceback and exit status as without bsmon, none of bsmon's frames, and the
    record's end line and summary: whole, or saying the close was cut short."""
    script = tmp_path / "twice.py"
    script.write_text(TWICE.format(at_close=at_close))
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        preexec_fn=interruptible,  # else, under a suite run in the background, Ctrl-C is ignored
    )
    assert done.returncode == -signal.SIGINT  # killed by the first Ctrl-C, as without bsmon
    assert "Exception ignored" not in done.stderr and "Error in" not in done.stderr
    shown = frames(done.stderr)
    assert shown and all("/probes/" not in frame for frame in shown), done.stderr
    lines = TWICE.splitlines()
    first_ctrl_c = next(n for n, line in enumerate(lines, 1) if line.endswith("the first Ctrl-C"))
    assert f'twice.py", line {first_ctrl_c}' in shown[-1]  # the job's own traceback, whole
    assert done.stderr.rstrip().endswith("KeyboardInterrupt")
    assert end_reason(bsmon_dir) == ending
