"""``kimi-deploy plan --render`` writes exactly the files the converge writes to each host, with
their contents, and never a secret.

The converge's side is its own code path: ``deploys/kimi.py``'s deploy function, run for every
host of a fresh fleet in one pyinfra run that connects nowhere (each host's probe answered as
``hostside/state_probe.py`` answers for a new host), every step it takes recorded, and the
commands of the steps that write files made by the operations themselves: each file is what its
command writes (path, mode, owner, the content on its standard input).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.api.command import StringCommand

from kimi_deploy.converge import plan as converge_plan
from kimi_deploy.errors import ConfigError
from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.weights.lockfile import read_lock
from kimi_pyinfra import host_plan
from kimi_pyinfra.cli import main
from kimi_pyinfra.operations import (
    commcheck,
    compile_cache,
    engine,
    ladder,
    nvidia,
    packages,
    preflight,
    releases,
    serving,
    sysctl,
    units,
    users,
    weights,
)
from tests.conftest import PROD, RECIPE, ROOT
from tests.host_converge import LOCK, probe_answer
from tests.recorded_run import Steps, recorded_run

KEY = "sk-kimi-d41c9a0e77b2"
HUB_TOKEN = "hf_kimiRenderTestToken0123456789"
DEMO_RECIPE = "recipes/demo.yaml"
DEMO = "inventories/demo.py"

# The steps that write files: each file is what their commands write.
WRITERS = {units.rendered, releases.current, commcheck.listening}
# The converge's other steps write no file whose content a plan decides: packages, releases (venvs),
# weights, compile caches (what engines compile), services, the units' applied markers and logs
# (``kimi_deploy.converge.host_files``). A new
# step is added to one of the two sets once it is known which.
OTHERS = {
    preflight.passed,
    nvidia.repository,
    nvidia.pinned,
    nvidia.removed,
    nvidia.packages,
    nvidia.rebooted,
    nvidia.service,
    sysctl.applied,
    users.system_user,
    packages.debian,
    engine.venv,
    weights.peer_server,
    weights.revision,
    weights.peer_server_stopped,
    weights.collected,
    compile_cache.placed,
    compile_cache.placed_from_run,
    compile_cache.packed,
    compile_cache.served_packed,
    commcheck.probed,
    commcheck.passed,
    commcheck.all_reduce_passed,
    serving.verified,
    serving.readmitted,
    serving.drained,
    serving.routed,
    units.started,
    units.timer,
    ladder.climbed,
    releases.serving,
}


@dataclass(frozen=True)
class Written:
    mode: int
    owner: str
    content: str
    secret: bool = False


def _recorded_run(inventory_file: str) -> tuple[Steps, Any]:
    """Every step ``deploys/kimi.py`` takes on each host of a new fleet, by host, and the run's
    context (its transfer key and communication check token)."""
    return recorded_run(inventory_file, lambda todo: probe_answer(todo, installed=False, running=False))


def _commands(op: Any, arguments: dict[str, Any]) -> list[Any]:
    body = {k: v for k, v in arguments.items() if k != "name" and not k.startswith("_")}
    return list(op._inner(**body))


def _writes(op: Any, arguments: dict[str, Any], so_far: dict[str, Written]) -> Iterator[tuple[str, Written]]:
    """The files one step writes, read from its own commands (a secret: as the step is told)."""
    secret = {f.path for f in arguments.get("files", []) if f.secret} | {commcheck.TOKEN_FILE}
    for command in _commands(op, arguments):
        text = str(command)
        if isinstance(command, StringCommand) and units.NEW_SUFFIX in text:
            # ``units.replaced``: install -m MODE -o OWNER -g GROUP /dev/null NEW && ... && mv -f NEW PATH
            install = shlex.split(text.split(" && ", maxsplit=1)[0])
            path = shlex.split(text.rsplit(" && ", maxsplit=1)[-1])[-1]
            content = str(command.connector_arguments["_stdin"])
            yield path, Written(int(install[2], 8), install[4], content, path in secret)
        elif op is releases.current:
            for part in text.split(" && "):
                words = shlex.split(part)
                if words[:2] == ["printf", "%s\\n"]:
                    # printf '%s\n' RECORD > DIR/release.json
                    assert words[3:4] == [">"], part
                    assert words[4].endswith("/release.json"), part
                    yield words[4], Written(0o644, "root", words[2] + "\n")
                elif words[:2] == ["cp", "--parents"]:
                    # cp --parents --preserve=timestamps PATH... DIR/files/: as root, umask 022
                    for path in words[3:-1]:
                        live = so_far[path]
                        yield words[-1].rstrip("/") + path, Written(live.mode & ~0o022, "root", live.content)


def _converge_files(steps: list[tuple[Any, dict[str, Any]]]) -> dict[str, Written]:
    unknown = {getattr(op, "__name__", str(op)) for op, _ in steps if op not in WRITERS | OTHERS}
    assert not unknown, f"steps of the converge neither compared nor known to write no file: {unknown}"
    # what the fleet's first converge would stop at: the test compares a converge that goes through
    gates = [a["failures"] for op, a in steps if op is preflight.passed and a["name"] == "Drivers: checks"]
    assert gates
    assert not any(gates)
    files: dict[str, Written] = {}
    for op, arguments in steps:
        if op in WRITERS:
            for path, written in _writes(op, arguments, files):
                assert path not in files, f"{path} written twice"
                files[path] = written
    # the communication check's token lives on /run while the check runs: no file of the host's
    transient = {p for p in files if p == commcheck.TOKEN_FILE}
    return {p: w for p, w in files.items() if p not in transient}


def _rendered(out: Path) -> dict[str, dict[str, str]]:
    return {
        folder.name: {
            "/" + str(p.relative_to(folder)): p.read_text(encoding="utf-8") for p in folder.rglob("*") if p.is_file()
        }
        for folder in out.iterdir()
    }


def _not_rendered(stderr: str) -> dict[str, dict[str, str]]:
    """``kimi-deploy: not rendered: PATH on HOSTS: WHY`` lines, as host -> path -> why."""
    out: dict[str, dict[str, str]] = {}
    for line in stderr.splitlines():
        if not line.startswith("kimi-deploy: not rendered: "):
            continue
        path, rest = line.removeprefix("kimi-deploy: not rendered: ").split(" on ", 1)
        hosts, why = rest.split(": ", 1)
        names = hosts.split(" (", 1)[1].rstrip(")").split(", ") if " hosts (" in hosts else [hosts]
        for name in names:
            out.setdefault(name, {})[path] = why
    return out


@pytest.fixture
def fleet(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The controller a converge runs from: the recipes' keys and a Hub token at hand."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["pyinfra", PROD, "deploys/kimi.py"])
    monkeypatch.setattr(converge_plan, "read_secret", lambda ref, recipe_file, field, environ: KEY)
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    # The demo inventory reads its cluster's state: four hosts, nothing running.
    state = {
        "ssh_key": str(tmp_path / "id_ed25519"),
        "known_hosts": str(tmp_path / "known_hosts"),
        "services": {"index": {"url": "http://10.77.0.1:3141/simple"}, "hub": {"url": "http://10.77.0.1:8080"}},
        "hosts": [{"name": f"kimi-h{n}", "address": f"10.77.0.{10 + n}"} for n in range(1, 5)],
    }
    (tmp_path / "state.json").write_text(json.dumps(state), encoding="utf-8")
    monkeypatch.setenv("KIMI_CLUSTER_DIR", str(tmp_path))


def _example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example recipe's revisions have no lock file (``LOCK`` stands in), and its TPU topology
    is refused for its engine release (servability, committed release locks: what ``validate``
    says, which changes no file): lifted, so that a TPU host's files are compared too."""
    monkeypatch.setattr(converge_plan, "read_lock", lambda checkpoint: SimpleNamespace(compact=lambda: LOCK))
    monkeypatch.setattr(converge_plan, "with_committed", lambda recipe, topology, releases: releases)
    monkeypatch.setattr(host_plan, "refusals", lambda recipe, recipe_file, topologies: {})


