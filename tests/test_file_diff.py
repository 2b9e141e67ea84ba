"""What ``--dry --diff`` shows of a host's files (kimi_deploy/converge/file_diff.py), from what the
probe's part for it finds on a host (hostside/changed_files.py): the example recipe's B300 host,
its files put under a folder of this machine that stands for the host's root."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.converge.file_diff import NO_NEWLINE, diff_request, file_diffs
from kimi_deploy.converge.host_files import host_files
from kimi_deploy.converge.plan import Converge, plan_converge
from kimi_deploy.host.command import ANSWER_MAX_BYTES
from kimi_deploy.host.profile_types import HostState
from kimi_deploy.hostside.changed_files import FILE_MOST, TOTAL_MOST, changed_files
from kimi_deploy.hostside.shared_queries import file_sha256
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.deploy_plan import DeployPlan
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe import Recipe
from kimi_deploy.render.files import RenderedFile
from tests.conftest import RECIPE
from tests.host_converge import LOCK, lock_stands_in, probe_answer

HOST = "b300-01"
KEY = "sk-kimi-d41c9a0e77b2"
UNIT = "/etc/systemd/system/kimi-vllm.service"


@pytest.fixture
def converge(recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch) -> tuple[DeployPlan, Converge]:
    lock_stands_in(monkeypatch, LOCK)
    monkeypatch.setenv("KIMI_API_KEY", KEY)
    full = plan(recipe, RECIPE, prod)
    spec = full.for_host(HOST)
    deploy = DeployPlan(recipe, RECIPE, spec, prod.host(HOST), full.topology(spec.topology))
    return deploy, plan_converge(deploy, os.environ)


class Host:
    """The host's root at ``root``: it holds every file as the converge writes it, but those
    changed; ``files`` are the converge's with their paths under ``root``."""

    def __init__(self, root: Path, deploy: DeployPlan, todo: Converge) -> None:
        self.root = root
        self.todo = todo
        self.files = [replace(f, path=f"{root}{f.path}") for f in host_files(deploy, todo)]
        for f in self.files:
            self.write(f.path, f.content)

    def write(self, path: str, content: str | bytes) -> None:
        where = Path(path if path.startswith(str(self.root)) else f"{self.root}{path}")
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_bytes(content.encode() if isinstance(content, str) else content)

    def file(self, path: str) -> RenderedFile:
        return next(f for f in self.files if f.path == f"{self.root}{path}")

    def diff(self, **bounds: int) -> list[str]:
        """What ``--diff`` shows of this host: its probe's answer, read as the deploy reads it."""
        found: HostState = probe_answer(self.todo)
        found["files"] = {f.path: file_sha256(f.path) for f in self.files if f.secret}
        found["owners"] = {}
        found["contents"] = changed_files(diff_request(self.files), **bounds)
        return file_diffs(HOST, self.files, found, self.todo.user, f"{self.root}{self.todo.release.dir}")


@pytest.fixture
def host(tmp_path: Path, converge: tuple[DeployPlan, Converge]) -> Host:
    return Host(tmp_path / "host", *converge)


def test_a_host_as_the_recipe_has_it_shows_no_diff(host: Host) -> None:
    assert host.diff() == []


def test_a_changed_line_of_the_unit_is_shown_with_minus_and_plus(host: Host) -> None:
    unit = host.file(UNIT)
    assert "    --max-model-len 32768 \\\n" in unit.content
    host.write(unit.path, unit.content.replace("--max-model-len 32768", "--max-model-len 16384"))
    lines = host.diff()
    name = f"{HOST}:{unit.path}"
    assert lines[:2] == [f"--- {name} (on the host)", f"+++ {name} (the recipe)"]
    assert "-    --max-model-len 16384 \\" in lines
    assert "+    --max-model-len 32768 \\" in lines
    # that one file alone: every other line is its hunk's
    assert sum(line.startswith("--- ") for line in lines) == 1
    assert [line for line in lines if line[:1] in "-+" and not line.startswith(("---", "+++"))] == [
        "-    --max-model-len 16384 \\",
        "+    --max-model-len 32768 \\",
    ]


