"""Everything a converge needs to decide, read in one round-trip: prints one JSON line.

Input: one argument, base64 of zlib-compressed JSON:
  {"user": str, "venvs": [dir], "weights": [{"dir": str, "lock": {path: [size, digest]}}] (one per
   checkpoint the host holds: the model, a speculative draft),
   "files": [path], "units": [name], "unit_secrets": {name: [path]}, "unit_files": {name: [path]},
   "timers": [name], "ports": [port],
   "models": [the folder of a checkpoint's revisions], "packages": [Debian package]}
Output: {"user": bool, "venvs": {dir: marker|null}, "weights": {dir: {...}},
         "files": {path: sha256|null (absent)}, "owners": {path: "owner:group:octal mode"|null},
         "units": {name: {..., "secrets_changed": bool, "files_changed": bool, "restarts": int,
                          "restarts_verified": int, "verified": bool}},
         "timers": {name: {...}},
         "revisions": {folder: {"present": [revision], "history": [revision]}},
         "listeners": {port: {"pid", "comm", "unit"}}, "packages": {name: installed},
         "platform": {"python": "3.11", "machine": "x86_64", "libc": "glibc 2.36"},
         "router_drained": [the engines a drain took out of this host's router, not yet put back],
         "contents": {path: {"size", "text", "why"}|null (absent)} (only with "diff": {path: sha256}
          in the request: each of those files that differs, hostside/changed_files.py),
         "compile_caches": {dir: {"manifest", "whole", "given"}} (only with "compile_caches" in the
          request: each unit's compile cache, hostside/compile_cache_found.py)}
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
import time

from kimi_deploy.hostside.changed_files import changed_files
from kimi_deploy.hostside.compile_cache_found import found as compile_caches
from kimi_deploy.hostside.host_dirs import ROUTER_DRAINED, STATE_DIR
from kimi_deploy.hostside.listening import listening
from kimi_deploy.hostside.request import read_request
from kimi_deploy.hostside.shared_queries import blocks, file_sha256, owner_mode

# Names for type checkers only: typing and the answers' types cost every probe ~10 ms to import
# (kimi_deploy/host/command.py leaves this block's hostside modules out of the bundle).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from kimi_deploy.hostside.probe_types import (
        LadderProof,
        Listener,
        ReleaseEntry,
        ReleaseMarker,
        Releases,
        Revisions,
        StateAnswer,
        TimerState,
        UnitState,
        WeightsFound,
    )
    from kimi_deploy.hostside.unit_show import UnitShow


META_DIRS = (".kimi", ".cache")
APPLIED = f"{STATE_DIR}/applied"
# What the probe reads of each service (a timer has no MainPID or NRestarts: systemctl leaves them out).
UNIT_PROPERTIES = "ActiveState,SubState,MainPID,UnitFileState,NRestarts,NeedDaemonReload,StateChangeTimestampMonotonic"


def _marker(path: str) -> ReleaseMarker | None:
    """The release marker of the venv at ``path`` (None: absent or incomplete). A release installed
    with a manifest also gets ``damaged``: None, or how many of its files are missing or of another
    size now, the first three, and whether its lock is intact. Stats only, hashes nothing."""
    try:
        with open(os.path.join(path, ".kimi-release.json"), encoding="utf-8") as f:
            marker = json.load(f)
        if not isinstance(marker, dict):
            return None  # not one this deploy wrote: incomplete
        if not marker.get("manifest"):
            return marker  # type: ignore[return-value]  # written by venv_install.py: a ReleaseMarker
    except (OSError, ValueError):
        return None
    try:
        with open(os.path.join(path, marker["manifest"]), encoding="utf-8") as f:
            files: dict[str, int] = json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError):
        files = {marker["manifest"]: -1}
    bad = _sized_otherwise(path, files)
    lock_intact = ".kimi-lock.txt" in files and ".kimi-lock.txt" not in bad
    marker["damaged"] = {"count": len(bad), "first": bad[:3], "lock_intact": lock_intact} if bad else None
    return marker  # type: ignore[return-value]  # written by venv_install.py: a ReleaseMarker


def _sized_otherwise(path: str, files: dict[str, int]) -> list[str]:
    """The files of ``files`` (relative to ``path``: size) missing under ``path`` or of another
    size (``lstat``). A venv lists thousands: each is looked up from the folder opened once rather
    than from its whole path, which cost a converged host's probe a millisecond more."""
    try:
        folder = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        folder = -1
    bad = []
    try:
        for rel, size in files.items():
            try:
                # a name that is not a plain relative one is looked up as os.path.join makes it
                if folder >= 0 and type(rel) is str and rel and rel[0] != "/":
                    st = os.lstat(rel, dir_fd=folder)
                else:
                    st = os.lstat(os.path.join(path, rel))
                if st.st_size != size:
                    bad.append(rel)
            except OSError:
                bad.append(rel)
    finally:
        if folder >= 0:
            os.close(folder)
    return bad


