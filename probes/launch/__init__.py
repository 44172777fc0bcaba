"""Zero code: ``bsmon run`` starts a script nobody changed, and bsmon attaches inside it.

Modules, one job each:

- ``environment``: the environment ``bsmon run`` gives the command (standard library only);
- ``boot/sitecustomize.py``: the start-up hook every Python process of the job loads;
- ``autoattach``: the agent the hook loads once torch is imported (attaches at the first
  ``optimizer.step()``);
- ``notes``: what each process tells ``bsmon run`` about attaching, and why not;
- ``accelerate_loss``: the loss of a script that trains through accelerate, as it sees it.

The ``bsmon run`` command imports this package (``environment`` and ``notes``): neither
torch nor textual. ``autoattach`` runs in the job and is not exported here.
"""

from __future__ import annotations

from . import notes
from .environment import child_environment, job_name, log_name

__all__ = ["child_environment", "job_name", "log_name", "notes"]
