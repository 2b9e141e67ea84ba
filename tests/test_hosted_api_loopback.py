"""The lab's hosted API on a host's own loopback (harness/hosted_api.py): a recipe sends a hosted key
in the clear only to loopback, so the local cluster's hosts reach the test's hosted API there.

Run on a network namespace made for the test, as each local cluster host has its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from harness.hosted_api import HostedApi

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

ADDRESS = "10.254.77.2"
KEY = "hosted-secret-0123456789"
ASK = """import sys, urllib.request as u
r = u.Request(sys.argv[1] + "/v1/chat/completions", data=sys.argv[2].encode(),
              headers={"Authorization": "Bearer " + sys.argv[3], "Content-Type": "application/json"})
print(u.urlopen(r, timeout=5).read().decode())
"""


@pytest.fixture
def host() -> Iterator[str]:
    """A network namespace holding ADDRESS, as a local cluster host's holds its address."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2, as the local cluster does")
    name = f"kimi-test-{uuid.uuid4().hex[:8]}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True, check=False).returncode != 0:
        pytest.skip("network namespaces cannot be made here")
    try:
        for command in (["link", "set", "lo", "up"], ["addr", "add", f"{ADDRESS}/32", "dev", "lo"]):
            subprocess.run(["ip", "-n", name, *command], check=True, capture_output=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_the_hosted_api_answers_on_the_loopback_of_the_host_that_calls_it(host: str) -> None:
    api = HostedApi("127.0.0.3", KEY, loopback_of=ADDRESS)
    try:
        assert api.loopback_url.startswith("http://127.0.0.1:")
        body = json.dumps({"model": "kimi-hosted", "messages": [{"role": "user", "content": "hi"}]})
        inside = subprocess.run(
            ["ip", "netns", "exec", host, sys.executable, "-c", ASK, api.loopback_url, body, KEY],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert inside.returncode == 0, inside.stderr[-500:]
        assert json.loads(inside.stdout)["choices"][0]["message"]["content"] == "HOSTED"
        assert [(s["authorization"], s["body"]["model"]) for s in api.seen] == [(f"Bearer {KEY}", "kimi-hosted")]
        # That port is the host's loopback, not this machine's: nothing of the API answers here.
        with pytest.raises(OSError, match="Connection refused"):
            urllib.request.urlopen(api.loopback_url + "/v1/chat/completions", data=body.encode(), timeout=2)
        assert len(api.seen) == 1
    finally:
        api.close()