def _weights(spec: dict[str, Any]) -> WeightsFound:
    """Checks against the verification cache only: stat every file, hash nothing."""
    root = spec["dir"]
    lock: dict[str, list[Any]] = spec["lock"]
    try:
        with open(os.path.join(root, ".kimi", "verify-cache.json"), encoding="utf-8") as f:
            cache: dict[str, list[Any]] = json.load(f)
    except (OSError, ValueError):
        cache = {}
    missing, unverified, unreadable = [], [], []
    closed = _closed_folders(root, lock)
    for rel, (size, sha) in lock.items():
        try:
            st = os.stat(os.path.join(root, rel))
        except OSError:
            missing.append(rel)
            continue
        # a file the engines (their own user) cannot read, or cannot reach through its folders,
        # counts as unverified: the sync gives the file and its folders their modes back
        # (hostside/weights_sync.py)
        readable = stat.S_IMODE(st.st_mode) & 0o444 == 0o444 and not any(
            f in ("", rel) or rel.startswith(f + "/") for f in closed
        )
        if not readable:
            unreadable.append(rel)
        if cache.get(rel) != [st.st_size, st.st_mtime_ns, st.st_ino, sha] or st.st_size != size or not readable:
            unverified.append(rel)
    extra = []
    # Partial downloads a killed run left behind: the sync removes them.
    partials = os.path.join(root, ".cache", "huggingface", "download")
    for dirpath, _, filenames in os.walk(partials):
        extra += [os.path.relpath(os.path.join(dirpath, n), root) for n in filenames if n.endswith(".incomplete")]
    if os.path.isdir(root):
        for dirpath, dirnames, filenames in os.walk(root):
            if dirpath == root:
                dirnames[:] = [d for d in dirnames if d not in META_DIRS]
            for name in filenames:
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                if rel not in lock:
                    extra.append(rel)
    return {
        "exists": os.path.isdir(root),
        "missing": sorted(missing),
        "unverified": sorted(unverified),
        "unreadable": sorted(unreadable),
        "extra": sorted(extra),
    }


def _closed_folders(root: str, lock: dict[str, Any]) -> list[str]:
    """The folders, relative to ``root`` ("" for root and anything above it, up to the model's
    folder), that not every user may list and enter (r-x for all): the engine user reads the
    weights through them."""
    folders = {"", *(os.path.dirname(rel) for rel in lock)}
    for start in list(folders):
        folder = start
        while folder:
            folder = os.path.dirname(folder)
            folders.add(folder)
    closed = []
    for rel in sorted(folders):
        paths = [os.path.join(root, rel)] if rel else [root, os.path.dirname(root)]
        for path in paths:
            try:
                if stat.S_IMODE(os.stat(path).st_mode) & 0o555 != 0o555:
                    closed.append(rel)
                    break
            except OSError:
                continue
    # "" stands for every file
    return [""] if "" in closed else closed


def _show(units: list[str], props: str) -> list[dict[str, str]]:
    """``systemctl show -p <props> <units>``: one block of properties per unit."""
    show = subprocess.run(["systemctl", "show", "-p", props, *units], capture_output=True, text=True, check=False)
    return blocks(show.stdout)


