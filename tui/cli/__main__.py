"""``python -m bsmon.tui.cli``: the ``bsmon`` command line."""

from __future__ import annotations

import sys

from .parser import main

sys.exit(main())