def test_a_file_absent_on_the_host_is_shown_whole(host: Host) -> None:
    env = host.file("/etc/kimi/kimi-vllm.env")
    Path(env.path).unlink()
    lines = host.diff()
    assert lines[0] == f"--- {HOST}:{env.path} (absent on the host)"
    assert [line[1:] for line in lines[3:]] == env.content.splitlines()


def test_a_secret_is_never_asked_for_and_shows_as_changed_alone(host: Host) -> None:
    secrets = [f for f in host.files if f.secret]
    assert [f.path for f in secrets] == [f"{host.root}/etc/kimi/secrets/weights-transfer-key"]
    assert not set(diff_request(host.files)) & {f.path for f in secrets}
    (secret,) = secrets
    host.write(secret.path, "old-run-key-on-the-host\n")
    lines = host.diff()
    assert lines == [f"{HOST}:{secret.path}: secret changed"]
    # absent, it is written
    Path(secret.path).unlink()
    assert host.diff() == [f"{HOST}:{secret.path}: secret written (absent on the host)"]
    # one the probe does not read (the run's own key): written, its content never shown
    found: HostState = probe_answer(host.todo)
    found["files"], found["owners"], found["contents"] = {}, {}, {}
    key = replace(secret, content=KEY + "\n")
    assert file_diffs(HOST, [key], found, host.todo.user, "/none") == [
        f"{HOST}:{secret.path}: secret written (its content is the run's)"
    ]


