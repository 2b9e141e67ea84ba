"""Minimal installable wheels that tests build themselves (PEP 427: a zip with a dist-info folder)."""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Mapping
from pathlib import Path


def pure_wheel(folder: Path, name: str, version: str, extra: Mapping[str, bytes] | None = None) -> Path:
    """An installable pure wheel of ``name`` ``version`` in ``folder``: a package of that name
    and ``extra`` files beside it (a ``.pth``, say), with its METADATA, WHEEL and RECORD."""
    info = f"{name}-{version}.dist-info"
    members = {
        f"{name}/__init__.py": f'__version__ = "{version}"\n'.encode(),
        **(extra or {}),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nA test wheel.\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{p},sha256={hashlib.sha256(d).hexdigest()},{len(d)}\n" for p, d in members.items())
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for member, data in {**members, f"{info}/RECORD": (record + f"{info}/RECORD,,\n").encode()}.items():
            wheel.writestr(member, data)
    out = folder / f"{name}-{version}-py3-none-any.whl"
    out.write_bytes(buffer.getvalue())
    return out
