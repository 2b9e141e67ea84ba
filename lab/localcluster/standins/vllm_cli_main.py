"""The ``vllm`` console script of the stand-in wheel, packaged as ``vllm/entrypoints/cli/main.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING

# kimi_standin is a top-level package inside the wheel; in this repository it lives in localcluster/standins.
if TYPE_CHECKING:
    from localcluster.standins.kimi_standin.engine import cli_main
else:
    from kimi_standin.engine import cli_main


def main() -> None:
    cli_main("vllm")


if __name__ == "__main__":
    main()