def _shown(units: list[str], props: str, shown: UnitShow | None = None) -> dict[str, dict[str, str]]:
    """The properties named in ``props`` (comma-separated) of every unit of ``units`` (full
    names), from one systemctl, its blocks told apart by their ``Id``; a unit whose block did not
    come back under its own name (an alias shows as its target) is asked alone. ``shown``: the
    host probe's one ``systemctl show``, which answers the first when it can (hostside/unit_show.py)."""
    said = shown.answer(["Id", *props.split(",")], units) if shown is not None and units else None
    listed = blocks(said) if said is not None else _show(units, f"Id,{props}") if units else []
    found = {block["Id"]: block for block in listed if block.get("Id") in units}
    for unit in units:
        if unit not in found:
            found[unit] = _show([unit], props)[0]
    return found


def _written_since(paths: list[str], marker: str) -> bool:
    """Whether a file the unit reads was written after the deploy last (re)started it (the unit's
    applied marker, written right after the start): a converge that stopped between writing it
    and the restart, or a hand that changed it, restarted the unit and put it back, left the
    unit running with another. Its content's time (mtime): an owner or mode put back changes
    nothing the unit read."""
    try:
        started = os.stat(marker).st_mtime_ns
    except OSError:
        return False  # never started by a deploy: it starts anyway
    for path in paths:
        try:
            if os.stat(path).st_mtime_ns > started:
                return True
        except OSError:
            continue  # absent: the converge writes it, and restarts the unit for that
    return False


def _since(props: dict[str, str]) -> float | None:
    """When the unit entered its state (ActiveState), as the host's clock (seconds since the
    epoch); None when systemd has no time for it (a unit that never changed state since boot).
    systemd keeps the monotonic time, on every systemd: the wall time of it is now's less the
    monotonic time gone since."""
    text = props.get("StateChangeTimestampMonotonic", "")
    if not text.isdigit() or int(text) == 0:
        return None
    return round(time.time() - (time.monotonic() - int(text) / 1e6), 1)


def _restarts_verified(marker: str) -> tuple[bool, int, float | None]:
    """Whether a smoke test found the unit serving since the deploy last (re)started it, the
    restarts of systemd's that the test saw, and how long the unit was without service before it
    answered (``<marker>.restarts``, "RESTARTS [DOWN_S]", written by hostside/smoke.py once the unit
    answers; absent or older than the start: not yet, none). A unit started by a converge that died
    before its smoke test is running but not verified: still starting."""
    try:
        if os.stat(f"{marker}.restarts").st_mtime_ns < os.stat(marker).st_mtime_ns:
            return False, 0, None
        with open(f"{marker}.restarts", encoding="utf-8") as f:
            words = f.read(40).split()
    except OSError:
        return False, 0, None
    restarts = int(words[0]) if words and words[0].isdigit() else 0
    try:
        down_s = float(words[1]) if len(words) > 1 else None
    except ValueError:
        down_s = None
    return True, restarts, down_s


def _units(
    names: list[str],
    shown: dict[str, dict[str, str]],
    secrets: dict[str, list[str]] | None = None,
    files: dict[str, list[str]] | None = None,
) -> dict[str, UnitState]:
    out: dict[str, UnitState] = {}
    for name in names:
        props = shown.get(f"{name}.service", {})
        restarts = props.get("NRestarts", "")
        marker = os.path.join(APPLIED, name)
        try:
            with open(marker, encoding="utf-8") as f:
                applied = f.read().strip()
        except OSError:
            applied = None
        verified, restarts_verified, down_s = _restarts_verified(marker)
        out[name] = {
            "active": props.get("ActiveState", ""),
            "sub": props.get("SubState", ""),
            "since": _since(props),
            "pid": int(props.get("MainPID", "0") or 0),
            "enabled": props.get("UnitFileState", ""),
            "applied": applied,
            "secrets_changed": _written_since((secrets or {}).get(name, []), marker),
            # systemd's own word (the unit file changed since it last loaded it) or the files' times
            "files_changed": props.get("NeedDaemonReload") == "yes"
            or _written_since((files or {}).get(name, []), marker),
            "needs_reload": props.get("NeedDaemonReload") == "yes",
            "restarts": int(restarts) if restarts.isdigit() else 0,
            "restarts_verified": restarts_verified,
            "verified": verified,
            "down_s": down_s,
            "context": _context(marker),
        }
    return out


