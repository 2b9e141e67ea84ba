"""A release's lock, resolved on the controller for the platform a host reports, with the real uv
(kimi-deploy's own) against a local PEP 503 index of wheels built here: the whole dependency
closure with the index's hashes, per platform; one line naming the requirement chain when it does
not resolve; the same lock again once resolved, whatever the index publishes later."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.hostside.boundary_lock import lock_pins
from kimi_deploy.releases.lock import HostPlatform, LockError, cached_lock, resolve
from localcluster import pkgindex
from tests.wheel_file import pure_wheel

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

X86 = HostPlatform((3, 11), "x86_64", (2, 36))
ARM = HostPlatform((3, 12), "aarch64", (2, 39))
ENV = dict(os.environ)


@pytest.fixture
def index(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """``app`` 1.0 needs ``lib>=1`` and ``native``; ``native`` has a wheel per machine; ``broken``
    1.0 needs ``lib==3.0``, which the index does not have, and ``top`` needs ``broken``."""
    files = tmp_path / "index/files"
    files.mkdir(parents=True)
    pure_wheel(files, "app", "1.0", requires=["lib>=1", "native==1.0"])
    pure_wheel(files, "lib", "1.0")
    pure_wheel(files, "lib", "2.0")
    pure_wheel(files, "native", "1.0", tag="cp311-cp311-manylinux_2_17_x86_64")
    pure_wheel(files, "native", "1.0", tag="cp312-cp312-manylinux_2_17_aarch64")
    pure_wheel(files, "broken", "1.0", requires=["lib==3.0"])
    pure_wheel(files, "top", "1.0", requires=["broken==1.0"])
    server = pkgindex.serve(tmp_path / "index")
    try:
        yield {"url": server.url, "files": files}
    finally:
        server.stop()


def test_the_lock_is_the_whole_closure_with_hashes_for_the_hosts_platform(index: dict[str, Any]) -> None:
    text = resolve(["app==1.0"], [], index["url"], X86, ENV)
    assert text.startswith(f"# platform: cp311-x86_64\n# index: {index['url']}\n")
    assert lock_pins(text) == {"app": "1.0", "lib": "2.0", "native": "1.0"}
    assert text.count("--hash=sha256:") >= 3
    arm = resolve(["app==1.0"], [], index["url"], ARM, ENV)
    assert arm.startswith("# platform: cp312-aarch64\n")
    assert lock_pins(arm) == lock_pins(text)
    # without: resolved as if nothing required it
    assert lock_pins(resolve(["app==1.0"], ["native"], index["url"], X86, ENV)) == {"app": "1.0", "lib": "2.0"}


def test_a_release_whose_closure_does_not_resolve_is_one_line_naming_the_chain(index: dict[str, Any]) -> None:
    with pytest.raises(LockError) as refused:
        resolve(["broken==1.0"], [], index["url"], X86, ENV)
    assert str(refused.value) == f"broken==1.0 -> lib==3.0 is not on {index['url']} (available: 1.0, 2.0)"
    with pytest.raises(LockError) as refused:
        resolve(["top==1.0"], [], index["url"], X86, ENV)
    assert str(refused.value) == f"top==1.0 -> broken==1.0 -> lib==3.0 is not on {index['url']} (available: 1.0, 2.0)"


def test_a_platform_no_wheel_serves_is_one_line(index: dict[str, Any]) -> None:
    with pytest.raises(LockError) as refused:
        resolve(["native==1.0"], [], index["url"], HostPlatform((3, 13), "x86_64", (2, 36)), ENV)
    assert "native" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_an_index_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    files = tmp_path / "index/files"
    files.mkdir(parents=True)
    server = pkgindex.serve(tmp_path / "index")
    url = server.url
    server.stop()
    with pytest.raises(LockError) as refused:
        resolve(["app==1.0"], [], url, X86, ENV)
    assert str(refused.value) == f"package index {url} does not answer"


def test_a_lock_once_resolved_is_what_every_later_host_gets(index: dict[str, Any], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    got = [cached_lock(["app==1.0"], [], index["url"], X86, ENV, folder=cache) for _ in range(2)]
    assert got[0] == got[1]
    assert len(list(cache.iterdir())) == 1
    # the index publishes a newer lib: a new resolution would take it, a later host does not
    pure_wheel(index["files"], "lib", "2.5")
    assert lock_pins(resolve(["app==1.0"], [], index["url"], X86, ENV))["lib"] == "2.5"
    assert cached_lock(["app==1.0"], [], index["url"], X86, ENV, folder=cache) == got[0]
    assert lock_pins(got[0])["lib"] == "2.0"
    # another platform is resolved for itself
    assert cached_lock(["app==1.0"], [], index["url"], ARM, ENV, folder=cache).startswith("# platform: cp312-aarch64\n")


def test_a_cached_lock_is_checked_like_any_other(index: dict[str, Any], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cached_lock(["app==1.0"], [], index["url"], X86, ENV, folder=cache)
    (cached,) = cache.iterdir()
    cached.write_text(cached.read_text() + "evil @ file:///tmp/evil-1.0.tar.gz\n")
    with pytest.raises(LockError) as refused:
        cached_lock(["app==1.0"], [], index["url"], X86, ENV, folder=cache)
    assert str(refused.value).startswith(f"{cached}: the cached lock is refused: line ")


@pytest.mark.parametrize(
    ("found", "tag", "uv"),
    [
        ({"python": "3.11", "machine": "x86_64", "libc": "glibc 2.36"}, "cp311-x86_64", "x86_64-manylinux_2_36"),
        ({"python": "3.12", "machine": "aarch64", "libc": "glibc 2.39"}, "cp312-aarch64", "aarch64-manylinux_2_39"),
        # a newer glibc than uv names runs the newest manylinux it does
        ({"python": "3.13", "machine": "x86_64", "libc": "glibc 2.41"}, "cp313-x86_64", "x86_64-manylinux_2_40"),
    ],
)
def test_the_platform_a_host_reports(found: dict[str, str], tag: str, uv: str) -> None:
    platform = HostPlatform.parse(found)
    assert (platform.tag, platform.uv_platform) == (tag, uv)
