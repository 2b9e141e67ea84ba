"""How kimi-deploy runs uv, on a host (``hostside/venv_install.py``: installs) and on the controller
(``kimi_deploy.releases.lock``: resolutions): its environment, and one line for what it (or pip,
bootstrapping uv) printed when it failed: an index that does not answer, a version it does not
have (with the requirements that led to it, and the versions it has), bytes that do not match a
lock's hash, or uv's own first error line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from kimi_deploy.hostside.boundary_index import project_versions

# How long uv waits for an index that accepted the connection, and how often it tries again: a
# site's own index serves every host of a run at once (64 hosts bootstrapping uv and installing at
# the same moment kept one from answering within 15 s on the local cluster). uv's defaults (30 s,
# 3 retries) and pip's (15 s, 5) are for one machine; an index that refuses connections or answers
# 503 still fails within seconds.
HTTP_TIMEOUT_S = 60
HTTP_RETRIES = 3


def environment(base: Mapping[str, str]) -> dict[str, str]:
    """uv's environment: ``base`` (the caller's: proxies, certificates), never a Python download,
    the timeouts above, no progress bars or colours, and no ``UV_COMPILE_BYTECODE`` (it would have
    uv start a release's interpreter)."""
    return {
        **{name: value for name, value in base.items() if name != "UV_COMPILE_BYTECODE"},
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_HTTP_TIMEOUT": str(HTTP_TIMEOUT_S),
        "UV_HTTP_RETRIES": str(HTTP_RETRIES),
        "UV_NO_PROGRESS": "1",
        "NO_COLOR": "1",
    }


# What uv and pip print when the index did not answer.
_DOWN = re.compile(
    r"503|502|504|Connection refused|tcp connect error|error sending request|timed out|"
    r"Network is unreachable|dns error|Max retries exceeded|Could not fetch URL"
)
_MISSING = (
    re.compile(r"there is no version of ([^\s,\[]+)"),
    re.compile(r"No matching distribution found for (\S+)"),
    re.compile(r"\S+ was not found in the package registry and you require ([^\s,]+),"),
    re.compile(r"(\S+) was not found in the package registry"),
)
# uv's explanation: "... and vllm==0.34.0 depends on flashinfer-python==0.7.3, ..." or, where the
# index has one version, "... and all versions of broken depend on lib==3.0, ..."
_DEPENDS = re.compile(r"(?:all versions of ([A-Za-z0-9][A-Za-z0-9._-]*)|(\S+)) depends? on ([^\s,]+)")
_REQUIRED = re.compile(r"you require ([^\s,]+)")
# "Because msgpack-python==0.5.6 has no usable wheels ...": only source distributions (a release
# installs wheels only: building one would run the index's code)
_WHEELLESS = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)[=<>!~][^\s,]* has no usable wheels")
_SPEC_NAME = re.compile(r"[=<>!~\[;@ ]")


def _name(spec: str) -> str:
    return _SPEC_NAME.split(spec, maxsplit=1)[0].lower().replace("_", "-")


# The most versions a refusal names: those nearest the one asked for.
_SHOWN = 6


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version))


def _nearest(versions: list[str], wanted: str) -> str:
    """``versions`` as a refusal names them: all of a few, else the final releases nearest
    ``wanted`` (``0.7.2, 0.7.2.post1, 0.7.4, ... (116 in all)``)."""
    if len(versions) <= _SHOWN:
        return ", ".join(versions) or "none"
    finals = sorted((v for v in versions if not re.search(r"(a|b|rc|dev)\d*$", v)), key=_release)
    below = [v for v in finals if _release(v) < _release(wanted)][-(_SHOWN // 2) :]
    above = [v for v in finals if _release(v) >= _release(wanted)][: _SHOWN - len(below)]
    return f"{', '.join(below + above)}, ... ({len(versions)} in all)"


def _available(index_url: str, spec: str) -> str | None:
    """The versions of ``spec``'s project the index lists ("none": it lists none); None when the
    index does not answer."""
    project = re.split(r"[=<>!~\[]", spec, maxsplit=1)[0]
    wanted = spec[len(project) :].lstrip("=<>!~ ")
    versions = project_versions(index_url, project)
    return None if versions is None else _nearest(versions, wanted)


def _chain(output: str, spec: str) -> str:
    """``spec`` with the requirements that led to it (``vllm==0.34.0 -> flashinfer-python==0.7.3``),
    as uv explains them (its explanation wraps lines: read as one)."""
    output = " ".join(output.split())
    specs = {_name(m.strip("`'\"")): m.strip("`'\"") for m in _REQUIRED.findall(output)}
    parents: dict[str, str] = {}
    for every, parent, needed in _DEPENDS.findall(output):
        child = needed.strip("`'\"")
        specs.setdefault(_name(child), child)
        parents.setdefault(_name(child), _name(every) if every else parent.strip("`'\""))
    chain = [spec]
    while len(chain) < 8:
        parent = parents.get(_name(chain[0]))
        if parent is None or any(_name(parent) == _name(c) for c in chain):
            break
        # as required ("you require broken==1.0") rather than as uv narrowed it ("broken<=1.0")
        chain.insert(0, specs.get(_name(parent), parent))
    return " -> ".join(chain)


def _no_wheel(output: str, index_url: str) -> str | None:
    """The line for a requirement the index has only source distributions of, if that is why."""
    output = " ".join(output.split())
    wheelless = _WHEELLESS.search(output)
    if wheelless is None:
        return None
    name = _name(wheelless.group(1))
    needed = [c.strip("`'\"") for _, _, c in _DEPENDS.findall(output) if _name(c.strip("`'\"")) == name]
    spec = needed[0] if needed else wheelless.group(1)
    return f"{_chain(output, spec)} has no wheel for this platform on {index_url} (source distributions only)"


def _missing(output: str, index_url: str, spec: str) -> str:
    """The line for a requirement the index has no such version of."""
    spec = spec.strip("`'\"")
    listed = re.search(r"\(from versions: ([^)]*)\)", output)
    # pip reads an index that answers 503 as one listing no versions: ask the index.
    have = _available(index_url, spec)
    if have is None:
        return f"package index {index_url} does not answer"
    return f"{_chain(output, spec)} is not on {index_url} (available: {listed.group(1) if listed else have})"


def reason(output: str, index_url: str) -> str:
    """One line for what uv or pip printed when it failed, given the index it was told to use."""
    if _DOWN.search(output):
        return f"package index {index_url} does not answer"
    wheelless = _no_wheel(output, index_url)
    found = None if wheelless else next((m for m in (p.search(output) for p in _MISSING) if m), None)
    if wheelless or found:
        return wheelless or _missing(output, index_url, found.group(1) if found else "")
    mismatch = re.search(r"Hash mismatch for `?([^`\s]+)", output)
    if mismatch:
        return f"{mismatch.group(1)}: {index_url} serves other bytes than the lock's hash"
    errors = [line.split(":", 1)[-1].strip() for line in output.splitlines() if line.lower().startswith("error")]
    causes = [line.strip().removeprefix("cause: ") for line in output.splitlines() if line.strip().startswith("cause:")]
    if errors:
        return f"{errors[0]}: {causes[-1]}" if causes else errors[0]
    return output.strip().splitlines()[-1] if output.strip() else "uv failed without output"
