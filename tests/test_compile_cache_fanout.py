"""A compile cache made on one host and placed on another, run locally on loopback.

Real processes and sockets, the programs bundled as the hosts get them: ``compile_cache_pack.py``
packs what an engine wrote into the artifact of its key, ``weights_peer.py`` serves it (the weights'
relay) and ``compile_cache_place.py`` places it elsewhere against the manifest the controller holds.
The engine's cache has the shape of vLLM 0.32.0's on CPU (``torch_compile_cache/<hash>/rank_0_0/...``).
The converge's own steps (``kimi_pyinfra.operations.compile_cache``) run those programs on a host
that is this machine: the hand-off within a run from the batch that packed to a later one, and a
source that goes away mid-transfer.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import zlib
from base64 import b64decode
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.context import ctx_host

from kimi_deploy.compile_cache.pins import Pins, state_dir
from kimi_deploy.converge.compile_caches import FromThisRun
from kimi_deploy.host.command import pack
from kimi_deploy.host.programs import COMPILE_CACHE_PACK
from kimi_deploy.hostside.compile_cache_found import MARKER, found, manifest_digest
from kimi_deploy.hostside.requests import CompileCachePlaceRequest
from kimi_pyinfra.operations import compile_cache
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


class _ThisMachine:
    """A host of the converge that is this machine: what a step's FunctionCommand reads of
    pyinfra's host (its name, the operation's arguments, its shell, its log)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.current_op_global_arguments: dict[str, Any] = {}
        self.ran: list[str] = []
        self.said: list[str] = []

    def run_shell_command(self, command: Any, **_: Any) -> tuple[bool, Any]:
        self.ran.append(str(command))
        done = subprocess.run(["sh", "-c", str(command)], capture_output=True, text=True, timeout=120, check=False)
        return done.returncode == 0, SimpleNamespace(
            stdout_lines=done.stdout.splitlines(), stderr_lines=done.stderr.splitlines()
        )

    def log_styled(self, text: str, **_: Any) -> None:
        self.said.append(text)


def _step(on: Any, make: Any, *arguments: Any, **named: Any) -> bool:
    """Make a step's command as the operation does on ``on`` (``make(*arguments, **named)``),
    then run it there."""
    with ctx_host.use(on):
        command = make(*arguments, **named)
    done: bool = command.function(SimpleNamespace(print_output=False), on)
    return done


def _placed(request: CompileCachePlaceRequest) -> Any:
    """``Compile cache placed``'s command for ``request``."""
    return next(compile_cache.placed._inner(request=request, unit="kimi-vllm"))


class _SourceGoingAway:
    """A source host that goes away mid-transfer: it passes on the real peer's answers until
    ``budget`` bytes went out, then drops every connection and listens no more."""

    def __init__(self, upstream: str, budget: int) -> None:
        address, port = upstream.removeprefix("http://").rsplit(":", 1)
        self.upstream = (address, int(port))
        self.budget = budget
        self.sent = 0
        self.mutex = threading.Lock()
        self.open: list[socket.socket] = []
        self.gone = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.gone.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._pass_on, args=(client,), daemon=True).start()

    def _pass_on(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.upstream, timeout=10) as peer:
            with self.mutex:
                self.open += [client, peer]
            threading.Thread(target=self._ask, args=(client, peer), daemon=True).start()
            with suppress(OSError):
                while chunk := peer.recv(16384):
                    with self.mutex:
                        room = self.budget - self.sent
                        self.sent += len(chunk)
                    client.sendall(chunk[: max(room, 0)])
                    if room <= len(chunk):
                        self.go()
                        return

    @staticmethod
    def _ask(client: socket.socket, peer: socket.socket) -> None:
        with suppress(OSError):
            while chunk := client.recv(16384):
                peer.sendall(chunk)

    def go(self) -> None:
        self.gone.set()
        self.listener.close()
        with self.mutex:
            for s in self.open:
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def _request(artifact: Path, manifest: dict[str, Any], url: str, key_file: Path) -> CompileCachePlaceRequest:
    engine = artifact.parent.parent / "cache" / "kimi-vllm"
    return {
        "dir": str(artifact),
        "manifest": manifest,
        "peers": [{"host": "kimi-h1", "url": url}],
        "peer_key_file": str(key_file),
        "progress_log": f"{artifact}.log",
        "engine_dir": str(engine / "vllm" / "torch_compile_cache"),
        "owner_root": str(engine),
        "user": "root",
    }


