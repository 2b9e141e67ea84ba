"""``kimi-deploy validate --index URL``: the package index is asked, before any converge, whether
it lists every release the recipe pins.

The index is a static PEP 503 tree (``simple/<project>/index.html``, links to the files) served by
Python's own http.server: a static tree is a valid index (PEP 503), what pip and uv read with
``--index-url``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kimi_deploy.hostside.boundary_index import normalized
from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.releases.index_pins import recipe_pins
from tests.cli_run import kimi
from tests.conftest import PROD, RECIPE
from tests.locked_site import API_KEY_ENV, locked_site

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return


def _tree(root: Path, versions: dict[str, list[str]]) -> None:
    """A project page per project, linking a wheel per version (PyPI's file names and layout)."""
    for project, listed in versions.items():
        folder = root / "simple" / normalized(project)
        folder.mkdir(parents=True, exist_ok=True)
        stem = project.replace("-", "_")
        links = "".join(
            f'<a href="../../files/{stem}-{v}-py3-none-any.whl#sha256={"0" * 64}">{stem}-{v}-py3-none-any.whl</a><br>\n'
            for v in listed
        )
        (folder / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n", encoding="utf-8")


@contextmanager
def _served(root: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


def _every_pin() -> dict[str, list[str]]:
    versions: dict[str, list[str]] = {}
    for _, package, version in recipe_pins(load_recipe(RECIPE)):
        versions.setdefault(package, ["0.0.1"]).append(version)
    return versions


def _validate(tmp_path: Path, edit: Callable[[dict[str, list[str]]], None]) -> tuple[int, str, str]:
    versions = _every_pin()
    edit(versions)
    _tree(tmp_path, versions)
    site = locked_site(tmp_path)
    with _served(tmp_path) as url:
        run = kimi("validate", RECIPE, PROD, "--topology", "gb300-pd", "--index", url, cwd=site, env=API_KEY_ENV)
    return run.returncode, run.stdout, run.stderr.replace(url, "URL")


def test_an_index_with_every_pin_passes(tmp_path: Path) -> None:
    code, out, err = _validate(tmp_path, lambda versions: None)
    assert (code, err) == (0, "")
    assert out.splitlines()[-1].startswith("ok: every release the recipe pins is on http://127.0.0.1:")


def test_each_pin_the_index_lacks_is_one_line_naming_its_newest_version(tmp_path: Path) -> None:
    def edit(versions: dict[str, list[str]]) -> None:
        versions["vllm"] = ["0.31.0", "0.32.0", "0.35.0rc1"]  # the newest final release is named
        versions["nixl"] = ["1.5.0", "1.5.2"]
        del versions["mooncake-transfer-engine-cuda13"]  # no such project: 404

    code, out, err = _validate(tmp_path, edit)
    assert code == 1
    assert out == ""
    assert err.splitlines() == [
        f"kimi-deploy: {RECIPE}: engines.vllm.version: vllm==0.33.0 is not on URL (newest: 0.32.0)",
        f"kimi-deploy: {RECIPE}: engines.vllm.packages.mooncake-transfer-engine-cuda13: "
        "mooncake-transfer-engine-cuda13==0.3.13.post1 is not on URL (it lists no version of it)",
        f"kimi-deploy: {RECIPE}: engines.vllm.packages.nixl: nixl==1.5.1 is not on URL (newest: 1.5.2)",
    ]


def test_an_index_that_does_not_answer_is_named(tmp_path: Path) -> None:
    with _served(tmp_path) as url:
        pass  # the server is gone: nothing answers at url now
    site = locked_site(tmp_path)
    run = kimi("validate", RECIPE, PROD, "--topology", "gb300-pd", "--index", url, cwd=site, env=API_KEY_ENV)
    assert run.returncode == 1
    first = run.stderr.splitlines()[0]
    assert first == f"kimi-deploy: {RECIPE}: engines.vllm.version: package index {url} does not answer for vllm"