def _context(marker: str) -> int | None:
    """The context length the context ladder last started the unit with (``<marker>.context``,
    hostside/ladder.py's); None when none, or when the unit was started since without it."""
    try:
        if os.stat(f"{marker}.context").st_mtime_ns < os.stat(marker).st_mtime_ns:
            return None
        with open(f"{marker}.context", encoding="utf-8") as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _ladder(path: str = f"{STATE_DIR}/ladder.json", last: int = 200) -> list[LadderProof]:
    """The context ladder's proofs on this host (hostside/ladder.py's), the last ``last``: each
    rung's key, rung and whether it passed."""
    try:
        with open(path, encoding="utf-8") as f:
            proofs = json.load(f).get("proofs")
    except (OSError, ValueError, AttributeError):
        return []
    if not isinstance(proofs, list):
        return []
    return [
        {"key": p.get("key"), "unit": p.get("unit"), "rung": p.get("rung"), "passed": p.get("passed")}
        for p in proofs[-last:]
        if isinstance(p, dict)
    ]


def _watchdog(path: str = f"{STATE_DIR}/watchdog.json", most: int = 1 << 20) -> dict[str, Any] | None:
    """The watchdog's state file (hostside/watchdog.py's) as it wrote it, None without one; the
    controller checks it (``kimi_deploy.serving.watchdog_report``)."""
    try:
        with open(path, "rb") as f:
            found = json.loads(f.read(most))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _release_log(path: str = f"{STATE_DIR}/releases.log", last: int = 200, most: int = 1 << 20) -> list[list[str]]:
    """The release log's last entries, oldest first: [time, release dir, outcome, run id] (outcome
    and run id "" in entries written before they were recorded); its last ``most`` bytes read."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - most))
            text = f.read(most).decode("utf-8", errors="replace")
    except OSError:
        return []
    # a read that began inside the log begins inside a line: that one goes
    lines = text.splitlines()[1 if size > most else 0 :][-last:]
    return [[*parts, "", ""][:4] for parts in (line.split() for line in lines) if len(parts) >= 2]


def _record(folder: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(folder, "release.json"), encoding="utf-8") as f:
            record: dict[str, Any] = json.load(f)
            return record
    except (OSError, ValueError):
        return None


def _kept(folder: str, name: str, most: int = 1 << 20) -> dict[str, Any] | None:
    """A record kept in the release's folder, as the host holds it: the serving benchmark's figures
    (``bench.json``, hostside/bench_record.py's) or a converge's cold start (``cold-start.json``,
    hostside/cold_start_record.py's); None without."""
    try:
        with open(os.path.join(folder, name), "rb") as f:
            found = json.loads(f.read(most))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _served(record: dict[str, Any] | None) -> dict[str, Any]:
    """The checkpoints a release record served, by link (``{"model": {"repo", "revision"}}``); a
    record older than ``checkpoints`` served its model only."""
    record = record or {}
    found = record.get("checkpoints")
    if isinstance(found, dict):
        return found
    revision = record.get("revision")
    return {"model": {"repo": record.get("model"), "revision": revision}} if revision else {}


def _revisions(parent: str, log: list[list[str]]) -> Revisions:
    """Revision folders kimi-deploy made under ``parent`` (they hold ``.kimi``), and the revision of
    that checkpoint (the folder's name is its repository's, ``org--name``) in each release the host
    switched to, oldest first (the release log, last 100)."""
    try:
        present = sorted(n for n in os.listdir(parent) if os.path.isdir(os.path.join(parent, n, ".kimi")))
    except OSError:
        present = []
    name = os.path.basename(parent.rstrip("/"))
    records = {folder: _record(folder) for folder in {entry[1] for entry in log[-100:]}}
    history = [
        c["revision"]
        for entry in log[-100:]
        for c in _served(records[entry[1]]).values()
        if isinstance(c, dict) and c.get("revision") and str(c.get("repo") or "").replace("/", "--") == name
    ]
    return {"present": present, "history": history}


def _timers(names: list[str], shown: dict[str, dict[str, str]]) -> dict[str, TimerState]:
    out: dict[str, TimerState] = {}
    for name in names:
        props = shown.get(f"{name}.timer", {})
        out[name] = {"active": props.get("ActiveState", ""), "enabled": props.get("UnitFileState", "")}
    return out


def _listeners(ports: list[int], likely: list[str]) -> dict[str, Listener]:
    """Who listens on each of ``ports`` (TCP, any address): pid, command and systemd unit. The
    processes of ``likely`` (the units' main pids) are looked at first, and the rest of /proc only
    for a socket they do not hold: on a converged host, each of its units holds its own port, and
    reading every process's file descriptors cost the probe more than all the rest of its state."""
    wanted = set(ports)
    inodes = listening(wanted) if wanted else {}
    if inodes is None:
        inodes = {}
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(table, encoding="ascii") as f:
                    next(f)
                    for line in f:
                        fields = line.split()
                        port = int(fields[1].rsplit(":", 1)[1], 16)
                        if fields[3] == "0A" and port in wanted:  # 0A: LISTEN
                            inodes[fields[9]] = port
            except OSError:
                continue
    found: dict[str, Listener] = {}
    if not inodes:
        return found
    first = [p for p in dict.fromkeys(likely) if p.isdigit() and p != "0"]
    for pid in [*first, *(p for p in os.listdir("/proc") if p.isdigit() and p not in first)]:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            inode = target[8:-1] if target.startswith("socket:[") else None
            if inode in inodes:
                port = inodes.pop(inode)
                found[str(port)] = {"pid": int(pid), "comm": _read(f"/proc/{pid}/comm"), "unit": _unit_of(pid)}
        if not inodes:
            break
    return found


def _packages(names: list[str]) -> dict[str, bool]:
    """Whether each Debian package is installed (dpkg's status "ii")."""
    if not names:
        return {}
    found = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package}\t${db:Status-Abbrev}\n", *names],
        capture_output=True,
        text=True,
        check=False,
    )
    installed = {line.split("\t")[0] for line in found.stdout.splitlines() if line.split("\t")[1:2] == ["ii "]}
    return {name: name in installed for name in names}


