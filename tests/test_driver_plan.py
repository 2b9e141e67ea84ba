"""The drivers step's plan: what each host of the example inventory gets, from what its probe found.

Probe answers are ``tests/fixtures/driver_probe/*.json``, captured with ``hostside/driver_probe.py``
on test hosts (fresh; converged on 580.95.05; upgraded to 590.48.01 and not rebooted), varied
here one field at a time. Refusal lines are written out by hand: a change of wording shows here.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from kimi_deploy.accelerators.interface import DriversPlan
from kimi_deploy.accelerators.nvidia_drivers import (
    IMEX_NODES,
    NVIDIA_REPO,
    NvidiaPlan,
    needs_fabric_manager,
    needs_nvlsm,
    upstream,
)
from kimi_deploy.accelerators.nvidia_models import open_modules_only
from kimi_deploy.accelerators.tpu import TPU_SYSCTL_FILE
from kimi_deploy.errors import ConfigError
from kimi_deploy.host.drivers import host_kind_lines, plan_drivers, probe_request
from kimi_deploy.host.preflight import Needs, check
from kimi_deploy.inventory import Inventory, make_host
from kimi_deploy.plan.planner import plan
from kimi_deploy.plan.servespec import HostPlan, Plan
from kimi_deploy.recipe import Drivers, NvidiaDriver, Recipe
from kimi_deploy.recipe_file import load_recipe
from kimi_pyinfra.inventory_file import load_inventory
from tests.conftest import PROD, RECIPE, ROOT
from tests.profiles import profile_of

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "driver_probe"
LOCAL_REPO = "http://10.213.11.1:8767/compute/cuda/repos"
FLAG = "allow it with --data kimi_reboot=allowed"


def probe(name: str, **changes: Any) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    found.update(changes)
    return found


def converged(**changes: Any) -> dict[str, Any]:
    return probe("gb300-converged", **changes)


@pytest.fixture(scope="module")
def full_plan(recipe: Recipe, prod: Inventory) -> Plan:
    return plan(recipe, RECIPE, prod)


def pinned(recipe: Recipe, **nvidia: Any) -> Recipe:
    """The recipe with ``drivers.nvidia`` replaced (branch 580 unless given)."""
    return recipe.model_copy(update={"drivers": Drivers(nvidia=NvidiaDriver(**{"branch": "580", **nvidia}))})


def drivers(
    recipe: Recipe, full_plan: Plan, host: str, found: dict[str, Any], allowed: bool = False, repo: str = LOCAL_REPO
) -> DriversPlan:
    spec = full_plan.for_host(host)
    return plan_drivers(recipe, spec, full_plan.topology(spec.topology), found, repo_url=repo, reboot_allowed=allowed)


def nvidia_of(p: DriversPlan) -> NvidiaPlan:
    assert p.nvidia is not None, p.refusals
    return p.nvidia


# Recipe and inventory keys -----------------------------------------------------------------------


def _load(tmp_path: Path, **nvidia: Any) -> Recipe:
    data = yaml.safe_load((ROOT / RECIPE).read_text(encoding="utf-8"))
    data["drivers"]["nvidia"].update(nvidia)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return load_recipe(path)


@pytest.mark.parametrize(
    ("nvidia", "line"),
    [
        ({"version": "590.48.01"}, "drivers.nvidia: version 590.48.01 is not on branch 580"),
        ({"version": 580.95}, "drivers.nvidia.version: Input should be a valid string, found float 580.95"),
        ({"flavor": "closed"}, "drivers.nvidia.flavor: Input should be 'open' or 'proprietary', found str 'closed'"),
        ({"compute_only": "yes"}, "drivers.nvidia.compute_only: Input should be a valid boolean, found str 'yes'"),
        ({"pin": "580"}, "drivers.nvidia.pin: unknown key"),
    ],
)
def test_a_bad_driver_pin_is_one_line(tmp_path: Path, nvidia: dict[str, Any], line: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, **nvidia)
    assert str(err.value) == f"{tmp_path / 'r.yaml'}: {line}"


@pytest.mark.parametrize(
    ("per_arch", "line"),
    [
        (
            {"arm64": {"branch": "590", "version": "580.95.05"}},
            "drivers.nvidia.per_arch.arm64: version 580.95.05 is not on branch 590",
        ),
        (
            {"ppc64el": {"branch": "590"}},
            "drivers.nvidia.per_arch.ppc64el.[key]: Input should be 'amd64' or 'arm64', found str 'ppc64el'",
        ),
    ],
)
def test_a_bad_architecture_pin_is_one_line(tmp_path: Path, per_arch: dict[str, Any], line: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, per_arch=per_arch)
    assert str(err.value) == f"{tmp_path / 'r.yaml'}: {line}"


def test_grace_hosts_take_their_architectures_pin(tmp_path: Path, full_plan: Plan) -> None:
    """NVIDIA's sbsa tree (Grace hosts) may carry other branches than x86_64's: a pin per architecture."""
    want = _load(tmp_path, per_arch={"arm64": {"branch": "590", "version": "590.48.01"}})
    arm = probe("gb300-fresh", os={"id": "debian", "version_id": "12", "pretty": "Debian 12", "arch": "arm64"})
    grace = nvidia_of(drivers(want, full_plan, "gb300-p01", arm))
    assert (grace.pin, grace.target, grace.repository.url) == (
        "nvidia-driver-pinning-590.48.01",
        "590.48.01",
        f"{LOCAL_REPO}/debian12/sbsa",
    )
    x86 = nvidia_of(drivers(want, full_plan, "b300-01", probe("gb300-fresh")))
    assert (x86.pin, x86.target, x86.branch) == ("nvidia-driver-pinning-580", None, "580")
    lines = host_kind_lines(want, full_plan.topology("gb300-pd"))
    assert lines[0].startswith(
        "drivers (gb300-p01 .. gb300-d04, 10 hosts): GB300 x4: pin nvidia-driver-pinning-580 "
        "(arm64: nvidia-driver-pinning-590.48.01); packages "
    )


def test_an_exact_version_on_the_branch_loads(tmp_path: Path) -> None:
    want = _load(tmp_path, version="580.95.05").drivers.nvidia
    assert want is not None
    assert (want.branch, want.version, want.keyring) == ("580", "580.95.05", "1.1-1")


def test_host_keys_of_the_drivers_step_are_checked() -> None:
    with pytest.raises(ConfigError) as err:
        make_host("inv.py", "h1", (), {"kimi_reboot": "yes"})
    assert str(err.value) == "inv.py: host h1: kimi_reboot: Input should be 'allowed', found str 'yes'"
    ok = make_host("inv.py", "h1", (), {"kimi_reboot": "allowed", "kimi_nvidia_repo_url": LOCAL_REPO})
    assert (ok.vars.kimi_reboot, ok.vars.kimi_nvidia_repo_url) == ("allowed", LOCAL_REPO)


# What each kind of host gets --------------------------------------------------------------------


def test_nvswitch_systems_run_a_fabric_manager() -> None:
    assert needs_fabric_manager("B300", 8)
    assert needs_fabric_manager("NVIDIA H200", 8)
    # Grace Blackwell trays have no NVSwitch: the switch trays' NVOS runs the fabric manager, and
    # nv-fabricmanager on a compute tray exits with NV_WARN_NOTHING_TO_DO.
    assert not needs_fabric_manager("GB300", 4)
    assert not needs_fabric_manager("NVIDIA GB200", 4)
    assert not needs_fabric_manager("H100", 4)  # HGX H100 4-GPU: GPUs linked directly
    assert not needs_fabric_manager("L40S", 8)


def test_a_fresh_b300_host_gets_repository_pin_driver_and_fabric_manager(recipe: Recipe, full_plan: Plan) -> None:
    want = pinned(recipe, version="580.95.05")
    p = nvidia_of(drivers(want, full_plan, "b300-01", probe("gb300-fresh")))
    assert p.repository.url == f"{LOCAL_REPO}/debian12/x86_64"
    assert p.repository.keyring == "cuda-keyring_1.1-1_all.deb"
    assert (p.repository.present, p.repository.refresh) == (False, True)
    assert (p.pin, p.pin_installed) == ("nvidia-driver-pinning-580.95.05", False)
    # B300 is an NVLink 5 board: its fabric manager runs the NVLink subnet manager, whose packages
    # come in the same apt transaction, unversioned and not held
    assert p.install == (
        "nvidia-driver-cuda",
        "nvidia-kernel-open-dkms",
        "nvidia-fabricmanager",
        "nvlsm",
        "infiniband-diags",
    )
    assert p.packages == p.install[:3]
    assert p.tools == ("nvlsm", "infiniband-diags")
    assert p.headers == "linux-headers-6.18.44-fc-v657"
    # The test host's nvidia-smi reports 580.95.05 before any package: installing it needs no reboot.
    assert (p.target, p.loaded, p.reboot) == ("580.95.05", "580.95.05", "no")
    assert p.imex_nodes is None
    assert p.module_options is None  # no IMEX, no channel
    assert p.modules_file is not None
    assert (p.modules_file.path, p.modules_file.content.splitlines()[-1]) == (
        "/etc/modules-load.d/nvidia-nvlsm.conf",
        "ib_umad",
    )
    assert [(s.unit, s.active, s.restart, s.modules) for s in p.services] == [
        ("nvidia-fabricmanager", "inactive", True, ("ib_umad",))
    ]


def test_only_nvlink5_boards_get_the_subnet_manager(recipe: Recipe, full_plan: Plan) -> None:
    assert needs_nvlsm("B300", 8)
    assert needs_nvlsm("NVIDIA B200", 8)
    assert not needs_nvlsm("H200", 8)  # NVSwitches on the board, managed by the fabric manager alone
    assert not needs_nvlsm("GB300", 4)
    assert not needs_nvlsm("B300", 4)
    h200 = nvidia_of(drivers(recipe, full_plan, "h200-01", probe("gb300-fresh")))
    assert (h200.tools, h200.modules, h200.modules_file) == ((), (), None)
    assert [s.modules for s in h200.services] == [()]


def test_a_b300_host_missing_its_subnet_manager_gets_it_and_restarts_the_fabric_manager(
    recipe: Recipe, full_plan: Plan
) -> None:
    want = pinned(recipe, version="580.95.05")
    fresh = nvidia_of(drivers(want, full_plan, "b300-01", probe("gb300-fresh")))
    assert fresh.modules_file is not None
    modules = hashlib.sha256(fresh.modules_file.content.encode()).hexdigest()
    found = converged(files={fresh.modules_file.path: modules})
    found["packages"] |= {
        "nvlsm": {"version": "2025.06.5-1", "held": False},
        "infiniband-diags": {"version": "44.0-2", "held": False},
    }
    done = nvidia_of(drivers(want, full_plan, "b300-01", found))
    assert (done.install, done.repository.refresh) == ((), False)
    assert [(s.unit, s.restart) for s in done.services] == [("nvidia-fabricmanager", False)]
    # nvlsm removed by hand: installed again (alone: the driver set is in place), the fabric manager restarted
    del found["packages"]["nvlsm"]
    again = nvidia_of(drivers(want, full_plan, "b300-01", found))
    assert (again.install, again.reboot, again.headers) == (("nvlsm",), "no", None)
    assert [(s.unit, s.restart) for s in again.services] == [("nvidia-fabricmanager", True)]
    # the modules file changed: written again, the fabric manager restarted after loading them
    found["packages"]["nvlsm"] = {"version": "2025.06.5-1", "held": False}
    found["files"][fresh.modules_file.path] = "0" * 64
    edited = nvidia_of(drivers(want, full_plan, "b300-01", found))
    assert edited.install == ()
    assert [(s.unit, s.restart) for s in edited.services] == [("nvidia-fabricmanager", True)]


def tray(**changes: Any) -> dict[str, Any]:
    """The converged capture, less the fabric manager an earlier release gave the tray."""
    found = converged(**changes)
    del found["packages"]["nvidia-fabricmanager"], found["services"]["nvidia-fabricmanager"]
    return found


def test_a_converged_host_has_nothing_to_do(recipe: Recipe, full_plan: Plan) -> None:
    want = pinned(recipe, version="580.95.05")
    found = tray(files={IMEX_NODES: None})
    p = nvidia_of(drivers(want, full_plan, "gb300-p01", found))
    assert (p.repository.present, p.repository.refresh, p.pin_installed) == (True, False, True)
    assert (p.install, p.unheld, p.headers, p.reboot, p.remove) == ((), (), None, "no", ())
    assert p.imex_nodes is not None
    imex = [s for s in p.services if s.unit == "nvidia-imex"]
    # Only the node list differs from the capture's (another domain): it is written, IMEX restarted.
    assert [s.restart for s in imex] == [True]
    assert p.imex_channel is not None
    written = {f.path: hashlib.sha256(f.content.encode()).hexdigest() for f in (p.imex_nodes, p.imex_channel)}
    found = tray(files=written)
    found["services"]["nvidia-imex-channel"] = {"active": "active", "enabled": "enabled"}
    p = nvidia_of(drivers(want, full_plan, "gb300-p01", found))
    assert not any(s.restart for s in p.services)
    assert [(s.unit, s.active) for s in p.services] == [("nvidia-imex-channel", "active"), ("nvidia-imex", "active")]


def test_imex_lists_the_hosts_of_the_instance(recipe: Recipe, full_plan: Plan) -> None:
    fresh = probe("gb300-fresh")
    prefill = nvidia_of(drivers(recipe, full_plan, "gb300-p03", fresh))
    assert prefill.packages == ("nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-imex")
    # channel 0's device node, made by a unit at every boot and now (before IMEX)
    assert [s.unit for s in prefill.services] == ["nvidia-imex-channel", "nvidia-imex"]
    assert prefill.imex_channel is not None
    assert prefill.imex_channel.path == "/etc/systemd/system/nvidia-imex-channel.service"
    assert "mknod -m 0666 /dev/nvidia-caps-imex-channels/channel0 c" in prefill.imex_channel.content
    # IMEX channel 0, which CUDA's fabric memory calls across trays need, made by the module option
    assert prefill.module_options is not None
    assert prefill.module_options.path == "/etc/modprobe.d/nvidia-imex-channel.conf"
    assert prefill.module_options.content.splitlines()[-1] == "options nvidia NVreg_CreateImexChannel0=1"
    assert prefill.imex_nodes is not None
    assert prefill.imex_nodes.path == "/etc/nvidia-imex/nodes_config.cfg"
    assert prefill.imex_nodes.content.splitlines()[1:] == ["10.41.0.13", "10.41.0.14"]
    decode = nvidia_of(drivers(recipe, full_plan, "gb300-d02", fresh)).imex_nodes
    assert decode is not None
    assert decode.content.splitlines()[1:] == ["10.41.0.31", "10.41.0.32", "10.41.0.33", "10.41.0.34"]
    # H200 hosts spanned by one instance talk over InfiniBand, not multi-node NVLink: no IMEX.
    h200 = nvidia_of(drivers(recipe, full_plan, "h200-01", fresh))
    assert h200.packages == ("nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-fabricmanager")


def test_imex_needs_ip_addresses(recipe: Recipe, full_plan: Plan) -> None:
    spec = full_plan.for_host("gb300-p01")
    peers = tuple(p if p.host != "gb300-p02" else _with_address(p, "gb300-p02.example") for p in full_plan.hosts)
    p = plan_drivers(recipe, spec, peers, probe("gb300-fresh"), repo_url=LOCAL_REPO)
    assert p.refusals == (
        "gb300-p01: drivers: IMEX lists IP addresses in /etc/nvidia-imex/nodes_config.cfg, "
        "found 'gb300-p02.example' for host gb300-p02: set its kimi_address",
    )


def _with_address(spec: HostPlan, address: str) -> HostPlan:
    values = {**spec.__dict__, "address": address}
    return HostPlan(**values)


def test_tpu_hosts_get_kernel_settings_and_nothing_of_nvidia(recipe: Recipe, full_plan: Plan) -> None:
    spec = full_plan.for_host("tpu7x-w3")
    assert probe_request(recipe, spec) == {"files": [TPU_SYSCTL_FILE], "sysctl": ["vm.max_map_count"]}
    p = drivers(
        recipe, full_plan, "tpu7x-w3", {"files": {TPU_SYSCTL_FILE: None}, "sysctl": {"vm.max_map_count": "65530"}}
    )
    assert p.nvidia is None
    assert p.refusals == ()
    assert p.sysctl is not None
    assert p.sysctl.file.path == "/etc/sysctl.d/60-kimi-tpu.conf"
    assert p.sysctl.file.content.splitlines()[-1] == "vm.max_map_count = 8388608"
    assert p.sysctl.current == {"vm.max_map_count": "65530"}


def test_a_router_host_gets_no_driver(recipe: Recipe, full_plan: Plan) -> None:
    spec = full_plan.for_host("gb300-rt01")
    assert probe_request(recipe, spec) == {}
    assert drivers(recipe, full_plan, "gb300-rt01", {}) == DriversPlan("gb300-rt01", ())


@pytest.mark.parametrize(
    ("flavor", "compute_only", "packages"),
    [
        ("open", True, ("nvidia-driver-cuda", "nvidia-kernel-open-dkms")),
        ("proprietary", True, ("nvidia-driver-cuda", "nvidia-kernel-dkms")),
        ("open", False, ("nvidia-open",)),
        ("proprietary", False, ("cuda-drivers",)),
    ],
)
def test_flavors_name_nvidias_debian_packages(
    recipe: Recipe, full_plan: Plan, flavor: str, compute_only: bool, packages: tuple[str, ...]
) -> None:
    want = pinned(recipe, flavor=flavor, compute_only=compute_only)
    p = nvidia_of(drivers(want, full_plan, "b300-01", probe("gb300-fresh")))
    assert p.packages == (*packages, "nvidia-fabricmanager")
    assert p.pin == "nvidia-driver-pinning-580"


def test_the_repository_follows_release_and_architecture(recipe: Recipe, full_plan: Plan) -> None:
    arm = probe("gb300-fresh", os={"id": "debian", "version_id": "13", "pretty": "Debian 13", "arch": "arm64"})
    p = nvidia_of(drivers(recipe, full_plan, "gb300-p01", arm, repo=NVIDIA_REPO))
    assert p.repository.url == "https://developer.download.nvidia.com/compute/cuda/repos/debian13/sbsa"
    # Installed, but its source points elsewhere (another mirror): installed again from this one.
    moved = converged(sources=["deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] http://old/x/ /"])
    assert not nvidia_of(drivers(recipe, full_plan, "gb300-p01", moved)).repository.present


UBUNTU = {"id": "ubuntu", "version_id": "24.04", "pretty": "Ubuntu 24.04.3 LTS", "arch": "amd64"}


@pytest.mark.parametrize(
    ("branch", "flavor", "packages"),
    [
        ("580", "open", ("libnvidia-compute-580", "nvidia-dkms-580-open")),
        ("580", "proprietary", ("libnvidia-compute-580", "nvidia-dkms-580")),
        ("590", "open", ("libnvidia-compute", "nvidia-dkms-open")),
    ],
)
def test_ubuntu_hosts_get_ubuntus_tree_and_names(
    recipe: Recipe, full_plan: Plan, branch: str, flavor: str, packages: tuple[str, ...]
) -> None:
    want = pinned(recipe, branch=branch, flavor=flavor)
    p = nvidia_of(drivers(want, full_plan, "h200-01", probe("gb300-fresh", os=UBUNTU)))
    assert p.repository.url == f"{LOCAL_REPO}/ubuntu2404/x86_64"
    assert p.packages == (*packages, "nvidia-fabricmanager")
    assert p.pin == f"nvidia-driver-pinning-{branch}"
    jammy = probe("gb300-fresh", os={**UBUNTU, "version_id": "22.04", "arch": "arm64"})
    assert nvidia_of(drivers(want, full_plan, "h200-01", jammy)).repository.url == f"{LOCAL_REPO}/ubuntu2204/sbsa"


def test_a_converged_ubuntu_host_has_nothing_to_do(recipe: Recipe, full_plan: Plan) -> None:
    want = pinned(recipe, version="580.95.05")
    tree = f"{LOCAL_REPO}/ubuntu2404/x86_64"
    at = {"version": "580.95.05-1ubuntu1", "held": True}
    found = converged(os=UBUNTU, sources=[f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {tree}/ /"])
    found["packages"] = {
        "cuda-keyring": {"version": "1.1-1", "held": False},
        "nvidia-driver-pinning-580.95.05": {"version": "580.95.05-1ubuntu1", "held": False},
        "libnvidia-compute-580": at,
        "nvidia-dkms-580-open": at,
        "nvidia-fabricmanager": at,
    }
    p = nvidia_of(drivers(want, full_plan, "h200-01", found))
    assert (p.repository.present, p.pin_installed, p.install, p.unheld, p.reboot) == (True, True, (), (), "no")
    assert (p.target, p.loaded) == ("580.95.05", "580.95.05")


def test_other_systems_are_refused(recipe: Recipe, full_plan: Plan) -> None:
    focal = probe("gb300-fresh", os={**UBUNTU, "version_id": "20.04", "pretty": "Ubuntu 20.04.6 LTS"})
    assert drivers(recipe, full_plan, "b300-01", focal).refusals == (
        "b300-01: drivers: NVIDIA's packages are planned for Debian and Ubuntu 22.04, 24.04, found Ubuntu 20.04.6 LTS",
    )
    rocky = probe("gb300-fresh", os={"id": "rocky", "version_id": "9.4", "pretty": "Rocky Linux 9.4", "arch": "amd64"})
    assert drivers(recipe, full_plan, "b300-01", rocky).refusals == (
        "b300-01: drivers: NVIDIA's packages are planned for Debian and Ubuntu 22.04, 24.04, found Rocky Linux 9.4",
    )
    power = probe("gb300-fresh", os={"id": "debian", "version_id": "12", "pretty": "Debian 12", "arch": "ppc64el"})
    assert drivers(recipe, full_plan, "b300-01", power).refusals == (
        "b300-01: drivers: NVIDIA's repository has amd64, arm64 packages, found ppc64el",
    )


# Versions, holds and reboots --------------------------------------------------------------------


def test_a_branch_pin_keeps_the_installed_release_and_adds_what_is_missing(recipe: Recipe, full_plan: Plan) -> None:
    found = converged()
    del found["packages"]["nvidia-imex"]
    p = nvidia_of(drivers(recipe, full_plan, "gb300-p01", found))
    assert p.pin == "nvidia-driver-pinning-580"
    assert not p.pin_installed  # the exact pin is replaced by the branch pin
    assert p.install == ("nvidia-imex=580.95.05-1",)
    assert (p.target, p.reboot, p.headers) == ("580.95.05", "no", None)


def test_an_unheld_package_is_held(recipe: Recipe, full_plan: Plan) -> None:
    found = converged()
    found["packages"]["nvidia-imex"]["held"] = False
    p = nvidia_of(drivers(pinned(recipe, version="580.95.05"), full_plan, "gb300-p01", found))
    assert (p.install, p.unheld) == ((), ("nvidia-imex",))


def test_a_branch_change_needs_a_reboot_and_stops_without_the_flag(recipe: Recipe, full_plan: Plan) -> None:
    want = pinned(recipe, branch="590")
    refused = drivers(want, full_plan, "gb300-p01", converged())
    assert refused.refusals == (
        f"gb300-p01: drivers: a reboot is needed to load driver 590.* (580.95.05 is loaded); {FLAG}",
    )
    p = nvidia_of(drivers(want, full_plan, "gb300-p01", converged(), allowed=True))
    assert p.install == p.packages
    assert (p.pin, p.target, p.reboot) == ("nvidia-driver-pinning-590", None, "yes")
    # The reboot starts the services on the new driver: nothing to restart before it.
    assert not any(s.restart for s in p.services)


def test_an_upgrade_not_yet_loaded_is_a_reboot(recipe: Recipe, full_plan: Plan) -> None:
    found = probe("gb300-upgraded-not-rebooted")
    want = pinned(recipe, branch="590")
    refused = drivers(want, full_plan, "gb300-p01", found)
    assert refused.refusals == (
        "gb300-p01: drivers: a reboot is needed to load driver 590.48.01 "
        f"(NVML says: Failed to initialize NVML: Driver/library version mismatch); {FLAG}",
    )
    p = nvidia_of(drivers(want, full_plan, "gb300-p01", found, allowed=True))
    assert (p.install, p.reboot) == ((), "yes")
    assert p.unheld == p.packages


def test_when_apt_picks_the_release_the_install_decides_the_reboot(recipe: Recipe, full_plan: Plan) -> None:
    fresh = probe("gb300-fresh")
    p = nvidia_of(drivers(recipe, full_plan, "gb300-p01", fresh))
    assert (p.target, p.reboot, p.keep_loaded) == (None, "check", "580.95.05")
    assert (
        p.reboot_line
        == f"gb300-p01: drivers: a reboot is needed to load driver {{version}} (580.95.05 is loaded); {FLAG}"
    )
    allowed = nvidia_of(drivers(recipe, full_plan, "gb300-p01", fresh, allowed=True))
    assert (allowed.reboot, allowed.keep_loaded) == ("check", None)


def test_a_fabric_manager_of_another_version_is_refused(recipe: Recipe, full_plan: Plan) -> None:
    found = converged()
    found["packages"]["nvidia-fabricmanager-580"] = {"version": "580.82.07-1", "held": False}
    assert drivers(recipe, full_plan, "b300-01", found).refusals == (
        "b300-01: drivers: fabric manager nvidia-fabricmanager-580 would not match the driver: "
        "expected 580.95.05, found 580.82.07-1",
    )
    fresh = probe("gb300-fresh", packages={"nvidia-imex-580": {"version": "580.95.05-1", "held": True}})
    assert drivers(recipe, full_plan, "gb300-p01", fresh).refusals == (
        "gb300-p01: drivers: IMEX nvidia-imex-580 would not match the driver: "
        "expected the newest 580 driver (pin drivers.nvidia.version to choose), found 580.95.05-1",
    )


VERSIONS = ("580.95.05-1", "580.105.08-1", "590.48.01-1", "570.195.03-1")
NAMES = (
    "nvidia-driver-cuda",
    "nvidia-kernel-open-dkms",
    "nvidia-fabricmanager",
    "nvidia-imex",
    "nvidia-fabricmanager-580",
)


def test_a_tray_set_up_with_a_fabric_manager_has_it_removed(recipe: Recipe, full_plan: Plan) -> None:
    """The capture is of a tray an earlier release gave a fabric manager (with its service): whatever
    its version, it is removed, before the driver set moves, and its service is left alone."""
    found = converged()
    found["packages"]["nvidia-fabricmanager-580"] = {"version": "580.82.07-1", "held": False}
    p = nvidia_of(drivers(pinned(recipe, branch="590"), full_plan, "gb300-p01", found, allowed=True))
    assert p.remove == ("nvidia-fabricmanager", "nvidia-fabricmanager-580")
    assert "nvidia-fabricmanager" not in p.packages
    assert [s.unit for s in p.services] == ["nvidia-imex-channel", "nvidia-imex"]
    # a host that has NVSwitches keeps its fabric manager
    assert nvidia_of(drivers(recipe, full_plan, "b300-01", converged())).remove == ()


@given(
    host=st.sampled_from(("gb300-p01", "b300-01")),
    installed=st.dictionaries(st.sampled_from(NAMES), st.sampled_from(VERSIONS)),
    loaded=st.sampled_from(("580.95.05", "590.48.01", None)),
    branch=st.sampled_from(("580", "590")),
    exact=st.booleans(),
)
def test_no_plan_leaves_fabric_manager_and_driver_apart(
    host: str, installed: dict[str, str], loaded: str | None, branch: str, exact: bool
) -> None:
    recipe, full_plan = _prod()
    version = {"580": "580.105.08", "590": "590.48.01"}[branch] if exact else None
    found = copy.deepcopy(converged(nvml={"version": loaded} if loaded else None))
    found["packages"] = {n: {"version": v, "held": True} for n, v in installed.items()}
    p = drivers(pinned(recipe, branch=branch, version=version), full_plan, host, found, allowed=True)
    if p.nvidia is None:
        assert len(p.refusals) == 1
        return
    # Each package's version after the run: as installed, or what the install names (a bare name
    # gets the pinned version, or the release apt picks on the branch: one for all of them).
    after = {n: upstream(v) for n, v in installed.items() if n not in p.nvidia.remove}
    for arg in p.nvidia.install:
        name, _, named = arg.partition("=")
        after[name] = upstream(named) if named else p.nvidia.target or "apt's pick"
    versions = {v for n, v in after.items() if n in p.nvidia.packages or n.startswith("nvidia-fabricmanager")}
    assert len(versions) == 1, (installed, p.nvidia.install)


_PROD: list[tuple[Recipe, Plan]] = []


def _prod() -> tuple[Recipe, Plan]:
    if not _PROD:
        recipe = load_recipe(RECIPE)
        _PROD.append((recipe, plan(recipe, RECIPE, load_inventory(PROD))))
    return _PROD[0]


def test_upstream_versions() -> None:
    assert upstream("580.95.05-1") == "580.95.05"
    assert upstream("3:575.51.03-1ubuntu1") == "575.51.03"


# The kimi.py preflight beside the drivers step -----------------------------------------------------


def test_the_drivers_step_takes_over_the_fabric_manager_and_imex_gates(recipe: Recipe, full_plan: Plan) -> None:
    spec = full_plan.for_host("gb300-p01")
    port = {"port": 1, "phys_state": "LinkUp", "rate_gbps": 400, "link_layer": "InfiniBand"}
    profile = profile_of(
        accelerators={"vendor": "nvidia", "count": 4, "model": "NVIDIA GB300", "memory_mib": 284208},
        disk={"path": "/srv/models", "fs_type": "xfs", "free_bytes": 10**13, "total_bytes": 10**13},
        drivers={"nvidia": "580.95.05", "packages": {"nvidia-fabricmanager": "580.82.07-1"}, "imex_active": None},
        rdma=[{"device": f"mlx5_{i}", "state": "ACTIVE", **port} for i in range(4)],
    )
    # A fabric manager of another version and no IMEX do not stop the host before the drivers step,
    # which installs both at the driver's version (or refuses the host with its own line).
    needs = Needs(recipe, spec, 10**9, 0, ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"])
    assert check(needs, profile) == []


def test_blackwell_and_grace_hopper_run_only_the_open_modules() -> None:
    for model in ("B300", "NVIDIA B200", "GB300", "NVIDIA GB200", "GH200", "NVIDIA RTX PRO 6000 Blackwell"):
        assert open_modules_only(model), model
    for model in ("H200", "NVIDIA H100 80GB HBM3", "A100", "L40S"):
        assert not open_modules_only(model), model
