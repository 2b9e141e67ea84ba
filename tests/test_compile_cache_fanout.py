"""A compile cache made on one host and placed on another, run locally on loopback.

Real processes and sockets, the programs bundled as the hosts get them: ``compile_cache_pack.py``
packs what an engine wrote into the artifact of its key, ``weights_peer.py`` serves it (the weights'
relay) and ``compile_cache_place.py`` places it elsewhere against the manifest the controller holds.
The engine's cache has the shape of vLLM 0.32.0's on CPU (``torch_compile_cache/<hash>/rank_0_0/...``).
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.host.command import pack
from kimi_deploy.hostside.compile_cache_found import found, manifest_digest
from tests.bundled import bundled_program
from tests.test_weights_peer import KEY, serve

pytestmark = pytest.mark.processes

# vLLM 0.32.0's torch.compile cache on CPU, as its start leaves it (docs/compile-caches.md): the AOT
# artifact per rank, and inductor's kernels (C++ source and library), AOTAutograd entries and empty
# lock files under the configuration's hash
HASH = "torch_aot_compile/1fa126ab47986f26995239b9de1608dc6c1ac89402dc790f5e54f4186f3e480f"
KERNEL = "inductor_cache/oe/coe66holh7vssrqle5tly3iueusgeunez65ribic2iy3x2tw373w"
MODEL = f"{HASH}/rank_0_0/model"
ENGINE_FILES = {
    MODEL: os.urandom(200_000),
    f"{HASH}/{KERNEL}.main.cpp": b'#include <Python.h>\nextern "C" void kernel(float* in_ptr0) {}\n',
    f"{HASH}/{KERNEL}.main.so": os.urandom(120_000),
    f"{HASH}/inductor_cache/aotautograd/aeqbp4lb7xkz/entry": os.urandom(90_000),
    f"{HASH}/inductor_cache/locks/coe66holh7vssrqle5tly3iueusgeunez65ribic2iy3x2tw373w.lock": b"",
}


def _run(script: str, folder: Path, request: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    program = bundled_program(script, folder)
    return subprocess.run(
        [sys.executable, str(program), pack(request)], capture_output=True, text=True, timeout=120, check=False
    )


def _engine_cache(root: Path) -> Path:
    for rel, data in ENGINE_FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def _pack(tmp_path: Path, source: Path, artifact: Path, **bounds: int) -> subprocess.CompletedProcess[str]:
    request = {
        "source": str(source),
        "user": "root",  # the tests' engine wrote its cache as root
        "dir": str(artifact),
        "most_files": bounds.get("most_files", 100),
        "most_bytes": bounds.get("most_bytes", 10 << 20),
    }
    return _run("compile_cache_pack.py", tmp_path, request)


def _place(tmp_path: Path, artifact: Path, manifest: dict[str, Any], url: str, key_file: Path, **more: Any) -> Any:
    engine = artifact.parent.parent / "cache" / "kimi-vllm"
    request = {
        "dir": str(artifact),
        "manifest": manifest,
        "peers": [{"host": "kimi-h1", "url": url}],
        "peer_key_file": str(key_file),
        "progress_log": str(tmp_path / "progress.log"),
        "engine_dir": str(engine / "vllm" / "torch_compile_cache"),
        "owner_root": str(engine),
        "user": "root",
        **more,
    }
    return _run("compile_cache_place.py", tmp_path, request)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    (path := tmp_path / "key").write_text(KEY + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def packed(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    source = _engine_cache(tmp_path / "engine-cache" / "torch_compile_cache")
    artifact = tmp_path / "a" / "compile-caches" / "kimi-vllm-k1"
    done = _pack(tmp_path, source, artifact)
    assert done.returncode == 0, done.stderr
    return artifact, json.loads(done.stdout)["manifest"]


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not any(part.startswith(".kimi") for part in p.relative_to(root).parts)
    }


def test_the_packed_cache_is_the_engines_files_root_owned_and_read_only_to_others(
    packed: tuple[Path, dict[str, Any]],
) -> None:
    artifact, manifest = packed
    assert _tree(artifact) == ENGINE_FILES
    assert manifest == {
        rel: [len(data), "sha256:" + hashlib.sha256(data).hexdigest()] for rel, data in ENGINE_FILES.items()
    }
    for path in [artifact, *artifact.rglob("*")]:
        st = path.stat()
        assert st.st_uid == 0, path
        assert (st.st_mode & 0o777) == (0o755 if path.is_dir() else 0o644), path


def test_what_one_host_packed_is_placed_on_another_through_the_relay(
    tmp_path: Path, key_file: Path, packed: tuple[Path, dict[str, Any]]
) -> None:
    artifact, manifest = packed
    elsewhere = tmp_path / "b" / "compile-caches" / "kimi-vllm-k1"
    for url in serve(artifact, manifest, key_file, "127.0.0.1", ["127.0.0.1"]):
        done = _place(tmp_path, elsewhere, manifest, url, key_file)
        assert done.returncode == 0, done.stderr
        assert _tree(elsewhere) == ENGINE_FILES
        assert json.loads((elsewhere / ".kimi" / "manifest.json").read_text()) == manifest
        assert not Path(f"{elsewhere}.placing").exists()
        for path in [elsewhere, *elsewhere.rglob("*")]:
            assert path.stat().st_uid == 0
            assert (path.stat().st_mode & 0o022) == 0, path
        # placed again: nothing fetched, the same folder
        again = _place(tmp_path, elsewhere, manifest, url, key_file)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout.strip().splitlines()[-1])["already"] is True


def test_bytes_changed_on_the_source_are_refused_by_digest_and_nothing_is_placed(
    tmp_path: Path, key_file: Path, packed: tuple[Path, dict[str, Any]]
) -> None:
    artifact, manifest = packed
    rel = MODEL
    target = artifact / rel
    st = target.stat()
    # Changed in place, size and times kept: the source's own verdict still holds, so it serves it.
    target.chmod(0o644)
    target.write_bytes(b"import os; os.system('id')\n"[: st.st_size].ljust(st.st_size, b"#"))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    elsewhere = tmp_path / "b" / "compile-caches" / "kimi-vllm-k1"
    for url in serve(artifact, manifest, key_file, "127.0.0.1", ["127.0.0.1"]):
        done = _place(tmp_path, elsewhere, manifest, url, key_file)
    assert done.returncode == 5, done.stderr
    assert rel in done.stderr
    assert f"Mismatch: expected {manifest[rel][1]}" in done.stderr
    # no folder a unit would bind: only the placement that did not finish
    assert not elsewhere.exists()


def test_a_placed_cache_changed_on_its_host_is_repaired_from_the_peer(
    tmp_path: Path, key_file: Path, packed: tuple[Path, dict[str, Any]]
) -> None:
    artifact, manifest = packed
    elsewhere = tmp_path / "b" / "compile-caches" / "kimi-vllm-k1"
    for url in serve(artifact, manifest, key_file, "127.0.0.1", ["127.0.0.1"]):
        assert _place(tmp_path, elsewhere, manifest, url, key_file).returncode == 0
        rel = f"{HASH}/{KERNEL}.main.so"
        (elsewhere / rel).write_bytes(b"tampered")
        (elsewhere / HASH / "rank_0_0" / "extra.py").write_bytes(b"print('not in the manifest')\n")
        done = _place(tmp_path, elsewhere, manifest, url, key_file)
        assert done.returncode == 0, done.stderr
    assert _tree(elsewhere) == ENGINE_FILES


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder every user may enter (pytest's own are root's alone), as /var/lib is."""
    folder = Path(tempfile.mkdtemp(prefix="kimi-compile-cache-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def open_packed(open_folder: Path, tmp_path: Path) -> tuple[Path, dict[str, Any], Path]:
    """An engine's cache packed on a host (``a``), and where another host (``b``) places it, in a
    folder every user may enter: the artifact, its manifest, the other host's artifact folder."""
    source = _engine_cache(tmp_path / "engine-cache" / "torch_compile_cache")
    artifact = open_folder / "a" / "compile-caches" / "kimi-vllm-k1"
    assert _pack(tmp_path, source, artifact).returncode == 0
    manifest = json.loads((artifact / ".kimi" / "manifest.json").read_text())
    return artifact, manifest, open_folder / "b" / "compile-caches" / "kimi-vllm-k1"


def test_the_engine_user_cannot_change_the_cache_it_reads(tmp_path: Path, open_folder: Path) -> None:
    source = _engine_cache(tmp_path / "engine-cache" / "torch_compile_cache")
    artifact = open_folder / "compile-caches" / "kimi-vllm-k1"
    assert _pack(tmp_path, source, artifact).returncode == 0
    nobody = pwd.getpwnam("nobody")
    rel = next(iter(ENGINE_FILES))
    as_engine = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
    read = subprocess.run([*as_engine, "cat", str(artifact / rel)], capture_output=True, timeout=10, check=False)
    assert read.returncode == 0
    assert read.stdout == ENGINE_FILES[rel]
    for attempt in (
        ["sh", "-c", f"echo x >> '{artifact / rel}'"],
        ["touch", str(artifact / HASH / "rank_0_0" / "new")],
        ["rm", "-f", str(artifact / rel)],
        ["mv", str(artifact / HASH), str(artifact / "moved")],
    ):
        done = subprocess.run([*as_engine, *attempt], capture_output=True, text=True, timeout=10, check=False)
        assert done.returncode != 0, attempt
    assert _tree(artifact) == ENGINE_FILES


def test_links_devices_and_other_users_files_in_the_engines_cache_are_not_packed(tmp_path: Path) -> None:
    source = _engine_cache(tmp_path / "engine-cache" / "torch_compile_cache")
    secret = tmp_path / "root-only"
    secret.write_text("a root secret\n")
    secret.chmod(0o600)
    (source / HASH / "rank_0_0" / "leak").symlink_to(secret)
    (source / HASH / "linked-dir").symlink_to(tmp_path)
    os.mkfifo(source / HASH / "fifo")
    theirs = source / HASH / "another-users"
    theirs.write_bytes(b"not the engine's")
    os.chown(theirs, 65534, 65534)
    artifact = tmp_path / "compile-caches" / "kimi-vllm-k1"
    done = _pack(tmp_path, source, artifact)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["left_out"] == 4
    assert set(answer["manifest"]) == set(ENGINE_FILES)
    assert _tree(artifact) == ENGINE_FILES


def test_a_cache_past_its_bounds_is_not_packed_and_an_empty_one_makes_nothing(tmp_path: Path) -> None:
    source = _engine_cache(tmp_path / "engine-cache" / "torch_compile_cache")
    artifact = tmp_path / "compile-caches" / "kimi-vllm-k1"
    too_many = _pack(tmp_path, source, artifact, most_files=len(ENGINE_FILES) - 1)
    assert too_many.returncode == 2
    assert "not packed" in too_many.stderr
    too_big = _pack(tmp_path, source, artifact, most_bytes=100_000)
    assert too_big.returncode == 2
    assert "not packed" in too_big.stderr
    assert not artifact.exists()
    assert not Path(f"{artifact}.packing").exists()
    shutil.rmtree(source)
    source.mkdir()
    empty = _pack(tmp_path, source, artifact)
    assert empty.returncode == 0
    assert json.loads(empty.stdout)["manifest"] == {}
    assert not artifact.exists()


def test_the_engine_gets_its_own_copy_written_as_its_user(
    open_packed: tuple[Path, dict[str, Any], Path], tmp_path: Path, key_file: Path
) -> None:
    artifact, manifest, elsewhere = open_packed
    engine = elsewhere.parent.parent / "cache" / "kimi-vllm"
    copy = engine / "vllm" / "torch_compile_cache"
    for url in serve(artifact, manifest, key_file, "127.0.0.1", ["127.0.0.1"]):
        done = _place(tmp_path, elsewhere, manifest, url, key_file, user="nobody")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.strip().splitlines()[-1])["given"] is True
        assert _tree(copy) == ENGINE_FILES
        nobody = pwd.getpwnam("nobody").pw_uid
        # the engine's folder and every file in it its user's, private (the unit's UMask=0077)
        for path in [engine, *engine.rglob("*")]:
            assert path.stat().st_uid == nobody, path
            assert path.stat().st_mode & 0o077 == 0, path
        # the artifact stays root's whatever the engine does to its copy
        (copy / next(iter(ENGINE_FILES))).write_bytes(b"changed by the engine")
        assert _tree(elsewhere) == ENGINE_FILES
        # given once: the marker of this key and manifest stops a second copy
        again = _place(tmp_path, elsewhere, manifest, url, key_file, user="nobody")
        assert json.loads(again.stdout.strip().splitlines()[-1])["given"] is False


def test_a_link_the_engine_left_in_its_folder_leads_the_copy_nowhere(
    open_packed: tuple[Path, dict[str, Any], Path], open_folder: Path, tmp_path: Path, key_file: Path
) -> None:
    artifact, manifest, elsewhere = open_packed
    engine = elsewhere.parent.parent / "cache" / "kimi-vllm"
    victim = open_folder / "root-file"
    victim.write_text("root's\n")
    # the engine's user made its folder and put a link where a cache file goes
    (engine / "vllm" / "torch_compile_cache" / HASH / "rank_0_0").mkdir(parents=True)
    rel = MODEL
    (engine / "vllm" / "torch_compile_cache" / rel).symlink_to(victim)
    nobody = pwd.getpwnam("nobody")
    for path in [engine, *engine.rglob("*")]:
        os.lchown(path, nobody.pw_uid, nobody.pw_gid)
    for url in serve(artifact, manifest, key_file, "127.0.0.1", ["127.0.0.1"]):
        done = _place(tmp_path, elsewhere, manifest, url, key_file, user="nobody")
    assert done.returncode == 0, done.stderr
    # the link replaced by the file, the root-owned file untouched
    assert victim.read_text() == "root's\n"
    assert (engine / "vllm" / "torch_compile_cache" / rel).read_bytes() == ENGINE_FILES[rel]


def test_the_probe_reads_whole_and_given_without_hashing_and_trusts_no_link(
    open_packed: tuple[Path, dict[str, Any], Path], open_folder: Path, tmp_path: Path, key_file: Path
) -> None:
    artifact, manifest, elsewhere = open_packed
    copy = elsewhere.parent.parent / "cache" / "kimi-vllm" / "vllm" / "torch_compile_cache"
    asked = [{"dir": str(elsewhere), "engine_dir": str(copy)}]
    assert found(asked)[str(elsewhere)] == {"manifest": None, "whole": False, "given": None}
    for url in serve(artifact, manifest, key_file, "127.0.0.1", ["127.0.0.1"]):
        assert _place(tmp_path, elsewhere, manifest, url, key_file, user="nobody").returncode == 0
    marker = {"key": "kimi-vllm-k1", "manifest": manifest_digest(manifest)}
    assert found(asked)[str(elsewhere)] == {"manifest": manifest, "whole": True, "given": marker}
    # a file changed since it was verified: not whole (its size, mtime or inode moved)
    changed = elsewhere / next(iter(ENGINE_FILES))
    changed.write_bytes(changed.read_bytes() + b"#")
    assert found(asked)[str(elsewhere)]["whole"] is False
    # the engine's user replaced its marker with a link to a root file: not read
    mark = copy / ".kimi-compile-cache"
    mark.unlink()
    mark.symlink_to(elsewhere / ".kimi" / "manifest.json")
    assert found(asked)[str(elsewhere)]["given"] is None


def test_a_placement_cut_short_leaves_nothing_to_bind_and_the_next_run_completes_it(
    tmp_path: Path, key_file: Path, packed: tuple[Path, dict[str, Any]]
) -> None:
    artifact, manifest = packed
    elsewhere = tmp_path / "b" / "compile-caches" / "kimi-vllm-k1"
    # the peer holds all but one file verified: the source host went away part-way
    missing = f"{HASH}/{KERNEL}.main.so"
    partial = {rel: entry for rel, entry in manifest.items() if rel != missing}
    for url in serve(artifact, partial, key_file, "127.0.0.1", ["127.0.0.1"]):
        cut = _place(tmp_path, elsewhere, manifest, url, key_file)
    assert cut.returncode == 5, cut.stderr
    assert missing in cut.stderr
    assert not elsewhere.exists()
    placing = Path(f"{elsewhere}.placing")
    kept = {p.relative_to(placing).as_posix() for p in placing.rglob("*") if p.is_file() and ".kimi" not in p.parts}
    assert kept == set(partial)
    # the next run: the peer whole again; what arrived before is verified, not fetched again
    for url in serve(artifact, manifest, key_file, "127.0.0.1", ["127.0.0.1"]):
        done = _place(tmp_path, elsewhere, manifest, url, key_file)
    assert done.returncode == 0, done.stderr
    assert _tree(elsewhere) == ENGINE_FILES
    assert not placing.exists()
    said = json.loads(done.stdout.strip().splitlines()[0])
    assert sorted(said["from_peers"].values()) == [len(ENGINE_FILES[missing])]
