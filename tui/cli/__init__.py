"""The ``bsmon`` command line: one module per command, the parsing in one place.

Modules, one job each:

- ``parser``: the arguments (global options before or after the subcommand), ``main``, and the
  dispatch to each command; wrong arguments are one line and exit code 2;
- ``jobs``: ``bsmon list``, the running jobs as a table or as JSON;
- ``attach``: ``bsmon attach TARGET``, the dashboard on one job, and plain ``bsmon``;
- ``run``: ``bsmon run -- CMD``, a training command run with bsmon attached;
- ``demo``: ``bsmon demo``, the demo job in a subprocess and the dashboard on it;
- ``probe``: ``bsmon probe TARGET``, a job's largest batch size, probed and printed;
- ``record``: ``bsmon export`` and ``bsmon replay``, a session record to a summary or on screen.

``python -m bsmon.tui.cli`` runs ``main`` (``__main__``), as the ``bsmon`` script does.
Only ``parser`` imports the command modules; the commands that need the dashboard import it
when they run.
"""

from __future__ import annotations

from .parser import main

__all__ = ["main"]
