"""``python -m sglang.launch_server ...``: the serve flags without a subcommand (``sglang/launch_server.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

# kimi_standin is a top-level package inside the wheel; in this repository it lives in localcluster/standins.
if TYPE_CHECKING:
    from localcluster.standins.kimi_standin.engine import module_main
else:
    from kimi_standin.engine import module_main

if __name__ == "__main__":
    module_main("sglang")