def _readlink(path: str | None) -> str | None:
    try:
        return os.readlink(path) if path else None
    except OSError:
        return None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def _unit_of(pid: str) -> str:
    for line in _read(f"/proc/{pid}/cgroup").splitlines():
        for part in line.rsplit(":", 1)[-1].split("/"):
            if part.endswith(".service"):
                return part[: -len(".service")]
    return ""


def _releases(log: list[list[str]]) -> Releases:
    """The release log's entries and, for each release named there, its record and whether what
    it links to is still whole: the engine venv (its marker, undamaged), the weights revision (its
    verification cache) and the copies of its files."""
    records: dict[str, ReleaseEntry | None] = {}
    for _, folder, _, _ in log:
        if folder in records:
            continue
        record = _record(folder)
        if record is None:
            records[folder] = None
            continue
        # every checkpoint it links (the model, a draft): whole while its verification cache is there
        links = [os.path.join(folder, link) for link in _served(record) or {"model": None}]
        linked = [link for link in links if os.path.lexists(link)]
        records[folder] = {
            "record": record,
            "engine": (marker := _marker(os.path.join(folder, "engine"))) is not None and not marker.get("damaged"),
            "model": all(os.path.isfile(os.path.join(link, ".kimi", "verify-cache.json")) for link in linked)
            if linked
            else None,
            "files": all(os.path.isfile(os.path.join(folder, "files", p.lstrip("/"))) for p in record.get("files", [])),
            "bench": _kept(folder, "bench.json"),
            "cold_start": _kept(folder, "cold-start.json"),
        }
    return {"entries": log, "records": records}


