"""Install one pinned release into its own virtual environment with uv, from a lock: prints one line, JSON.

Input: one argument, base64 of zlib-compressed JSON:
  {"path", "requirements", "index_url", "marker", "uv": {"version", "dir"},
   "lock": {"text": str} | {"own": sha256}}

uv comes from the index like everything else: it is installed once, with the venv module and pip,
into ``uv.dir`` (a folder per uv version, complete once its marker is there). The lock is the
exact ``name==version`` set with the index's hashes, for this host's Python and machine: the text
the controller resolved for this host's platform (``kimi_deploy.releases.lock``; its first line
names the platform, and must name this host's), or ``own``, the one in ``path``, whose digest must
match, to rebuild a damaged release as it was. No lock is resolved here.

Every lock text, given or own, is checked (``hostside.boundary_lock.check_lock``)
before it is written or handed to uv: only ``name==version`` lines each with ``--hash=sha256:``,
pinning every requirement at its version; anything else fails before uv runs. uv installs wheels
only (``--no-build``, ``--require-hashes``): nothing from the index or a lock runs while installing.
Nor does the release's own interpreter start once a wheel is in it (its ``site`` would execute the
``.pth`` files of any wheel the lock names, as root): uv compiles no bytecode (the host's Python
does, isolated and without ``site``) and what is installed is read from the ``*.dist-info``
folders' METADATA, not asked of that interpreter.

The release is built beside ``path`` (a relocatable venv: ``uv venv --relocatable``, ``uv pip
sync`` of the lock, the distributions installed checked against the lock), gets a manifest of its files
with their sizes (what the host probe stats) and its marker ``.kimi-release.json`` last, then
takes the place of ``path`` in two renames: an engine running from ``path`` keeps running. On
failure ``path`` is left as it was and the reason is one line (exit 1): a version missing from the
index, an index that does not answer, bytes that do not match the lock's hashes.

While uv fetches the wheels, ``<path>.kimi-progress`` says how many of their bytes are in
(``hostside.progress_file``, counted from what uv says it downloads: ``hostside.uv_downloads``);
it goes when the install ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import threading
import time
from typing import Any, NoReturn
from urllib.parse import urlparse

from kimi_deploy.hostside.boundary_lock import METADATA_MAX_BYTES, canonical_version, check_lock, metadata_pin
from kimi_deploy.hostside.boundary_text import shown
from kimi_deploy.hostside.progress_file import release_progress, remove_progress, write_progress
from kimi_deploy.hostside.request import read_request
from kimi_deploy.hostside.uv_downloads import Downloads
from kimi_deploy.hostside.uv_process import HTTP_RETRIES, HTTP_TIMEOUT_S, environment, reason

LOCK, FREEZE, MANIFEST, MARKER = ".kimi-lock.txt", ".kimi-freeze.txt", ".kimi-manifest.json", ".kimi-release.json"


def _fail(message: str, *remove: str) -> NoReturn:
    for path in remove:
        shutil.rmtree(path, ignore_errors=True)
    print(json.dumps({"ok": False, "error": message}))
    print(f"kimi-deploy: {message}", file=sys.stderr)
    sys.exit(1)


# uv unpacks every wheel into a temporary cache first (it runs with --no-cache): beside the
# releases, not in /tmp, which is often a small tmpfs (an engine release unpacks to gigabytes)
# and another filesystem (uv then copies each file into the venv instead of linking it).
_TMP = ".kimi-uv-tmp"


def _run(argv: list[str], index_url: str, *remove: str, stdin: str | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False, env=environment(os.environ))
    if done.returncode != 0:
        _fail(reason(done.stdout + done.stderr, index_url), *remove)
    return done.stdout


def _run_counted(argv: list[str], index_url: str, progress: str, *remove: str) -> str:
    """``_run``, reading uv's stderr as it comes: each download it names is counted in the
    progress file ``progress``."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment(os.environ)
    )
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read() if proc.stdout else ""), daemon=True)
    reader.start()
    err: list[str] = []
    downloads = Downloads()
    for line in proc.stderr or ():
        err.append(line)
        if downloads.line(line):
            write_progress(progress, downloads.done, downloads.total)
    proc.wait()
    reader.join()
    if proc.returncode != 0:
        _fail(reason("".join(out) + "".join(err), index_url), *remove)
    return "".join(out)


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _bootstrap(version: str, folder: str, index_url: str) -> str:
    """The uv binary of ``version``, installed once into ``folder`` from the index with pip."""
    uv = os.path.join(folder, "bin", "uv")
    if os.path.isfile(os.path.join(folder, MARKER)) and os.access(uv, os.X_OK):
        return uv
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    venv = subprocess.run([sys.executable, "-m", "venv", folder], capture_output=True, text=True, check=False)
    if venv.returncode != 0:
        _fail(f"python3 -m venv {folder} failed: {(venv.stderr or venv.stdout).strip().splitlines()[-1:]}", folder)
    pip = [f"{folder}/bin/pip", "install", "--no-cache-dir", "--disable-pip-version-check", "--no-input"]
    pip += ["--retries", str(HTTP_RETRIES), "--timeout", str(HTTP_TIMEOUT_S)]
    pip += ["--only-binary", ":all:", "--index-url", index_url]
    host = urlparse(index_url).hostname
    if urlparse(index_url).scheme == "http" and host:
        pip += ["--trusted-host", host]
    _run([*pip, f"uv=={version}"], index_url, folder)
    _write(os.path.join(folder, MARKER), json.dumps({"package": "uv", "version": version}, sort_keys=True))
    return uv


