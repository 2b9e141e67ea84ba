"""A Hub listing names files outside the revision: ``kimi-deploy lock`` makes no lock of it, and a
lock file holding such a name is refused when read.

The Hub is ``localcluster.hub`` on 127.0.0.1 serving a repository written here in its data layout,
talked to by the real huggingface_hub client, as ``kimi-deploy lock`` does against huggingface.co.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kimi_deploy.errors import ConfigError
from kimi_deploy.hostside.hub_access import token_line
from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.weights.lockfile import read_lock
from kimi_pyinfra.cli import main
from localcluster.hub import HubServer, serve, write_faults
from localcluster.tiny_model import REPO_ID, git_blob_sha1
from tests.conftest import ROOT

COMMIT = hashlib.sha1(b"a listing with names outside the revision", usedforsecurity=False).hexdigest()
DEMO_REVISION = "23eb01d77aab1f1b9ff6dda80033b783970fe79c"
SHARDS = [f"model-{i:05d}-of-00096.safetensors" for i in range(1, 97)]
TRAVERSAL = "../../../../etc/cron.d/x"
ABSOLUTE = "/etc/passwd"


def write_repo(root: Path, names: list[str]) -> None:
    """A repository of ``REPO_ID`` whose commit ``COMMIT`` holds ``names``, in the fake Hub's layout."""
    data = b"* * * * * root /bin/sh -c 'id > /tmp/owned'\n"
    sha256 = hashlib.sha256(data).hexdigest()
    (root / "objects").mkdir(parents=True)
    (root / "objects" / sha256).write_bytes(data)
    dirs = {"/".join(p.split("/")[:i]) for p in names for i in range(1, p.count("/") + 1)}
    manifest = {
        "format": 1,
        "id": COMMIT,
        "parents": [],
        "author": "attacker <a@example.invalid>",
        "time": 1767225600,
        "title": "crafted",
        "message": "",
        "trees": {d: hashlib.sha1(d.encode(), usedforsecurity=False).hexdigest() for d in dirs},
        "files": {p: {"size": len(data), "sha256": sha256, "oid": git_blob_sha1(data), "lfs": None} for p in names},
    }
    repo = root / "repos" / REPO_ID
    (repo / "commits").mkdir(parents=True)
    (repo / "commits" / f"{COMMIT}.json").write_text(json.dumps(manifest))
    (repo / "refs.json").write_text(json.dumps({"branches": {"main": COMMIT}, "tags": {}}))


@pytest.fixture
def hub(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[HubServer]:
    write_repo(tmp_path / "hub", [*SHARDS, "config.json", *request.param])
    server = serve(tmp_path / "hub", "127.0.0.1", 0, log_stream=None)
    try:
        yield server
    finally:
        server.stop()


def _demo_recipe(folder: Path) -> Path:
    """The demo recipe pinned to the crafted commit, in ``folder/recipes/demo-gpu.yaml``."""
    text = (ROOT / "recipes/demo-gpu.yaml").read_text(encoding="utf-8").replace(DEMO_REVISION, COMMIT)
    path = folder / "recipes" / "demo-gpu.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("hub", "name", "rule"),
    [
        ([TRAVERSAL], TRAVERSAL, "must not have an empty, '.' or '..' segment, found '..'"),
        ([ABSOLUTE], ABSOLUTE, "must be relative (no leading '/')"),
    ],
    indirect=["hub"],
)
def test_lock_refuses_a_hub_listing_with_a_name_outside_the_revision(
    hub: HubServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    name: str,
    rule: str,
) -> None:
    work = tmp_path / "work"
    _demo_recipe(work)
    monkeypatch.chdir(work)
    assert main(["lock", "recipes/demo-gpu.yaml", "--endpoint", hub.url]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"recipes/demo-gpu.yaml: model: {hub.url}: {REPO_ID}@{COMMIT}: model file name {name!r}: {rule}"
    assert not (work / "recipes" / "locks").exists()  # no lock written, nothing for a deploy to use


@pytest.mark.parametrize("hub", [["tokenizer/tokenizer.json"]], indirect=True)
def test_lock_records_a_listing_of_plain_names(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    _demo_recipe(work)
    monkeypatch.chdir(work)
    assert main(["lock", "recipes/demo-gpu.yaml", "--endpoint", hub.url]) == 0, capsys.readouterr().err
    lock = json.loads((work / "recipes/locks" / f"{REPO_ID.replace('/', '--')}@{COMMIT}.json").read_text())
    assert sorted(lock["files"]) == sorted([*SHARDS, "config.json", "tokenizer/tokenizer.json"])


@pytest.mark.parametrize(
    ("name", "field", "rule"),
    [
        (TRAVERSAL, f"files.{TRAVERSAL!r}", "must not have an empty, '.' or '..' segment, found '..'"),
        (ABSOLUTE, f"files.{ABSOLUTE!r}", "must be relative (no leading '/')"),
        ("x\nExecStartPre=+/bin/sh", "files.'x\\nExecStartPre=+/bin/sh'", "must not hold control character"),
    ],
)
def test_a_lock_file_naming_a_file_outside_the_revision_is_refused_when_read(
    tmp_path: Path, name: str, field: str, rule: str
) -> None:
    recipe = load_recipe(str(_demo_recipe(tmp_path)))
    files = {shard: {"size": 1, "digest": "sha256:" + "0" * 64} for shard in SHARDS}
    files[name] = {"size": 1, "digest": "sha256:" + "0" * 64}
    path = tmp_path / "recipes/locks" / f"{REPO_ID.replace('/', '--')}@{COMMIT}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"repo": REPO_ID, "revision": COMMIT, "files": files}))
    with pytest.raises(ConfigError) as caught:
        read_lock(recipe.model, tmp_path)
    assert caught.value.where == str(path)
    assert caught.value.field == field
    assert caught.value.message.startswith(rule)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "text",
    ["[1, 2]", json.dumps({"repo": REPO_ID, "revision": COMMIT, "files": [1]}), "[" * 100_000 + "]" * 100_000],
)
def test_a_malformed_lock_file_is_one_line(tmp_path: Path, text: str) -> None:
    recipe = load_recipe(str(_demo_recipe(tmp_path)))
    path = tmp_path / "recipes/locks" / f"{REPO_ID.replace('/', '--')}@{COMMIT}.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_lock(recipe.model, tmp_path)
    assert str(caught.value).startswith(f"{path}: ")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("hub", [[]], indirect=True)
def test_lock_with_a_token_the_hub_no_longer_takes_says_so_in_one_line(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Hub refuses a revoked token's listing of a public repository too (401): the line the
    hosts' sync uses, at lock time."""
    write_faults(tmp_path / "hub", {"revoked": ["hf_revoked_0123"]})
    work = tmp_path / "work"
    _demo_recipe(work)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HF_TOKEN", "hf_revoked_0123")
    assert main(["lock", "recipes/demo-gpu.yaml", "--endpoint", hub.url]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"recipes/demo-gpu.yaml: model: {hub.url}: {REPO_ID}@{COMMIT}: {token_line(hub.url, None)}"
    monkeypatch.delenv("HF_TOKEN")  # the repository is public: without the token, the lock is made
    assert main(["lock", "recipes/demo-gpu.yaml", "--endpoint", hub.url]) == 0
