"""The host probe's answer, one tagged JSON line per program: the drivers probe's error is raised
as the drivers fact alone raises it, not planned on."""

from __future__ import annotations

import json

import pytest

from kimi_pyinfra.facts.drivers import DriversState
from kimi_pyinfra.facts.host_state import KimiHostState


def test_a_drivers_probe_error_fails_the_host_probe_as_it_fails_the_drivers_fact() -> None:
    error = json.dumps({"error": "dpkg-query: cannot read /var/lib/dpkg/status"})
    with pytest.raises(ValueError, match=r"^drivers probe: dpkg-query: cannot read /var/lib/dpkg/status$"):
        DriversState().process([error])
    with pytest.raises(ValueError, match=r"^drivers probe: dpkg-query: cannot read /var/lib/dpkg/status$"):
        KimiHostState().process([f"drivers {error}", 'state {"user": true}'])


def test_a_drivers_answer_is_passed_on() -> None:
    found = KimiHostState().process(['drivers {"os": {"id": "debian"}}', 'state {"user": true}'])
    assert dict(found["drivers"] or {}) == {"os": {"id": "debian"}}
    assert found["user"] is True
    assert found["hardware"] is None


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        ('state {"free": ' + "9" * 5000 + "}", r"^state probe: not JSON: an integer over \d+ digits$"),
        ("state " + "[" * 100_000 + "]" * 100_000, r"^state probe: JSON nested deeper than 32 levels$"),
        ('hardware {"gpus": NaN}', r"^hardware probe: not JSON: NaN is not JSON"),
    ],
)
def test_a_hostile_probe_answer_is_one_line_naming_the_probe(line: str, rule: str) -> None:
    lines = [line] if line.startswith("state") else [line, 'state {"user": true}']
    with pytest.raises(ValueError, match=rule):
        KimiHostState().process(lines)
