"""Debian's Prometheus (the ``prometheus`` package, 2.42 on Debian 12), run by a test on loopback.

It scrapes the targets it is given every second into a data folder of the test's own, and answers
PromQL through its HTTP API (``GET /api/v1/query``, prometheus.io/docs/prometheus/latest/querying/api:
``{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {...}, "value":
[<time>, "<value>"]}]}}``). The binary is Debian's; nothing here stands in for it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

BINARY = "/usr/bin/prometheus"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """``prometheus`` scraping ``targets`` (``host:port``) as job ``job`` until ``close``."""

    def __init__(self, folder: Path, targets: list[str], job: str = "node") -> None:
        folder.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.log = (folder / "prometheus.log").open("w", encoding="utf-8")
        self.process = subprocess.Popen(
            [
                BINARY,
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    said = (folder / "prometheus.log").read_text(encoding="utf-8")[-2000:]
                    raise RuntimeError(f"prometheus did not start: {said}") from None
                time.sleep(0.3)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector ``promql`` evaluates to now."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=10) as answer:
            found = json.loads(answer.read())
        assert found["status"] == "success", found
        result: list[dict[str, Any]] = found["data"]["result"]
        return result

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()
