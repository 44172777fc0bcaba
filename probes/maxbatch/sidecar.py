"""``python -m bsmon.probes.maxbatch.sidecar RECIPE``: the probe's separate process."""

from __future__ import annotations

import sys

from .measure import main

if __name__ == "__main__":
    sys.exit(main())
