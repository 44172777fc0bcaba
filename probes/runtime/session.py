"""Who this process is: the session the protocol and the record describe, and its name."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import torch

from ..version import __version__
from ..wire.protocol import SessionInfo
from . import audience, distributed


def session_info(name: str) -> SessionInfo:
    """This process's session as the protocol and the record describe it, starting now."""
    rank, world_size = distributed.world()
    return SessionInfo(
        name=name,
        pid=os.getpid(),
        host=socket.gethostname(),
        argv=list(sys.argv),
        start_time=time.time(),
        python=sys.version.split()[0],
        torch_version=str(torch.__version__),
        bsmon_version=__version__,
        cwd=os.getcwd(),
        rank=rank,
        world_size=world_size,
        zero_code=audience.zero_code(),
    )


def default_name() -> str:
    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else ""
    return script if script and script not in ("-c", "-m", "") else "python"
