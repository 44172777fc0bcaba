"""The environment ``bsmon run`` gives the command it runs (standard library only).

``bsmon run`` puts ``boot/`` first on ``PYTHONPATH`` and sets ``BSMON_RUN`` to the job's name.
Every Python process the command starts (the script, torchrun's workers, DataLoader workers
started with spawn) then imports ``boot/sitecustomize.py`` at start-up; that file waits for
``import torch`` and loads ``bsmon.probes.launch.autoattach``. See docs/zero-code.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..runtime.audience import ENV_AUTOPILOT, ENV_RESIZABLE, ENV_RUN
from ..wire import discovery
from . import notes as run_notes

BOOT_DIR = Path(__file__).resolve().parent / "boot"
PYTHON_LAUNCHERS = ("python", "torchrun", "accelerate", "deepspeed", "uv", "lightning", "fabric")
LAUNCHER_MODULES = (
    "torch.distributed.run",
    "torch.distributed.launch",
    "accelerate.commands.launch",
)


def child_environment(
    base: Mapping[str, str],
    name: str,
    directory: Path,
    run_id: str,
    *,
    resizable: bool = False,
    autopilot: bool = False,
) -> dict[str, str]:
    """``base`` plus what the agent in the child needs: the boot directory first on
    ``PYTHONPATH``, the job's name, the socket directory this ``bsmon run`` watches, the
    records directory ``base`` names (not the socket directory's, which logout or a reboot
    may empty), the run's id (the processes' notes carry it, see ``run_notes``) and, with
    ``resizable``, that the script's DataLoader may be resized (with ``autopilot``, by the
    autopilot too)."""
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join([str(BOOT_DIR), *_user_python_path(env)])
    env[ENV_RUN] = name
    env[discovery.ENV_RECORDS] = str(discovery.records_dir(base))  # before the socket dir's
    env[discovery.ENV_DIR] = str(directory)
    env[run_notes.ENV_RUN_ID] = run_id
    for variable, wanted in ((ENV_RESIZABLE, resizable or autopilot), (ENV_AUTOPILOT, autopilot)):
        if wanted:
            env[variable] = "1"
        else:
            env.pop(variable, None)
    return env


def _user_python_path(env: Mapping[str, str]) -> list[str]:
    """The entries of the user's ``PYTHONPATH`` (none when unset or empty), without bsmon's own.
    An empty entry is kept: Python reads it as the working directory, and the shell's
    ``PYTHONPATH=$PYTHONPATH:/x`` makes one when ``PYTHONPATH`` was empty."""
    value = env.get("PYTHONPATH", "")
    return [p for p in value.split(os.pathsep) if p != str(BOOT_DIR)] if value else []


def job_name(command: Sequence[str]) -> str:
    """A name for the job from its command: the script's or module's name for a Python
    launcher (``python train.py`` -> ``train``, ``torchrun ... -m pkg.train`` -> ``train``,
    ``fabric run --strategy ddp train_fabric.py`` -> ``train_fabric``), else the program's
    name."""
    program = Path(command[0]).name
    if program.startswith(PYTHON_LAUNCHERS):
        args = list(command[1:])
        for i, arg in enumerate(args):
            module = args[i + 1] if arg == "-m" and i + 1 < len(args) else None
            if module is not None and module not in LAUNCHER_MODULES:
                return module.rsplit(".", 1)[-1]
            if arg.endswith(".py") and not arg.startswith("-"):
                return Path(arg).stem
    return program or "job"


def log_name(name: str) -> str:
    """``name`` made safe to use in a file name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "job"
