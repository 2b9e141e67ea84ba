"""The fidelity ledger: every flag, environment variable, config key and unit directive a plan
emits, per topology, beside the source that says it is right.

Sources are kept by the release that reads them, one file a release beside the flag catalogs
(``kimi_deploy/citations/vllm-0.34.0.yaml``, ``systemd.yaml``, ``nginx.yaml``): ``kind ->
name -> citation``, each citation naming a release's file and line or a published document
(a URL). The ledger is made from the plan (``kimi_deploy.render.emitted``), so it cannot drift from
what a deploy writes: an emission without a citation, or a citation nothing emits, is an error
that names it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kimi_deploy.errors import ConfigError
from kimi_deploy.render.emitted import KINDS, PLACEHOLDER, Emission
from kimi_deploy.yaml_file import read_yaml_mapping

CITATION_DIR = Path(__file__).resolve().parent.parent / "citations"
# A citation names where: a release's file and line ("vllm/envs.py:1821") or a document's URL.
_WHERE = re.compile(r"[\w./-]+\.\w+:\d+|https://\S+")
_SHOWN = 60  # a value's characters shown in the ledger

# program -> kind -> name -> citation
Citations = dict[str, dict[str, dict[str, str]]]


@dataclass(frozen=True)
class Gaps:
    """What the ledger cannot vouch for: emissions no citation covers, citations nothing emits."""

    uncited: tuple[Emission, ...]
    unused: tuple[tuple[str, str, str], ...]

    def lines(self) -> list[str]:
        out = [
            f"{e.topology}: {e.unit}: {e.kind} {e.name} ({e.program}): no citation in "
            f"{CITATION_DIR.name}/{e.program}.yaml {e.kind}"
            for e in self.uncited
        ]
        out += [
            f"{CITATION_DIR.name}/{program}.yaml: {kind}: {name}: cited, but no topology emits it"
            for program, kind, name in self.unused
        ]
        return out


def read_citations(programs: Iterable[str], folder: Path = CITATION_DIR) -> Citations:
    """The citations of each of ``programs`` (a release without a file has none)."""
    out: Citations = {}
    for program in sorted(set(programs)):
        path = folder / f"{program}.yaml"
        if not path.is_file():
            continue
        data = read_yaml_mapping(path)
        shown = f"{folder.name}/{path.name}"
        out[program] = {}
        for kind, entries in data.items():
            if kind not in KINDS:
                raise ConfigError(shown, str(kind), f"expected one of {', '.join(KINDS)}")
            if not isinstance(entries, dict):
                found = type(entries).__name__
                raise ConfigError(shown, kind, f"expected a mapping of name to citation, found {found}")
            for name, citation in entries.items():
                if not isinstance(citation, str) or not _WHERE.search(citation):
                    rule = "a citation names a release's file:line or a URL"
                    raise ConfigError(shown, f"{kind}.{name}", f"{rule}, found {citation!r}")
            out[program][kind] = {str(k): v for k, v in entries.items()}
    return out


def gaps(emitted: Iterable[Emission], citations: Mapping[str, Mapping[str, Mapping[str, str]]]) -> Gaps:
    emitted = list(emitted)
    uncited = tuple(e for e in emitted if e.name not in citations.get(e.program, {}).get(e.kind, {}))
    used = {(e.program, e.kind, e.name) for e in emitted}
    unused = tuple(
        (program, kind, name)
        for program, kinds in sorted(citations.items())
        for kind, names in sorted(kinds.items())
        for name in sorted(names)
        if (program, kind, name) not in used
    )
    return Gaps(uncited, unused)


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _value(value: str) -> str:
    if value == PLACEHOLDER:
        return "(secret)"
    if not value:
        return ""
    shown = value if len(value) <= _SHOWN else value[: _SHOWN - 1] + "…"
    return f"`{_cell(shown)}`"


def render(recipe_file: str, inventory_file: str, emitted: Iterable[Emission], citations: Citations) -> str:
    """The ledger as Markdown: one table a topology, a row an emission, in plan order."""
    emitted = list(emitted)
    lines = [
        f"# Fidelity ledger: {recipe_file} on {inventory_file}",
        "",
        f"Made by `kimi-deploy ledger {recipe_file} {inventory_file}` from the plan; do not edit.",
        "Every flag, environment variable, config key and unit directive the plan emits, per",
        "topology, with the release that reads it and the source that says it is right",
        f"(`kimi_deploy/{CITATION_DIR.name}/<release>.yaml`). The value is the first host's.",
    ]
    topologies = list(dict.fromkeys(e.topology for e in emitted))
    for topology in topologies:
        rows = [e for e in emitted if e.topology == topology]
        lines += ["", f"## {topology}", "", f"{len(rows)} emissions.", ""]
        lines += ["| unit | read by | kind | name | value | source |", "|---|---|---|---|---|---|"]
        for e in rows:
            source = citations.get(e.program, {}).get(e.kind, {}).get(e.name, "**uncited**")
            cells = (e.unit, e.program, e.kind, f"`{_cell(e.name)}`", _value(e.value), _cell(source))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
