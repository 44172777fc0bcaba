"""``bsmon attach TARGET``: the dashboard on one job; plain ``bsmon``: find a job, or pick one."""

from __future__ import annotations

import os

from bsmon.probes.wire import discovery

from ..errors import CliError
from .records import say_shown_record


def cmd_attach(target: str, *, readonly: bool) -> int:
    try:
        socket = discovery.resolve_target(target)
    except LookupError as exc:
        raise CliError(str(exc)) from None
    from ..app import BsmonApp, follow_job

    name = None if target.isdigit() or target.endswith(".sock") or os.sep in target else target
    app = BsmonApp(follow_job(socket, name, None), readonly=readonly)
    app.run()
    say_shown_record(app.source)
    return 0


def cmd_dashboard(*, readonly: bool) -> int:
    from ..app import BsmonApp

    app = BsmonApp(readonly=readonly)
    app.run()
    say_shown_record(app.source)
    return app.return_code or 0
