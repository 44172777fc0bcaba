"""``python -m bsmon.probes.sidecar RECIPE``: the max-batch-size probe's separate process."""

from __future__ import annotations

import sys

from .probe.measure import main

if __name__ == "__main__":
    sys.exit(main())
