"""The host's current release: one symlink, switched atomically, naming what runs."""

from __future__ import annotations

import json
import shlex
from collections.abc import Generator
from typing import Any

from pyinfra.api.operation import operation
from pyinfra.context import host


@operation()
def current(
    *, link: str, release_dir: str, record: dict[str, Any], links: dict[str, str], found: str | None
) -> Generator[str, None, None]:
    """
    Point ``link`` (``/opt/kimi/current``) at ``release_dir``, which records this release.

    + link: the ``current`` symlink
    + release_dir: ``/opt/kimi/releases/<id>``, the id a digest of everything the release runs
    + record: what ``release.json`` in it says (engine, weights revision, unit digests)
    + links: names in ``release_dir`` -> what they point to (``engine``, ``model``)
    + found: where ``link`` points now (from the host probe)

    A release folder is written once; switching is a rename of a new symlink over the old one,
    so ``link`` always names a complete release. The switch is appended to the host's release log.
    """
    if found == release_dir:
        host.noop(f"{link} is {release_dir}")
        return
    q = shlex.quote
    steps = [f"install -d -m 0755 {q(release_dir)}"]
    steps += [f"ln -sfn {q(target)} {q(release_dir)}/{q(name)}" for name, target in sorted(links.items())]
    text = json.dumps(record, sort_keys=True)
    steps += [
        f"printf '%s\\n' {q(text)} > {q(release_dir)}/release.json",
        f"ln -sfn {q(release_dir)} {q(link)}.new",
        f"mv -T {q(link)}.new {q(link)}",
        "install -d -m 0755 /var/lib/kimi",
        f"printf '%s %s\\n' \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\" {q(release_dir)} >> /var/lib/kimi/releases.log",
    ]
    yield " && ".join(steps)
