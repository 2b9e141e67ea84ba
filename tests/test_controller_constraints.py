"""constraints/controller.txt pins the controller's own environment: every default dependency of
pyproject.toml, each within its range, and nothing of an extra."""

from __future__ import annotations

import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints" / "controller.txt").read_text(encoding="utf-8").splitlines():
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        requirement = Requirement(text)
        (spec,) = requirement.specifier
        assert spec.operator == "==", line
        pins[canonicalize_name(requirement.name)] = spec.version
    return pins


def _project() -> dict[str, list[str]]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    return {"": project["dependencies"], **project["optional-dependencies"]}


def test_every_default_dependency_is_pinned_within_its_range() -> None:
    pins = _pins()
    for line in _project()[""]:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"constraints/controller.txt has no pin of {name}"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} not in {line}"


def test_no_extra_is_pulled_into_the_default_environment() -> None:
    pins = _pins()
    default = {canonicalize_name(Requirement(line).name) for line in _project()[""]}
    for extra, lines in _project().items():
        for line in lines:
            name = canonicalize_name(Requirement(line).name)
            if extra and name not in default and name != "kimi-deploy":
                assert name not in pins, f"{name} (extra {extra}) is pinned in the controller's constraints"
