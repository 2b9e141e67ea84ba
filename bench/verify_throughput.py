"""How fast the host-side verifier hashes weights, against sha256sum and the machine's ceiling.

    python bench/verify_throughput.py [--gib 2] [--dir /var/tmp]

Writes 96 shards totalling ``--gib`` GiB of random bytes, then, in the same run and on the same
files (page cache warm for all), times: hostside/weights_sync.py's verification (threads, one per
core), coreutils ``sha256sum`` over the same files, and hashlib on one core times the core count
(the ceiling). Then the cached re-verify of the 96 unchanged shards (target < 0.5 s). Prints the
figures and ratios; deletes the files.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHARDS = 96


def _load_sync() -> Any:
    spec = importlib.util.spec_from_file_location("weights_sync", ROOT / "kimi_deploy" / "hostside" / "weights_sync.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where to write the shards")
    args = parser.parse_args()
    sync = _load_sync()
    cores = os.cpu_count() or 1
    size = int(args.gib * 2**30) // SHARDS
    work = Path(tempfile.mkdtemp(prefix="kimi-verify-bench-", dir=args.dir))
    try:
        block = os.urandom(1 << 20)
        lock: dict[str, list[Any]] = {}
        for i in range(1, SHARDS + 1):
            name = f"model-{i:05d}-of-{SHARDS:05d}.safetensors"
            with open(work / name, "wb") as f:
                for _ in range(size // len(block)):
                    f.write(block)
                f.write(block[: size % len(block)])
            lock[name] = [size, ""]
        total = size * SHARDS
        paths = [str(work / n) for n in lock]
        for p in paths:  # warm the page cache so every method reads from memory alike
            with open(p, "rb") as f:
                while f.read(8 << 20):
                    pass
        started = time.perf_counter()
        with open(paths[0], "rb") as f:
            hashlib.file_digest(f, "sha256")
        one_core = size / (time.perf_counter() - started)
        for name, entry in lock.items():
            entry[1] = sync._hash(str(work / name), "sha256", size)
        cache: dict[str, list[Any]] = {}
        started = time.perf_counter()
        bad = sync._verify(str(work), lock, cache, cores)
        ours = time.perf_counter() - started
        assert bad == [], bad
        started = time.perf_counter()
        subprocess.run(["sha256sum", *paths], check=True, capture_output=True)
        coreutils = time.perf_counter() - started
        started = time.perf_counter()
        bad = sync._verify(str(work), lock, cache, cores)
        cached = time.perf_counter() - started
        assert bad == [], bad
        gb = total / 1e9
        print(f"{SHARDS} shards, {gb:.2f} GB, {cores} cores, page cache warm")
        print(f"verifier (threads):       {ours:6.2f} s  {gb / ours:5.2f} GB/s")
        print(f"sha256sum:                {coreutils:6.2f} s  {gb / coreutils:5.2f} GB/s")
        print(f"hashlib 1 core x {cores}:      {'':6}    {one_core * cores / 1e9:5.2f} GB/s (ceiling)")
        ceiling = one_core * cores / 1e9
        print(f"ratio verifier / sha256sum: {coreutils / ours:.2f}x; verifier / ceiling: {gb / ours / ceiling:.2f}")
        print(f"cached re-verify of {SHARDS} unchanged shards: {cached * 1000:.1f} ms (target < 500 ms)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