def _platform() -> str:
    """What a lock must name as its platform to be installed here: this Python and this machine."""
    return f"cp{sys.version_info.major}{sys.version_info.minor}-{platform.machine()}"


def _checked(text: str, requirements: list[str], what: str, *remove: str) -> dict[str, str]:
    """The pins of lock ``text`` (``what``: where it comes from), or fail naming the rule."""
    try:
        return check_lock(text, requirements)
    except ValueError as exc:
        _fail(f"{what} is refused: {exc}", *remove)


def _manifest(root: str) -> dict[str, int]:
    """Every file and link under ``root`` with its size (``lstat``), but the marker, the manifest
    and bytecode caches (Python recompiles a bad one; a third of the files, none needed to run)."""
    files: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        for name in filenames + links:
            full = os.path.join(dirpath, name)
            files[os.path.relpath(full, root)] = os.lstat(full).st_size
    files.pop(MARKER, None)
    files.pop(MANIFEST, None)
    return dict(sorted(files.items()))


def _lock_text(req: dict[str, Any], new: str) -> tuple[str, str]:
    """The lock to install and where it came from: the controller's ("given"), or the release's
    own ("own", to rebuild a damaged release as it was)."""
    path, lock = req["path"], req.get("lock") or {}
    if lock.get("own"):
        try:
            with open(os.path.join(path, LOCK), encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            _fail(f"{path}: its lock cannot be read: {exc.strerror}", new)
        if hashlib.sha256(text.encode()).hexdigest() != lock["own"]:
            _fail(f"{path}: its lock changed since install: remove the folder to install it again", new)
        return text, "own"
    given = lock.get("text")
    if not isinstance(given, str) or not given:
        _fail(f"{path}: no lock given (the controller resolves every release's lock)", new)
    text = given
    if not text.startswith(f"# platform: {_platform()}\n"):
        first = shown(text.split("\n", 1)[0])
        _fail(f"{path}: the lock given is for another platform ({first}), this host is {_platform()}", new)
    return text, "given"


def _site_packages(new: str) -> str:
    """The site-packages folder of the venv ``new`` (made with this Python)."""
    return os.path.join(new, "lib", f"python{sys.version_info.major}.{sys.version_info.minor}", "site-packages")


# Compiles every module below argv[1] with as many workers as CPUs. A file that does not compile is
# left to Python, as uv and pip leave it (it fails when imported, bytecode or not); this exits
# non-zero only when compiling itself fails.
_COMPILE = "import compileall, sys; compileall.compile_dir(sys.argv[1], quiet=2, workers=0)"


def _compile(path: str, new: str) -> None:
    """The bytecode of every module of ``new``, compiled by this host's Python, isolated (``-I``)
    and without ``site`` (``-S``): nothing of the release is executed, its ``.pth`` files included."""
    argv = [sys.executable, "-I", "-S", "-c", _COMPILE, _site_packages(new)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        _fail(f"{path}: compiling its bytecode failed: {shown(last[0])}", new)


def _installed(path: str, new: str) -> dict[str, str]:
    """``{normalized name: version}`` of every distribution in ``new``, read from each
    ``*.dist-info/METADATA`` (its first ``METADATA_MAX_BYTES``); fails in one line on one that
    cannot be read or names no package and version."""
    site = _site_packages(new)
    where = os.path.relpath(site, new)
    pins: dict[str, str] = {}
    for entry in sorted(os.listdir(site)):
        if not entry.endswith(".dist-info"):
            continue
        meta = os.path.join(entry, "METADATA")
        # Installing a wheel makes folders and regular files only: a link or anything else here
        # was not made by uv, and is not followed.
        if os.path.islink(os.path.join(site, entry)):
            _fail(f"{path}: {where}/{shown(entry)} is a link, not a wheel's folder", new)
        try:
            fd = os.open(os.path.join(site, meta), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    _fail(f"{path}: {where}/{shown(meta)} is not a regular file", new)
                head = f.read(METADATA_MAX_BYTES)
        except OSError as exc:
            _fail(f"{path}: {where}/{shown(meta)} cannot be read: {exc.strerror}", new)
        try:
            name, version = metadata_pin(head.decode("utf-8", errors="replace"))
        except ValueError as exc:
            _fail(f"{path}: {where}/{shown(meta)}: {exc}", new)
        if name in pins:
            _fail(f"{path}: {where}/{shown(meta)}: {name} is installed twice", new)
        pins[name] = version
    return pins


def _swap(new: str, path: str) -> None:
    """``new`` takes the place of ``path``: two renames, the old folder removed after."""
    old = f"{path}.kimi-old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.lexists(path):
        os.rename(path, old)
    os.rename(new, path)
    shutil.rmtree(old, ignore_errors=True)


def main() -> None:
    req = read_request()
    given = (req.get("lock") or {}).get("text")
    if given:
        # Checked before anything runs or is made, uv and its bootstrap included.
        _checked(given, req["requirements"], f"{req['path']}: the lock given")
    tmp = os.path.join(os.path.dirname(req["path"]), _TMP)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp, mode=0o700)
    os.environ["TMPDIR"] = tmp
    try:
        _install(req)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_progress(release_progress(req["path"]))


def _install(req: dict[str, Any]) -> None:
    path, index_url = req["path"], req["index_url"]
    started = time.monotonic()
    uv = _bootstrap(req["uv"]["version"], req["uv"]["dir"], index_url)
    new = f"{path}.kimi-new"
    shutil.rmtree(new, ignore_errors=True)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text, source = _lock_text(req, new)
    locked = _checked(text, req["requirements"], f"{path}: the lock ({source})", new)
    _run([uv, "venv", "--no-config", "--quiet", "--relocatable", "--python", sys.executable, new], index_url, new)
    _write(os.path.join(new, LOCK), text)
    # Hashes always required and wheels only: a lock's bytes are the index's, and none of them runs.
    # uv asks the venv's interpreter what it is before installing, while its site-packages holds
    # uv's own files only; it would start it again to compile bytecode, which it does not here.
    sync = [uv, "pip", "sync", "--no-config", "--no-cache", "--no-compile-bytecode", "--python", f"{new}/bin/python"]
    sync += ["--index-url", index_url, "--require-hashes", "--no-build", os.path.join(new, LOCK)]
    _run_counted(sync, index_url, release_progress(path), new)
    installed = _installed(path, new)
    if installed != {name: canonical_version(version) for name, version in locked.items()}:
        _fail(f"{path}: installed {sorted(installed.items())}, the lock has {sorted(locked.items())}", new)
    _compile(path, new)
    _write(os.path.join(new, FREEZE), "".join(f"{name}=={version}\n" for name, version in sorted(installed.items())))
    # uv's own lock file (mode 0666), for uv runs on this venv: there are none after this one.
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(new, ".lock"))
    manifest = _manifest(new)
    _write(os.path.join(new, MANIFEST), json.dumps({"files": manifest}, sort_keys=True))
    lock = {"sha256": hashlib.sha256(text.encode()).hexdigest(), "platform": _platform(), "packages": len(locked)}
    marker = {**req["marker"], "lock": lock, "uv": req["uv"]["version"], "manifest": MANIFEST}
    _write(os.path.join(new, MARKER), json.dumps(marker, sort_keys=True))
    _swap(new, path)
    seconds = round(time.monotonic() - started, 2)
    print(f"kimi-deploy: {path}: {lock['packages']} packages from the lock ({source}) in {seconds} s", file=sys.stderr)
    print(json.dumps({"ok": True, "path": path, "packages": lock["packages"], "lock": source, "seconds": seconds}))


if __name__ == "__main__":
    main()
