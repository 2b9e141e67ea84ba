"""Release locks resolved on the controller, for the platform of the hosts that install them.

A release (an engine, a router, the host tools: one venv per pinned version) is installed from a
lock: the exact ``name==version`` set of its whole dependency closure, with the index's hashes,
wheels only. The controller resolves it, with uv, against the recipe's index, for the platform a
host's probe reports (its Python, machine and C library: ``HostPlatform``), and hands the text to
the host, which installs exactly that (``hostside/venv_install.py``: ``uv pip sync
--require-hashes --no-build``). No host resolves, and no host installs a set of packages another
host chose: a host's word decides nothing but which of the controller's locks it is sent.

A lock is resolved once per release, index and platform and kept in the controller's cache
(``$XDG_CACHE_HOME/kimi-deploy/release-locks``, else ``~/.cache/...``): every host of that
platform installs it, in this run and later ones (a host added next month gets what its peers
run, whatever the index publishes by then), until the pins change. Remove a cached lock to
resolve it again. Hosts of a run that ask at once wait for one resolution
(``operations.engine``, through the run context).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from uv import find_uv_bin

from kimi_deploy.controller_dirs import controller_cache
from kimi_deploy.hostside.boundary_lock import check_lock, is_name
from kimi_deploy.hostside.boundary_text import shown
from kimi_deploy.hostside.uv_process import environment, reason

# The platforms uv resolves for (``--python-platform``): Linux on these machines, manylinux
# from glibc 2.17 to 2.40 (a wheel for an older glibc runs on a newer one).
MACHINES = ("x86_64", "aarch64")
GLIBC_OLDEST, GLIBC_NEWEST = (2, 17), (2, 40)
_PYTHON = re.compile(r"3\.(\d{1,2})")
_GLIBC = re.compile(r"glibc (\d{1,2})\.(\d{1,3})")
# The lock's line naming the requirements it was resolved without.
WITHOUT_HEADER = "# without: "
# How long one resolution may take (uv's own HTTP timeouts and retries are shorter).
RESOLVE_S = 600


class LockError(Exception):
    """A release's lock could not be made: one line, naming the release and why."""


@dataclass(frozen=True)
class HostPlatform:
    """What a release's lock is valid for, as a host's probe reports it (checked: ``parse``)."""

    python: tuple[int, int]
    machine: str
    glibc: tuple[int, int]

    @classmethod
    def parse(cls, found: object) -> HostPlatform:
        """The platform a probe reported (``{"python": "3.11", "machine": "x86_64", "libc": "glibc
        2.36"}``), or ``ValueError`` naming what is not one kimi-deploy resolves for."""
        if not isinstance(found, dict):
            raise ValueError("the host did not report its platform")
        python, machine, libc = (str(found.get(k, "")) for k in ("python", "machine", "libc"))
        py = _PYTHON.fullmatch(python)
        if py is None or not 8 <= int(py.group(1)) <= 20:
            raise ValueError(f"python {shown(python)}: expected a CPython 3.x version")
        if machine not in MACHINES:
            raise ValueError(f"machine {shown(machine)}: expected one of {', '.join(MACHINES)}")
        c = _GLIBC.fullmatch(libc)
        if c is None or (int(c.group(1)), int(c.group(2))) < GLIBC_OLDEST:
            raise ValueError(f"C library {shown(libc)}: expected glibc {GLIBC_OLDEST[0]}.{GLIBC_OLDEST[1]} or newer")
        return cls((3, int(py.group(1))), machine, (int(c.group(1)), int(c.group(2))))

    @property
    def tag(self) -> str:
        """What a lock names as its platform (``# platform: cp311-x86_64``), as the host checks it."""
        return f"cp{self.python[0]}{self.python[1]}-{self.machine}"

    @property
    def name(self) -> str:
        """Its name in a committed lock's file name: ``cp312-aarch64-glibc2.39``."""
        return f"{self.tag}-glibc{self.glibc[0]}.{self.glibc[1]}"

    @property
    def described(self) -> str:
        """``Python 3.12, aarch64, glibc 2.39``, for messages."""
        return f"Python {self.python[0]}.{self.python[1]}, {self.machine}, glibc {self.glibc[0]}.{self.glibc[1]}"

    def runs(self, locked: HostPlatform) -> bool:
        """Whether a host of this platform runs a lock made for ``locked``: the same Python and
        machine, and a C library at least as new (manylinux wheels run on newer glibc)."""
        return (self.python, self.machine) == (locked.python, locked.machine) and self.glibc >= locked.glibc

    @property
    def uv_platform(self) -> str:
        """uv's ``--python-platform`` for it (``x86_64-manylinux_2_36``)."""
        major, minor = min(self.glibc, GLIBC_NEWEST)
        return f"{self.machine}-manylinux_{major}_{minor}"


