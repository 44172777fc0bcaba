"""Who reads bsmon's reasons: the author of a script that calls ``attach()``, or someone who
ran a script nobody changed under ``bsmon run``.

A reason that ends "pass batch_size= to attach()" helps the first and means nothing to the
second, who never called attach(). The few reasons that say what to change are worded for
the process's audience: ``bsmon run``'s agent says so once, just before it attaches
(``launch.autoattach``), and the reasons ask ``say(attach=..., run=...)``.

The names of the variables ``bsmon run`` sets for the command it runs live here too, below
both their readers: ``launch`` sets and reads them, and a probe's sidecar (``maxbatch``),
started from the job, must be started without them.
"""

from __future__ import annotations

ENV_RUN = "BSMON_RUN"  # the job's name; boot/sitecustomize.py reads it (keep the two in step)
ENV_RESIZABLE = "BSMON_RESIZABLE"  # "1": the agent may resize the script's DataLoader
ENV_AUTOPILOT = "BSMON_AUTOPILOT"  # "1": and switch the autopilot on (docs/autopilot.md)

_zero_code = [False]


def set_zero_code(on: bool) -> None:
    """This process's monitor is (or no longer is) ``bsmon run``'s, not the script's."""
    _zero_code[0] = on


def zero_code() -> bool:
    return _zero_code[0]


def say(*, attach: str, run: str) -> str:
    """The words for whoever reads this process's reasons."""
    return run if _zero_code[0] else attach


def examples_unknown() -> str:
    """The end of a reason about examples bsmon could not count."""
    return say(
        attach="pass batch_size= to attach()",
        run="bsmon run counts them from DataLoader batches or the model's input, and saw neither",
    )
