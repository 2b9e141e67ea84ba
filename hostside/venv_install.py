"""Install one pinned release into a fresh virtual environment: prints one line, JSON.

Input: one argument, base64 of zlib-compressed JSON: {"path", "requirements", "index_url",
"marker"}. The folder is rebuilt from scratch; the marker (``.kimi-release.json``) is written
last, so its presence means a complete install. On failure the half-made folder is removed and
the reason is one line (exit 1): a version missing from the index, an index that does not answer.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import zlib
from typing import Any
from urllib.parse import urlparse


def _reason(output: str, index_url: str) -> str:
    missing = re.search(r"No matching distribution found for (\S+)", output)
    if missing:
        versions = re.search(r"\(from versions: ([^)]*)\)", output)
        have = versions.group(1) if versions else "none"
        return f"{missing.group(1)} is not on {index_url} (available: {have})"
    if re.search(r"Max retries exceeded|Connection refused|Could not fetch URL|503|Network is unreachable", output):
        return f"package index {index_url} does not answer"
    lines = [line for line in output.splitlines() if line.startswith("ERROR")] or output.splitlines()[-1:]
    return lines[0] if lines else "pip failed without output"


def _fail(path: str, message: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    print(json.dumps({"ok": False, "error": message}))
    print(f"kimi-deploy: {message}", file=sys.stderr)
    sys.exit(1)


def main() -> None:
    req: dict[str, Any] = json.loads(zlib.decompress(base64.b64decode(sys.argv[1])))
    path, index_url = req["path"], req["index_url"]
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    venv = subprocess.run([sys.executable, "-m", "venv", path], capture_output=True, text=True, check=False)
    if venv.returncode != 0:
        _fail(path, f"python3 -m venv {path} failed: {(venv.stderr or venv.stdout).strip().splitlines()[-1:]}")
    pip = [f"{path}/bin/pip", "install", "--no-cache-dir", "--disable-pip-version-check", "--no-input"]
    pip += ["--retries", "1", "--timeout", "15", "--index-url", index_url]
    host = urlparse(index_url).hostname
    if urlparse(index_url).scheme == "http" and host:
        pip += ["--trusted-host", host]
    install = subprocess.run([*pip, *req["requirements"]], capture_output=True, text=True, check=False)
    if install.returncode != 0:
        _fail(path, _reason(install.stdout + install.stderr, index_url))
    freeze = subprocess.run([f"{path}/bin/pip", "freeze", "--all"], capture_output=True, text=True, check=True)
    with open(os.path.join(path, ".kimi-freeze.txt"), "w", encoding="utf-8") as f:
        f.write(freeze.stdout)
    tmp = os.path.join(path, ".kimi-release.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(req["marker"], f, sort_keys=True)
    os.replace(tmp, os.path.join(path, ".kimi-release.json"))
    print(json.dumps({"ok": True, "path": path, "packages": len(freeze.stdout.splitlines())}))


if __name__ == "__main__":
    main()
