"""The host probe's answer, one tagged JSON line per program: the drivers probe's error is raised
as the drivers fact alone raises it, not planned on."""

from __future__ import annotations

import json

import pytest

from facts.drivers import DriversState
from facts.host_state import KimiHostState


def test_a_drivers_probe_error_fails_the_host_probe_as_it_fails_the_drivers_fact() -> None:
    error = json.dumps({"error": "dpkg-query: cannot read /var/lib/dpkg/status"})
    with pytest.raises(ValueError, match=r"^drivers probe: dpkg-query: cannot read /var/lib/dpkg/status$"):
        DriversState().process([error])
    with pytest.raises(ValueError, match=r"^drivers probe: dpkg-query: cannot read /var/lib/dpkg/status$"):
        KimiHostState().process([f"drivers {error}", 'state {"user": true}'])


def test_a_drivers_answer_is_passed_on() -> None:
    found = KimiHostState().process(['drivers {"os": {"id": "debian"}}', 'state {"user": true}'])
    assert found["drivers"] == {"os": {"id": "debian"}}
    assert found["user"] is True
    assert found["hardware"] is None
