"""kimi-deploy: the pure core (recipe, inventory model, planner, rendering) and the CLI."""

from __future__ import annotations

__version__ = "0.1.0"
