"""``python -m localcluster up|status|down``."""

from __future__ import annotations

import sys

from localcluster.cli import main

sys.exit(main())