@pytest.mark.parametrize(("recipe_file", "inventory_file"), [(RECIPE, PROD), (DEMO_RECIPE, DEMO)])
def test_plan_render_writes_every_file_the_converge_writes_and_no_secret(
    fleet: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    recipe_file: str,
    inventory_file: str,
) -> None:
    if recipe_file == RECIPE:
        _example_runs(monkeypatch)
    steps, context = _recorded_run(inventory_file)
    capsys.readouterr()
    assert main(["plan", recipe_file, inventory_file, "--render", str(tmp_path / "out")]) == 0
    stderr = capsys.readouterr().err
    rendered, left = _rendered(tmp_path / "out"), _not_rendered(stderr)
    assert set(rendered) == set(steps)
    secrets = (KEY, HUB_TOKEN, context.transfer_key, context.comm_check_token)
    for name, taken in steps.items():
        files = _converge_files(taken)
        assert rendered[name] == {p: w.content for p, w in files.items() if not w.secret}, name
        # each secret file named, none written; the converge's carry secrets, no rendered file does
        assert left.get(name, {}) == {p: "secret" for p, w in files.items() if w.secret}, name
        assert any(s in w.content for w in files.values() for s in secrets), name
        assert not [p for p, text in rendered[name].items() if any(s in text for s in secrets)], name
    assert not any(s in stderr for s in secrets)


def test_a_revision_without_its_lock_leaves_out_only_the_scrubs_request(
    fleet: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as missing_lock:  # the example's revision has no lock file
        read_lock(load_recipe(RECIPE).model)
    no_lock = str(missing_lock.value)
    monkeypatch.delenv("HF_TOKEN")
    assert main(["plan", RECIPE, PROD, "--render", str(tmp_path / "unlocked")]) == 0
    unlocked, left = _rendered(tmp_path / "unlocked"), _not_rendered(capsys.readouterr().err)
    _example_runs(monkeypatch)
    assert main(["plan", RECIPE, PROD, "--render", str(tmp_path / "locked")]) == 0
    locked = _rendered(tmp_path / "locked")
    for name, files in locked.items():
        missing = {p for p in files if p not in unlocked[name]}
        assert {p: unlocked[name][p] for p in unlocked[name]} == {p: files[p] for p in unlocked[name]}, name
        if name == "gb300-rt01":  # a router host holds no weights
            assert missing == set()
            continue
        (release,) = {p.split("/files/")[0] for p in missing if "/releases/" in p}
        assert missing == {"/etc/kimi/kimi-weights-scrub.json", f"{release}/files/etc/kimi/kimi-weights-scrub.json"}
        named = {p.replace(release, "/opt/kimi/releases/*"): why for p, why in left[name].items() if why != "secret"}
        assert named == {
            "/etc/kimi/kimi-weights-scrub.json": no_lock,
            "/opt/kimi/releases/*/files/etc/kimi/kimi-weights-scrub.json": no_lock,
        }


def test_an_unwritable_render_folder_is_one_line_naming_it(
    fleet: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("", encoding="utf-8")
    assert main(["plan", RECIPE, PROD, "--render", str(blocked / "out")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"{blocked / 'out'}: --render: cannot write there: Not a directory"]
