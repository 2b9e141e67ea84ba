"""Package lock texts that come from another host: what a lock may hold, and the pins it holds.

Stdlib only: the host program that installs a release (``hostside/venv_install.py``) and the
controller (``kimi_deploy/releases/venv_lock.py``) both check a lock with this module before it is written
or handed to uv. A lock is what ``uv pip compile --generate-hashes --no-header --no-annotate``
writes, below the project's own ``# platform:``/``# index:`` header::

    # platform: cp311-x86_64
    # index: https://pypi.org/simple
    idna==3.20 \\
        --hash=sha256:a7db850025b95ded1eae8a46181a1a6c56c92c96f0e2b005d9ff8dc0210cab44 \\
        --hash=sha256:ab7ae7122974553370f0bdb919e1a960b2cd1bc1ef0276416d896db81c14582c

uv writes neither options nor URLs nor extras nor markers in such a lock (it resolves for the one
host it runs on), so a lock holding one was not written by uv: every requirement line a pip-style
installer reads as an option (``-e``, ``--index-url``, ``-r``), a direct reference (``pkg @
file:///...``, ``git+https://...``) or a line without hashes would let the host that wrote it choose
code that an install runs as root. Each refusal is one line, ``ValueError("line N: <what>:
<rule>")``, or names the recipe's requirement the lock does not pin at its version.
"""

from __future__ import annotations

import re

from kimi_deploy.hostside.boundary_text import shown

# PEP 508 names; versions as PEP 440 spells them (a release, pre/post/dev parts, a local label).
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_VERSION = r"[0-9][A-Za-z0-9.!+_-]*"
_PIN = re.compile(rf"({_NAME})==({_VERSION})")
_HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")
_PRINTABLE = re.compile(r"[\x20-\x7e]*")
_RULE = "a lock holds only name==version lines, each with --hash=sha256:<64 hex>"


def is_name(value: object) -> bool:
    """Whether ``value`` is a package name as a lock line spells it (PEP 508)."""
    return isinstance(value, str) and len(value) <= 100 and re.fullmatch(_NAME, value) is not None


