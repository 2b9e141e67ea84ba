"""Minimal installable wheels that tests build themselves (PEP 427: a zip with a dist-info folder)."""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path


def pure_wheel(
    folder: Path,
    name: str,
    version: str,
    extra: Mapping[str, bytes] | None = None,
    *,
    requires: Sequence[str] = (),
    tag: str = "py3-none-any",
) -> Path:
    """An installable wheel of ``name`` ``version`` in ``folder``: a package of that name and
    ``extra`` files beside it (a ``.pth``, say), with its METADATA (``requires``: its
    Requires-Dist), WHEEL (``tag``: its compatibility tag) and RECORD."""
    info = f"{name}-{version}.dist-info"
    needs = "".join(f"Requires-Dist: {r}\n" for r in requires)
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{needs}\nA test wheel.\n"
    members = {
        f"{name}/__init__.py": f'__version__ = "{version}"\n'.encode(),
        **(extra or {}),
        f"{info}/METADATA": meta.encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n".encode(),
    }
    record = "".join(f"{p},sha256={hashlib.sha256(d).hexdigest()},{len(d)}\n" for p, d in members.items())
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for member, data in {**members, f"{info}/RECORD": (record + f"{info}/RECORD,,\n").encode()}.items():
            wheel.writestr(member, data)
    out = folder / f"{name}-{version}-{tag}.whl"
    out.write_bytes(buffer.getvalue())
    return out