def test_a_binary_or_oversize_file_is_said_and_not_shown(host: Host) -> None:
    unit, env = host.file(UNIT), host.file("/etc/kimi/kimi-vllm.env")
    host.write(unit.path, b"\x7fELF\x00\x01binary")
    host.write(env.path, "A=1\n" * (FILE_MOST // 4 + 1))
    lines = host.diff()
    assert f"{HOST}:{unit.path}: changes (on the host: binary, not shown)" in lines
    assert f"{HOST}:{env.path}: changes (on the host: {FILE_MOST + 4} bytes, not shown)" in lines
    # bytes that are not UTF-8 are no text either
    host.write(env.path, b"A=\xff\xfe\n")
    assert f"{HOST}:{env.path}: changes (on the host: binary, not shown)" in host.diff()


def test_the_hosts_text_beyond_its_total_is_said_and_not_shown(host: Host) -> None:
    unit, env = host.file(UNIT), host.file("/etc/kimi/kimi-vllm.env")
    host.write(unit.path, "x\n" * 100)
    host.write(env.path, "y\n" * 100)
    # the first file asked (by path) fits the bound, the second does not
    lines = host.diff(total_most=400)
    assert f"+++ {HOST}:{env.path} (the recipe)" in lines
    assert f"{HOST}:{unit.path}: changes (on the host: 200 bytes, not shown" in "\n".join(lines)


def test_hostile_text_from_the_host_is_escaped(host: Host) -> None:
    unit = host.file(UNIT)
    hostile = unit.content.replace("[Unit]\n", "[Unit]\x1b[2J\x1b]0;owned\x07 \u202eevil\rX\n", 1) + "tail"
    host.write(unit.path, hostile)
    lines = host.diff()
    assert r"-[Unit]\x1b[2J\x1b]0;owned\x07 \u202eevil\rX" in lines
    assert "+[Unit]" in lines
    # the last line without its newline is said so
    assert lines[lines.index("-tail") + 1] == NO_NEWLINE
    assert not any(c in line for line in lines for c in "\x1b\x07\r\u202e")


def test_an_answer_beyond_what_the_host_may_send_is_not_shown(
    host: Host, converge: tuple[DeployPlan, Converge]
) -> None:
    """Whatever a host answers: text over one file's bound, a lone surrogate, an entry that is no
    object, a reason it makes up; none of it is shown, and a path not asked is not read."""
    unit, env = host.file(UNIT), host.file("/etc/kimi/kimi-vllm.env")
    config = next(f for f in host.files if f.path.endswith("/kimi-weights-scrub.json"))
    found: HostState = probe_answer(host.todo)
    found["files"], found["owners"] = {}, {}
    hostile: Any = {
        unit.path: {"size": 1, "text": "x" * (FILE_MOST + 1), "why": ""},
        env.path: {"size": 1, "text": "A=\ud800\n", "why": ""},
        config.path: ["\x1b[2J"],
        "/etc/shadow": {"size": 5, "text": "root:\n", "why": ""},
    }
    found["contents"] = hostile
    lines = file_diffs(HOST, [unit, env, config], found, host.todo.user, "/none")
    assert lines == [
        f"{HOST}:{unit.path}: changes (on the host: {FILE_MOST + 1} bytes, not shown)",
        f"{HOST}:{env.path}: changes (on the host: not UTF-8 text, not shown)",
        f"{HOST}:{config.path}: changes (on the host: an answer that is not one, not shown)",
    ]
    hostile = {unit.path: {"size": "\x1b[2J", "text": None, "why": "\x1b[2J"}}
    found["contents"] = hostile
    assert file_diffs(HOST, [unit], found, host.todo.user, "/none") == [
        f"{HOST}:{unit.path}: changes (on the host: not shown)"
    ]


def test_a_new_release_folder_is_one_line(host: Host) -> None:
    release = f"{host.root}{host.todo.release.dir}"
    kept = [f for f in host.files if f.path.startswith(release + "/")]
    assert len(kept) > 2
    for f in kept:
        Path(f.path).unlink()
    assert host.diff() == [
        f"{HOST}:{release}/: the release folder: {len(kept)} files written (its record and the copy of each"
        " file a rollback puts back)"
    ]


def test_an_owner_or_mode_put_back_is_said(host: Host) -> None:
    unit = host.file(UNIT)
    found: HostState = probe_answer(host.todo)
    found["files"], found["owners"], found["contents"] = {}, {unit.path: "root:root:600"}, {}
    assert file_diffs(HOST, [unit], found, host.todo.user, "/none") == [
        f"{HOST}:{unit.path}: owner and mode root:root:600 on the host, root:root:644 in the recipe"
    ]


def test_the_hosts_answer_with_its_files_fits_what_the_controller_reads(tmp_path: Path) -> None:
    """Files of the characters JSON writes longest (six bytes each): the answer's contents stay
    within their total, which leaves the probe's largest answer room under ``ANSWER_MAX_BYTES``."""
    wanted = {}
    for i in range(40):
        path = tmp_path / f"f{i:02}"
        path.write_text("\x01" * (FILE_MOST // 2))
        wanted[str(path)] = "0" * 64
    answer = changed_files(wanted)
    assert all(entry is not None for entry in answer.values())
    shown = [p for p, entry in answer.items() if entry is not None and entry["text"] is not None]
    assert 0 < len(shown) < len(answer)
    assert {entry["why"] for entry in answer.values() if entry is not None and entry["text"] is None} == {"total"}
    encoded = len(json.dumps(answer))
    assert encoded <= TOTAL_MOST + 100 * len(answer)
    # the largest state answer a real host sends is some 1.2 MB (kimi_deploy/host/command.py)
    assert 1_200_000 + encoded < ANSWER_MAX_BYTES


def test_only_files_that_differ_are_read(tmp_path: Path) -> None:
    same, other, folder = tmp_path / "same", tmp_path / "other", tmp_path / "folder"
    same.write_text("a\n")
    other.write_text("b\n")
    folder.mkdir()
    request = diff_request(
        [RenderedFile(str(p), "a\n", 0o644, "root") for p in (same, other, folder, tmp_path / "absent")]
    )
    assert changed_files(request) == {
        str(other): {"size": 2, "text": "b\n", "why": ""},
        str(folder): {"size": folder.stat().st_size, "text": None, "why": "not a file"},
        str(tmp_path / "absent"): None,
    }
