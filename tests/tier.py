"""The unit tier: tests that start no process and open no listening socket.

A test module that starts either (a local cluster, a server, a subprocess) is marked
``pytest.mark.processes``, and every test under ``tests/e2e`` is; the rest are the unit tier,
selected with ``-m "not processes"``. The tier holds itself to that: while an unmarked test runs
(its fixtures' setup and teardown included), starting a process or listening on a socket raises,
naming the mark to add.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from gevent import monkey  # type: ignore[import-untyped]

MARK = "processes"


class StartsProcesses(RuntimeError):
    """A test of the unit tier started a process or a server."""


def _classes() -> list[tuple[type, str]]:
    """The methods that start a process or a server, in the standard library's classes and in
    gevent's (pyinfra's CLI patches the standard library with them)."""
    out: list[tuple[type, str]] = []
    for cls in {subprocess.Popen, monkey.get_original("subprocess", "Popen")}:
        out.append((cls, "__init__"))
    for cls in {socket.socket, monkey.get_original("socket", "socket")}:
        out.append((cls, "listen"))
    return out


def _refusing(name: str, what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise StartsProcesses(f"{name} {what}: mark its module with pytest.mark.{MARK} (tests/tier.py)")

    return refuse


@contextmanager
def unit_tier(item: pytest.Item) -> Iterator[None]:
    """While ``item`` runs: refuse processes and servers, unless it is marked."""
    if item.get_closest_marker(MARK) is not None:
        yield
        return
    saved = [(cls, attr, cls.__dict__[attr]) for cls, attr in _classes() if attr in cls.__dict__]
    for cls, attr, _ in saved:
        what = "starts a process" if attr == "__init__" else "listens on a socket"
        setattr(cls, attr, _refusing(item.nodeid, what))
    try:
        yield
    finally:
        for cls, attr, original in saved:
            setattr(cls, attr, original)
