"""The ``tokenspeed`` (and ``ts``) console script of the stand-in wheel, packaged as ``tokenspeed/cli.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING

# kimi_standin is a top-level package inside the wheel; in this repository it lives in localcluster/standins.
if TYPE_CHECKING:
    from localcluster.standins.kimi_standin.engine import cli_main
else:
    from kimi_standin.engine import cli_main


def main() -> None:
    cli_main("tokenspeed")


if __name__ == "__main__":
    main()
