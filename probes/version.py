"""bsmon's version as installed (``0+unknown`` in a source tree that was not installed): the
public ``bsmon.probes.__version__``, and the session's ``bsmon_version``."""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("bsmon")
except metadata.PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0+unknown"
