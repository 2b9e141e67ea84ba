"""How long ``hostside.boundary_json.loads`` takes on 1 MiB texts built to make it slow.

    python bench/boundary_json.py [--mib 1] [--repeat 3]

Decodes a benign host probe answer of ``--mib`` MiB (a state answer's shape: paths, digests,
numbers, nested records) and hostile texts of the same size (runs of escaped quotes, of escaped
backslashes, of bare quotes, of brackets inside and outside strings, alternating quotes and
brackets), each ``--repeat`` times, and prints one line per text: its best time, its verdict
(value or refused) and its ratio to the benign one. A hostile text must take under a second a
MiB: the script exits 1 naming those that do not.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable

from kimi_deploy.hostside.boundary_json import loads


def _benign(size: int) -> str:
    """A state probe's answer of about ``size`` bytes: file digests and release records."""
    files: dict[str, str] = {}
    records: list[dict[str, object]] = []
    i = 0
    while 130 * len(files) + 330 * len(records) < size:
        files[f"/opt/kimi/models/moonshotai/rev/model-{i:05d}-of-02000.safetensors"] = "ab" * 32
        if i % 4 == 0:
            records.append(
                {
                    "record": {"engine": "vllm", "units": {"kimi-vllm": "0" * 16}, "files": [f"/etc/kimi/{i}.env"]},
                    "smoke": {"request": {"messages": [{"role": "user", "content": 'Say "READY" \\ now'}]}},
                    "ok": [True, None, 1.5, [i, [i, [i]]]],
                }
            )
        i += 1
    return json.dumps({"user": True, "files": files, "releases": records})


def _hostile(size: int) -> dict[str, str]:
    half = size // 2
    return {
        "escaped quotes, unterminated": "[" * 40 + '"' + '\\"' * half,
        "escaped quotes in a string": '["' + '\\"' * half + '"]',
        "escaped backslashes, unterminated": "[" * 40 + '"' + "\\\\" * half,
        "bare quotes": "[" * 40 + '"' * size,
        "quote then letter": "[" * 40 + '"a' * half,
        "quote then bracket": '"[' * half,
        "brackets in a string": '["' + "[" * size + '"]',
        "brackets outside": "[" * size,
        "pairs of brackets": "[]" * half,
        "escaped backslash then brackets": '["\\\\", ' + "[" * size,
    }


def _best(decode: Callable[[], object], repeat: int) -> tuple[float, str]:
    best, verdict = float("inf"), ""
    for _ in range(repeat):
        began = time.perf_counter()
        try:
            decode()
            verdict = "value"
        except ValueError as exc:
            verdict = "refused: " + str(exc).split(": ", 1)[1][:40]
        best = min(best, time.perf_counter() - began)
    return best, verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    size = int(args.mib * (1 << 20))
    limit = 2 * size + 1024
    benign = _benign(size)
    base, verdict = _best(functools.partial(loads, benign, "benign", max_bytes=limit), args.repeat)
    print(f"{'benign state answer':36} {len(benign):>9} B {base * 1000:8.1f} ms  1.0x  {verdict}")
    slow = []
    for name, text in _hostile(size).items():
        took, verdict = _best(functools.partial(loads, text, "hostile", max_bytes=limit), args.repeat)
        print(f"{name:36} {len(text):>9} B {took * 1000:8.1f} ms {took / base:4.1f}x  {verdict}")
        if took >= args.mib:
            slow.append(name)
    if slow:
        sys.exit(f"over {args.mib:g} s: {', '.join(slow)}")


if __name__ == "__main__":
    main()
