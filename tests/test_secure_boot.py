"""Secure Boot before the NVIDIA module is built: the drivers probe reads the firmware's state and
mokutil's word on DKMS's signing key; a host whose firmware would refuse the module DKMS is about
to build stops before any change, in one line saying what to do."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.accelerators.nvidia_drivers import DKMS_KEYS
from kimi_deploy.host.drivers import plan_drivers, probe_request
from kimi_deploy.hostside.driver_probe import SECURE_BOOT_VAR, secure_boot
from kimi_deploy.plan.planner import plan
from kimi_deploy.plan.servespec import Plan
from kimi_deploy.recipe import Drivers, NvidiaDriver, Recipe
from tests.conftest import RECIPE

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "driver_probe"
REPO = "http://10.213.11.1:8767/compute/cuda/repos"
DEBIAN_KEY = "/var/lib/dkms/mok.pub"


@pytest.fixture(scope="module")
def full_plan(recipe: Recipe, prod: Any) -> Plan:
    return plan(recipe, RECIPE, prod)


def found(name: str, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return {**data, **changes}


def refusals(recipe: Recipe, full_plan: Plan, host: str, probed: dict[str, Any]) -> tuple[str, ...]:
    want = recipe.model_copy(update={"drivers": Drivers(nvidia=NvidiaDriver(branch="580", version="580.95.05"))})
    spec = full_plan.for_host(host)
    return plan_drivers(want, spec, full_plan.topology(spec.topology), probed, repo_url=REPO).refusals


def on(key_state: str | None) -> dict[str, Any]:
    return {"enabled": True, "keys": {} if key_state is None else {DEBIAN_KEY: key_state}}


def test_the_probe_asks_for_both_dkms_keys(recipe: Recipe, full_plan: Plan) -> None:
    asked = probe_request(recipe, full_plan.for_host("b300-01"))
    assert asked["secure_boot"] == sorted(DKMS_KEYS.values())


@pytest.mark.parametrize(
    ("state", "line"),
    [
        (
            "missing",
            f"Secure Boot is on and the DKMS signing key {DEBIAN_KEY} is missing: the NVIDIA module built now "
            "would not load; make it with `dkms generate_mok`, import it with `mokutil --import "
            f"{DEBIAN_KEY}`, enroll it at the next boot, then run again (or turn Secure Boot off)",
        ),
        (
            "not enrolled",
            f"Secure Boot is on and the DKMS signing key {DEBIAN_KEY} is not enrolled: the NVIDIA module "
            f"built now would not load; import it with `mokutil --import {DEBIAN_KEY}`, enroll it at the "
            "next boot, then run again (or turn Secure Boot off)",
        ),
    ],
)
def test_secure_boot_without_the_key_enrolled_stops_a_driver_install(
    recipe: Recipe, full_plan: Plan, state: str, line: str
) -> None:
    assert refusals(recipe, full_plan, "b300-01", found("gb300-fresh", secure_boot=on(state))) == (
        f"b300-01: drivers: {line}",
    )


def test_an_enrolled_key_or_secure_boot_off_lets_the_install_go(recipe: Recipe, full_plan: Plan) -> None:
    assert refusals(recipe, full_plan, "b300-01", found("gb300-fresh", secure_boot=on("enrolled"))) == ()
    off = {"enabled": False, "keys": {}}
    assert refusals(recipe, full_plan, "b300-01", found("gb300-fresh", secure_boot=off)) == ()
    assert refusals(recipe, full_plan, "b300-01", found("gb300-fresh")) == ()  # an older probe's answer


def test_nothing_to_build_nothing_to_refuse(recipe: Recipe, full_plan: Plan) -> None:
    """A converged host builds no module: Secure Boot does not stop it."""
    converged = found("gb300-converged", secure_boot=on("not enrolled"))
    assert refusals(recipe, full_plan, "b300-01", converged) == ()


def test_ubuntu_hosts_need_ubuntus_key(recipe: Recipe, full_plan: Plan) -> None:
    ubuntu = {"id": "ubuntu", "version_id": "24.04", "pretty": "Ubuntu 24.04.3 LTS", "arch": "amd64"}
    key = DKMS_KEYS["ubuntu"]
    probed = found("gb300-fresh", os=ubuntu, secure_boot={"enabled": True, "keys": {key: "not enrolled"}})
    (line,) = refusals(recipe, full_plan, "b300-01", probed)
    assert f"the DKMS signing key {key} is not enrolled" in line
    unknown = {"enabled": True, "keys": {key: "unknown: mokutil is not installed"}}
    (line,) = refusals(recipe, full_plan, "b300-01", found("gb300-fresh", os=ubuntu, secure_boot=unknown))
    assert f"the DKMS signing key {key} is not known to be enrolled (mokutil is not installed): " in line


def _efi(tmp_path: Path, value: int | None) -> Path:
    efi = tmp_path / "efi"
    (efi / "efivars").mkdir(parents=True)
    if value is not None:
        (efi / SECURE_BOOT_VAR).write_bytes(b"\x06\x00\x00\x00" + bytes([value]))
    return efi


def test_the_probe_reads_the_firmware_and_mokutils_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert secure_boot([DEBIAN_KEY], 5, str(tmp_path / "no-efi")) == {"enabled": False, "keys": {}}
    assert secure_boot([DEBIAN_KEY], 5, str(_efi(tmp_path / "a", None))) == {"enabled": False, "keys": {}}
    assert secure_boot([DEBIAN_KEY], 5, str(_efi(tmp_path / "b", 0))) == {"enabled": False, "keys": {}}
    efi = str(_efi(tmp_path / "c", 1))
    enrolled, pending = tmp_path / "enrolled.der", tmp_path / "new.der"
    enrolled.write_bytes(b"key")
    pending.write_bytes(b"other key")
    # mokutil's two answers, as its test_key prints them (lcp/mokutil src/mokutil.c)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mokutil = bin_dir / "mokutil"
    mokutil.write_text(
        f'#!/bin/sh\nif [ "$2" = {enrolled} ]; then echo "$2 is already enrolled"; exit 1; fi\n'
        'echo "$2 is not enrolled"\n',
        encoding="utf-8",
    )
    mokutil.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    keys = [str(enrolled), str(pending), str(tmp_path / "absent.pub")]
    assert secure_boot(keys, 5, efi) == {
        "enabled": True,
        "keys": {str(enrolled): "enrolled", str(pending): "not enrolled", str(tmp_path / "absent.pub"): "missing"},
    }
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert secure_boot([str(enrolled)], 5, efi)["keys"] == {str(enrolled): "unknown: mokutil is not installed"}
