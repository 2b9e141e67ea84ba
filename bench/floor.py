"""The floor of a pyinfra run: connect to every host and read one fact, change nothing."""

from __future__ import annotations

from pyinfra.context import host
from pyinfra.facts.server import Hostname

host.get_fact(Hostname)