def test_a_source_that_goes_away_mid_transfer_is_one_line_and_the_converge_goes_on(
    tmp_path: Path, key_file: Path, packed: tuple[Path, dict[str, Any]]
) -> None:
    artifact, manifest = packed
    elsewhere = tmp_path / "b" / "compile-caches" / "kimi-vllm-k1"
    request = _request(elsewhere, manifest, "", key_file)
    copy = Path(request["engine_dir"])
    receiver = _ThisMachine("kimi-h3")
    total = sum(len(data) for data in ENGINE_FILES.values())
    for url in serve(artifact, manifest, key_file, "127.0.0.1", ["127.0.0.1"]):
        source = _SourceGoingAway(url, budget=total // 2)
        going: CompileCachePlaceRequest = {**request, "peers": [{"host": "kimi-h1", "url": source.url}]}
        done = _step(receiver, _placed, going)
        assert source.gone.is_set()
        # the host's converge goes on: its engine starts and compiles as it would without a cache
        assert done is True
        (line,) = receiver.said
        assert line.startswith("kimi-h3: compile cache kimi-vllm-k1: not placed (")
        assert " of 5 files did not arrive; kimi-h1: " in line
        assert "the engine compiles its own" in line
        # nothing partial anywhere the engine or a unit reads: no artifact, no copy given
        assert not elsewhere.exists()
        assert not (copy / MARKER).exists()
        assert not any(copy.rglob("*")) if copy.exists() else True
        # the next run, the source whole: what arrived is kept, the rest fetched, the engine given it
        again = _ThisMachine("kimi-h3")
        whole: CompileCachePlaceRequest = {**request, "peers": [{"host": "kimi-h1", "url": url}]}
        assert _step(again, _placed, whole)
        assert again.said == []
    assert _tree(elsewhere) == ENGINE_FILES
    assert _tree(copy) == ENGINE_FILES
    assert json.loads((copy / MARKER).read_text()) == {"key": "kimi-vllm-k1", "manifest": manifest_digest(manifest)}


def test_a_source_gone_before_the_transfer_is_one_line_too(
    tmp_path: Path, key_file: Path, packed: tuple[Path, dict[str, Any]]
) -> None:
    _, manifest = packed
    elsewhere = tmp_path / "b" / "compile-caches" / "kimi-vllm-k1"
    with socket.create_server(("127.0.0.1", 0)) as closed:
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    receiver = _ThisMachine("kimi-h3")
    request = _request(elsewhere, manifest, url, key_file)
    assert _step(receiver, _placed, request)
    (line,) = receiver.said
    assert "kimi-h3: compile cache kimi-vllm-k1: not placed (" in line
    assert "5 of 5 files did not arrive; kimi-h1: " in line
    assert "Connection refused" in line
    assert not elsewhere.exists()


def test_a_failure_of_the_host_itself_still_fails_its_converge(
    tmp_path: Path, key_file: Path, packed: tuple[Path, dict[str, Any]]
) -> None:
    artifact, manifest = packed
    elsewhere = tmp_path / "b" / "compile-caches" / "kimi-vllm-k1"
    receiver = _ThisMachine("kimi-h3")
    for url in serve(artifact, manifest, key_file, "127.0.0.1", ["127.0.0.1"]):
        # the engine's user is not on this host: the copy into its folder cannot be made
        request: CompileCachePlaceRequest = {
            **_request(elsewhere, manifest, url, key_file),
            "user": "kimi-no-such-user",
        }
        assert _step(receiver, _placed, request) is False
    assert receiver.said
    assert not any("not placed (" in line for line in receiver.said)


def test_a_later_batch_places_what_the_first_packed_in_this_run(
    tmp_path: Path, key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "controller"))
    source = _engine_cache(tmp_path / "a" / "cache" / "kimi-vllm" / "vllm" / "torch_compile_cache")
    artifact = tmp_path / "a" / "compile-caches" / "kimi-vllm-k1"
    elsewhere = tmp_path / "b" / "compile-caches" / "kimi-vllm-k1"
    compiler, receiver = _ThisMachine("kimi-h1"), _ThisMachine("kimi-h3")
    receives = FromThisRun("kimi-vllm-k1", "kimi-h1", _request(elsewhere, {}, "", key_file))
    run: dict[str, dict[str, list[Any]]] = {}  # the run's hand-off (RunContext.compile_caches_packed)
    # before the pack (or when it failed): one line, nothing run, the converge goes on
    assert _step(receiver, compile_cache._from_run, receives, run)
    assert receiver.said == [
        "kimi-h3: compile cache kimi-vllm-k1: kimi-h1 packed none this run: the engine compiles its own"
    ]
    assert receiver.ran == []
    # the first batch answered: its host packs, and the controller holds what it answered
    request = {"source": str(source), "user": "root", "dir": str(artifact), "most_files": 100, "most_bytes": 10 << 20}
    command = COMPILE_CACHE_PACK.command("/usr/bin/python3", request)  # type: ignore[arg-type]
    assert _step(compiler, compile_cache._pack, command, "kimi-vllm-k1", None, run)
    manifest = json.loads((artifact / ".kimi" / "manifest.json").read_text())
    assert run == {"kimi-vllm-k1": manifest}
    assert Pins(state_dir({"XDG_STATE_HOME": str(tmp_path / "controller")})).get("kimi-vllm-k1") == manifest
    # it serves the artifact with that manifest (``served_packed``), and the later batch places it
    receiver.said.clear()
    for url in serve(artifact, manifest, key_file, "127.0.0.1", ["127.0.0.1"]):
        later = FromThisRun(
            receives.name, receives.source, receives.request | {"peers": [{"host": "kimi-h1", "url": url}]}
        )
        assert _step(receiver, compile_cache._from_run, later, run)
    assert receiver.said == []
    assert _tree(elsewhere) == ENGINE_FILES
    engine = Path(receives.request["engine_dir"])
    assert _tree(engine) == ENGINE_FILES
    assert json.loads((engine / MARKER).read_text()) == {"key": "kimi-vllm-k1", "manifest": manifest_digest(manifest)}