def normalize(name: str) -> str:
    """A project name as PEP 503 compares it (``Fast_SafeTensors`` -> ``fast-safetensors``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _what(entry: str) -> str:
    """What a requirement entry that is not a pin is, in the words of the rule it breaks."""
    if entry.startswith("--hash"):
        return "not a --hash=sha256:<64 hex> of a pin"
    if entry.startswith("-"):
        return "an option"
    if "://" in entry or "@" in entry or entry.startswith(("git+", "file:", "/", ".")):
        return "a direct reference (URL or path)"
    if ";" in entry:
        return "an environment marker"
    if "[" in entry:
        return "extras"
    return "not a name==version pin"


def _entries(text: str) -> list[tuple[int, str]]:
    """The lock's requirement entries with the number of the line each starts on: a line ending
    in a backslash continues on the next, as uv writes each pin with its hashes."""
    entries: list[tuple[int, str]] = []
    parts: list[str]
    start, parts = 0, []
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, 1):
        if not _PRINTABLE.fullmatch(line):
            bad = next(c for c in line if not _PRINTABLE.fullmatch(c))
            raise ValueError(f"line {number}: character {ord(bad):#04x}: a lock holds printable ASCII only")
        if not parts:
            if line.strip() == "":
                continue
            if line.startswith("#"):
                # A requirements file continues a line ending in a backslash even in a comment.
                if line.endswith("\\"):
                    raise ValueError(f"line {number}: a comment continued on the next line: {_RULE}")
                continue
            start = number
        elif line.strip() == "" or line.lstrip().startswith("#"):
            raise ValueError(f"line {start}: {shown(' '.join(parts))} continues into line {number}: {_RULE}")
        parts.append(line.removesuffix("\\").strip())
        if not line.endswith("\\"):
            entries.append((start, " ".join(p for p in parts if p)))
            parts = []
    if parts:
        raise ValueError(f"line {start}: {shown(' '.join(parts))} continues past the end of the lock: {_RULE}")
    return entries


def lock_pins(text: str) -> dict[str, str]:
    """``{normalized name: version}`` of a lock text; ``ValueError`` naming the line and the rule
    when the text holds anything but comments, blank lines and hashed ``name==version`` pins."""
    pins: dict[str, str] = {}
    for number, entry in _entries(text):
        first, *rest = entry.split()
        pin = _PIN.fullmatch(first)
        if pin is None:
            raise ValueError(f"line {number}: {shown(entry)}: {_what(entry)}: {_RULE}")
        for token in rest:
            if not _HASH.fullmatch(token):
                raise ValueError(f"line {number}: {shown(token)} after {first}: {_what(token)}: {_RULE}")
        if not rest:
            raise ValueError(f"line {number}: {first} carries no --hash=sha256: {_RULE}")
        name = normalize(pin.group(1))
        if name in pins:
            raise ValueError(f"line {number}: {first}: {name} is pinned twice: {_RULE}")
        pins[name] = pin.group(2)
    if not pins:
        raise ValueError(f"line 1: the lock pins no package: {_RULE}")
    return pins


def freeze_pins(text: str) -> dict[str, str]:
    """``{normalized name: version}`` of ``uv pip freeze`` output; ``ValueError`` for any line that
    is not ``name==version`` (an editable or a direct-URL install is never what a lock asks for)."""
    pins: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        pin = _PIN.fullmatch(line.strip())
        if pin is None:
            raise ValueError(f"line {number}: {shown(line)}: {_what(line.strip())}")
        pins[normalize(pin.group(1))] = pin.group(2)
    return pins


# PEP 440's own pattern (as ``packaging`` spells it), for the canonical form of a version.
_PEP440 = re.compile(
    r"v?(?:(?P<epoch>[0-9]+)!)?(?P<release>[0-9]+(?:\.[0-9]+)*)"
    r"(?:[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>[0-9]+)?)?"
    r"(?:-(?P<post_n1>[0-9]+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?)?"
    r"(?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?"
    r"(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?",
)
_PRE = {"alpha": "a", "beta": "b", "c": "rc", "pre": "rc", "preview": "rc"}
# The most of an installed distribution's METADATA read: its headers come first and are short; the
# rest is its description, which may be megabytes.
METADATA_MAX_BYTES = 64 << 10


def canonical_version(version: str) -> str | None:
    """``version`` in PEP 440's normalized spelling (``1.0-RC1`` -> ``1.0rc1``, ``2.13.0+CPU`` ->
    ``2.13.0+cpu``), as uv writes a lock; None when it is no PEP 440 version."""
    found = _PEP440.fullmatch(version.strip().lower())
    if found is None:
        return None
    out = f"{int(found['epoch'])}!" if found["epoch"] and int(found["epoch"]) else ""
    out += ".".join(str(int(part)) for part in found["release"].split("."))
    if found["pre_l"]:
        out += f"{_PRE.get(found['pre_l'], found['pre_l'])}{int(found['pre_n'] or 0)}"
    if found["post_n1"] or found["post_l"]:
        out += f".post{int(found['post_n1'] or found['post_n2'] or 0)}"
    if found["dev_l"]:
        out += f".dev{int(found['dev_n'] or 0)}"
    if found["local"]:
        out += "+" + ".".join(str(int(p)) if p.isdigit() else p for p in re.split(r"[-_.]", found["local"]))
    return out


def metadata_pin(head: str) -> tuple[str, str]:
    """``(normalized name, canonical version)`` of an installed distribution, from the ``Name:`` and
    ``Version:`` headers of its METADATA (``head``: its start, up to ``METADATA_MAX_BYTES``; headers
    end at the first blank line). ``ValueError`` in one line when either header is missing, given
    twice, or not a name or version as a lock spells them."""
    found: dict[str, str] = {}
    for raw in head.split("\n"):
        line = raw.removesuffix("\r")
        if not line:
            break
        key, colon, value = line.partition(":")
        if colon and key.lower() in ("name", "version"):
            if key.lower() in found:
                raise ValueError(f"{key.capitalize()}: given twice")
            found[key.lower()] = value.strip()
    name, version = found.get("name"), found.get("version")
    if name is None or version is None:
        missing = "Name" if name is None else "Version"
        raise ValueError(f"no {missing}: header in its first {METADATA_MAX_BYTES} bytes")
    if not is_name(name):
        raise ValueError(f"Name: {shown(name)}: not a package name")
    canonical = canonical_version(version) if len(version) <= 100 else None
    if canonical is None or not re.fullmatch(_VERSION, canonical):
        raise ValueError(f"Version: {shown(version)}: not a PEP 440 version")
    return normalize(name), canonical


def _same_version(pinned: str, wanted: str) -> bool:
    """Whether ``pinned`` satisfies ``==wanted`` as PEP 440 reads it: release segments padded
    with zeros (2.4 is 2.4.0), and a local label (``+cpu``) free when ``wanted`` names none."""

    def parts(version: str) -> tuple[tuple[int, ...], str, str | None]:
        public, plus, local = version.lower().partition("+")
        found = re.fullmatch(r"([0-9]+(?:\.[0-9]+)*)(.*)", public)
        release = [int(part) for part in found.group(1).split(".")] if found else []
        while len(release) > 1 and release[-1] == 0:
            release.pop()
        return tuple(release), found.group(2) if found else public, local if plus else None

    have, want = parts(pinned), parts(wanted)
    return have[:2] == want[:2] and want[2] in (None, have[2])


def check_lock(text: str, requirements: list[str]) -> dict[str, str]:
    """The pins of a lock text (``lock_pins``) that pins every ``name==version`` of
    ``requirements`` (the recipe's) at that version; ``ValueError`` in one line otherwise."""
    pins = lock_pins(text)
    for requirement in requirements:
        wanted = _PIN.fullmatch(requirement.strip())
        if wanted is None:
            raise ValueError(f"requirement {shown(requirement)} is not a name==version pin")
        name, version = normalize(wanted.group(1)), wanted.group(2)
        if name not in pins:
            raise ValueError(f"the lock does not pin {requirement} (it pins {', '.join(sorted(pins))})")
        if not _same_version(pins[name], version):
            raise ValueError(f"the lock pins {name}=={pins[name]}, the recipe {requirement}")
    return pins
