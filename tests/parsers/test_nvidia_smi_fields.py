"""The query field table is the union of the names real ``nvidia-smi --help-query-gpu`` outputs list."""

from __future__ import annotations

import re

from kimi_deploy.parsers.nvidia_smi_fields import QUERY_GPU_FIELDS
from tests.parsers import FIXTURES

# A field's line in --help-query-gpu: its name, then its aliases ('"name" or "gpu_name"').
_FIELD_LINE = re.compile(r'"(?P<name>[^"]+)"(?P<aliases>(?: or "[^"]+")*)')


def _listed(text: str) -> set[str]:
    names: set[str] = set()
    for line in text.splitlines():
        found = _FIELD_LINE.fullmatch(line.strip())
        if found:
            names.add(found.group("name"))
            names.update(re.findall(r'"([^"]+)"', found.group("aliases")))
    return names


def test_the_table_is_every_name_the_captured_help_outputs_list() -> None:
    outputs = sorted(FIXTURES.glob("help_query_gpu_*.txt"))
    assert len(outputs) >= 6
    listed = {path.name: _listed(path.read_text(encoding="utf-8")) for path in outputs}
    # Each capture lists at least the oldest driver's 135 names, and the table holds them all.
    assert all(len(names) >= 135 for names in listed.values()), {k: len(v) for k, v in listed.items()}
    assert set().union(*listed.values()) == QUERY_GPU_FIELDS


def test_names_are_as_the_driver_spells_them() -> None:
    assert {"pci.baseClass", "encoder.stats.sessionCount", "fabric.cliqueId", "name", "gpu_name"} <= QUERY_GPU_FIELDS
    assert all(re.fullmatch(r"[A-Za-z][A-Za-z0-9_.]*", name) for name in QUERY_GPU_FIELDS)