def test_a_pack_the_controller_does_not_hold_is_not_handed_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, packed: tuple[Path, dict[str, Any]]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "controller"))
    artifact, manifest = packed
    held = {rel: [entry[0], "sha256:" + "b" * 64] for rel, entry in manifest.items()}
    request = {
        "source": str(tmp_path / "nowhere"),
        "user": "root",
        "dir": str(artifact),
        "most_files": 100,
        "most_bytes": 10 << 20,
    }
    command = COMPILE_CACHE_PACK.command("/usr/bin/python3", request)  # type: ignore[arg-type]
    run: dict[str, dict[str, list[Any]]] = {}
    compiler = _ThisMachine("kimi-h1")
    assert _step(compiler, compile_cache._pack, command, "kimi-vllm-k1", held, run)
    assert run == {}
    assert compiler.said == ["kimi-h1: compile cache kimi-vllm-k1: packed, not the one the controller holds: not used"]
    assert _step(compiler, compile_cache._pack, command, "kimi-vllm-k1", manifest, run)
    assert run == {"kimi-vllm-k1": manifest}


def test_the_relay_of_a_pack_serves_the_manifest_the_pack_answered(tmp_path: Path) -> None:
    manifest = {"torch_aot_compile/ab/rank_0_0/model": [10, "sha256:" + "a" * 64]}
    host = SimpleNamespace(name="kimi-h1", current_op_global_arguments={}, said=[], ran=[])
    host.run_shell_command = lambda command, **_: (host.ran.append(str(command)), (True, None))[1]
    host.log_styled = lambda text, **_: host.said.append(text)
    where = "/var/lib/kimi/compile-caches/kimi-vllm-k1"
    arguments = {
        "path": where,
        "bind": "10.0.0.1",
        "port": 8479,
        "allow": ["10.0.0.3"],
        "key_file": "/k",
        "user": "kimi",
    }
    assert _step(host, compile_cache._serve, packed={}, **arguments)
    assert host.ran == []
    assert host.said == ["kimi-h1: compile cache kimi-vllm-k1: none packed this run to serve"]
    assert _step(host, compile_cache._serve, packed={"kimi-vllm-k1": manifest}, **arguments)
    (command,) = host.ran
    assert "systemd-run" in command
    assert "--property=User=kimi" in command
    served = json.loads(zlib.decompress(b64decode(command.split()[-1])))
    assert served["dir"] == where
    assert served["lock"] == manifest
    assert served["allow"] == ["10.0.0.3"]
    assert (served["bind"], served["port"], served["key_file"]) == ("10.0.0.1", 8479, "/k")