def cache_dir(environ: Mapping[str, str]) -> Path:
    """Where the controller keeps the locks it resolved (``environ``: the controller's environment)."""
    return controller_cache(environ) / "release-locks"


def _key(requirements: list[str], without: list[str], index_url: str, platform: HostPlatform) -> str:
    what = {
        "requirements": requirements,
        "without": sorted(without),
        "index_url": index_url,
        "platform": [list(platform.python), platform.machine, platform.uv_platform],
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def _uv() -> str:
    """The controller's own uv (a dependency of kimi-deploy)."""
    return str(find_uv_bin())


def resolve(
    requirements: list[str], without: list[str], index_url: str, platform: HostPlatform, environ: Mapping[str, str]
) -> str:
    """The lock text of ``requirements`` for ``platform``: exact pins with the index's hashes,
    wheels only (resolving builds nothing, so runs nothing from the index), no package of
    ``without`` in it; ``LockError`` in one line when it does not resolve. uv runs in ``environ``
    (the controller's: its proxy and certificate settings)."""
    bad = [name for name in without if not is_name(name)]
    if bad:
        raise LockError(f"without: {shown(bad[0])} is not a package name")
    argv = [_uv(), "pip", "compile", "--no-config", "--no-build", "--generate-hashes", "--no-header"]
    argv += ["--no-annotate", "--index-url", index_url]
    python = f"{platform.python[0]}.{platform.python[1]}"
    argv += ["--python-version", python, "--python-platform", platform.uv_platform]
    with tempfile.TemporaryDirectory(prefix="kimi-lock-") as folder:
        if without:
            overrides = Path(folder) / "without.txt"
            # An override replaces every requirement on the package; one whose marker never holds
            # removes it (uv has no other way to leave out a dependency another package declares).
            overrides.write_text("".join(f'{name} ; sys_platform == "never"\n' for name in sorted(without)))
            argv += ["--override", str(overrides)]
        try:
            done = subprocess.run(
                [*argv, "-"],
                input="".join(f"{r}\n" for r in requirements),
                capture_output=True,
                text=True,
                check=False,
                env=environment(environ),
                timeout=RESOLVE_S,
            )
        except subprocess.TimeoutExpired:
            raise LockError(f"resolving took over {RESOLVE_S} s against {index_url}") from None
    if done.returncode != 0:
        raise LockError(reason(done.stdout + done.stderr, index_url))
    # what the lock leaves out, below the platform (which the host reads first): a lock kept
    # beside the recipe is stale once the recipe leaves out other requirements
    left_out = f"{WITHOUT_HEADER}{', '.join(sorted(without))}\n" if without else ""
    text = f"# platform: {platform.tag}\n{left_out}# index: {index_url}\n{done.stdout}"
    try:
        check_lock(text, requirements)
    except ValueError as exc:
        raise LockError(f"the lock resolved from {index_url} is refused: {exc}") from None
    return text


def cached_lock(
    requirements: list[str],
    without: list[str],
    index_url: str,
    platform: HostPlatform,
    environ: Mapping[str, str],
    *,
    folder: Path | None = None,
) -> str:
    """The lock of the release pinned by ``requirements`` for ``platform``: the one cached in
    ``folder`` (default ``cache_dir``), checked like any other, else resolved and cached."""
    folder = folder or cache_dir(environ)
    path = folder / f"{_key(requirements, without, index_url, platform)}.txt"
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        try:
            check_lock(text, requirements)
        except ValueError as exc:
            raise LockError(f"{path}: the cached lock is refused: {exc}; remove it to resolve again") from None
        return text
    text = resolve(requirements, without, index_url, platform, environ)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return text