class Asked:
    """What the state part reads before anything else: the release log (once: the revisions'
    history, the last entry, the rollback's records), the releases when asked, and the units and
    timers it asks systemd about (``units``: their full names), which the host probe asks in the
    same ``systemctl show`` as its other parts' (hostside/host_probe.py)."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.log = _release_log()
        self.releases = _releases(self.log) if request.get("releases") else None
        names = list(request.get("units", []))
        for entry in (self.releases["records"] if self.releases else {}).values():
            names += [n for n in (entry["record"].get("units") or {} if entry else {}) if n not in names]
        self.names = names
        self.timers = list(request.get("timers", []))
        self.units = [f"{n}.service" for n in names] + [f"{n}.timer" for n in self.timers]


def probe(request: dict[str, Any], asked: Asked | None = None, shown: UnitShow | None = None) -> StateAnswer:
    """The converge state ``request`` asks for (``facts.host_state``). ``asked``: its ``Asked``,
    read already; ``shown``: the host probe's one ``systemctl show`` (hostside/unit_show.py)."""
    try:
        pwd.getpwnam(request["user"])
        user = True
    except KeyError:
        user = False
    asked = asked or Asked(request)
    log, releases, names, timers = asked.log, asked.releases, asked.names, asked.timers
    # One systemctl for the services and the timers: the probe's largest cost after Python itself.
    shown_units = _shown(asked.units, UNIT_PROPERTIES, shown)
    main_pids = [props.get("MainPID", "") for props in shown_units.values()]
    result: StateAnswer = {
        "user": user,
        "venvs": {d: _marker(d) for d in request.get("venvs", [])},
        "weights": {w["dir"]: _weights(w) for w in request.get("weights") or []},
        "files": {p: file_sha256(p) for p in request.get("files", [])},
        "owners": {p: owner_mode(p) for p in request.get("files", [])},
        "units": _units(names, shown_units, request.get("unit_secrets"), request.get("unit_files")),
        "timers": _timers(timers, shown_units),
        "revisions": {parent: _revisions(parent, log) for parent in request.get("models") or []},
        "listeners": _listeners([int(p) for p in request.get("ports", [])], main_pids),
        "packages": _packages(request.get("packages", [])),
        "current": _readlink(request.get("link")),
        # [time, release dir, outcome] of the log's last entry
        "last_release": log[-1][:3] if log else None,
        "releases": releases,
        "ladder": _ladder(),
        "watchdog": _watchdog(),
        "platform": _platform(),
        "router_drained": _router_drained(bool(request.get("router"))),
    }
    if request.get("diff"):
        result["contents"] = changed_files(request["diff"])
    if request.get("compile_caches"):
        result["compile_caches"] = compile_caches(request["compile_caches"])
    return result


def _router_drained(asked: bool, path: str = ROUTER_DRAINED, most: int = 1 << 20) -> list[str]:
    """The engines a drain took out of this host's router and did not put back
    (``hostside/router_drain.py`` keeps them in ``path`` between the two): a converge that stopped
    in between left them out. Empty when not asked (no router that drains here) or none."""
    if not asked:
        return []
    try:
        with open(path, "rb") as f:
            found = json.loads(f.read(most))
    except (OSError, ValueError):
        return []
    return [u for u in found if isinstance(u, str)] if isinstance(found, list) else []


def _platform() -> dict[str, str]:
    """What this host's releases are built for: the Python that makes their venvs (this one:
    ``hostside/venv_install.py`` runs under the same ``python3``), the machine and the C library
    (the controller resolves their locks for it: ``kimi_deploy.releases.lock``)."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc = ""
    return {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "machine": os.uname().machine,
        "libc": libc,
    }


def main() -> None:
    print(json.dumps(probe(read_request()), sort_keys=True))


if __name__ == "__main__":
    main()
