"""A prefill/decode topology on 4 hosts of a cluster of its own: 2 prefill instances, 1 decode
instance (stand-ins: P/D needs NIXL on GPUs), 1 router on a CPU host: the real vllm-router 0.1.17
from PyPI, beside the real Mooncake master (mooncake-transfer-engine 0.3.13.post1). It converges (the communication check across the
4 hosts first, starts in order: engines, then the router), its smoke test goes through the router,
and a client's request through the router is answered; the router holds no key in its argv."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import urllib.error
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from harness.hosted_api import serve_on_loopback_of
from harness.own_cluster import OwnCluster, Run
from tests.e2e.demo import chat, gpu_recipe_data, ssh

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

# The Mooncake master is the real one: mooncake-transfer-engine from PyPI, in a release of its own.
MOONCAKE = "0.3.13.post1"
PD = OwnCluster(
    {
        "KIMI_CLUSTER_DIR": "/var/lib/kimi-cluster-pd",
        "KIMI_CLUSTER_SUBNET": "10.213.13.0/24",
        "KIMI_CLUSTER_PACKAGES": f"mooncake-transfer-engine=={MOONCAKE}",
    }
)
PD_DIR = PD.dir
HOSTS = ("kimi-h1", "kimi-h2", "kimi-h3", "kimi-h4")

GROUPS = """
demo_pd_prefill = _hosts[:2]
demo_pd_decode = _hosts[2:3]
demo_pd_router = _hosts[3:4]
demo_pd = [name for name, _ in _hosts]
"""


@pytest.fixture(scope="module")
def pd_cluster() -> Iterator[dict[str, Any]]:
    PD.cli("up", "--hardware", "b300x8,b300x8,b300x8,none")
    try:
        yield PD.state()
    finally:
        PD.cli("down")


def _files(tmp_path: Path, fallback: dict[str, Any] | None = None) -> Path:
    data = gpu_recipe_data()
    vllm = data["topologies"]["demo-vllm"]
    # The connectors' packages in the engines' release: NIXL (a stand-in: its real builds need CUDA)
    # and the real Mooncake client (its CUDA 12 build, which runs here as the master beside it does).
    data["engines"]["vllm"]["packages"].update({"nixl": "1.5.1", "mooncake-transfer-engine": MOONCAKE})
    data["routers"] = {"vllm-router": {"version": "0.1.17"}}
    data["stores"] = {"mooncake-transfer-engine": {"version": MOONCAKE}}
    data["topologies"] = {
        "demo-pd": {
            "engine": "vllm",
            "group": "demo_pd",
            "accelerators": vllm["accelerators"],
            "max_model_len": vllm["max_model_len"],
            "load_format": "fastsafetensors",
            "parsers": vllm["parsers"],
            # The transport is explicit: the test hosts have no RDMA, so TCP, named as such.
            "kv_transfer": {"connectors": ["NixlConnector", "MooncakeStoreConnector"], "transport": "tcp"},
            "router": {
                "group": "demo_pd_router",
                "package": "vllm-router",
                "policy": "round_robin",
                **({"fallback": fallback} if fallback else {}),
            },
            "expose": {"bind": "address", "api_key": {"file": str(PD_DIR / "api-key")}},
            "comm_check": {"min_mbit_s": 100, "deadline_s": 15},
            "pools": {
                "prefill": {
                    "group": "demo_pd_prefill",
                    "role": "prefill",
                    "hosts": 2,
                    "instances": 2,
                    "parallel": {"tp": 8},
                },
                "decode": {"group": "demo_pd_decode", "role": "decode", "hosts": 1, "parallel": {"tp": 8}},
            },
        }
    }
    recipe = tmp_path / "demo-pd.yaml"
    recipe.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return PD.inventory(tmp_path / "pd.py", recipe, GROUPS)


def _converge(inventory: Path) -> tuple[Run, float]:
    started = time.perf_counter()
    run = PD.pyinfra(inventory)
    return run, time.perf_counter() - started


def test_a_prefill_decode_topology_serves_through_its_router(pd_cluster: dict[str, Any], tmp_path: Path) -> None:
    inventory = _files(tmp_path)
    # The hosts' image carries curl, and with it libcurl4, which mooncake_master links
    # (kimi_deploy.releases.host_libraries): gone from the router host, the master starts only if the
    # deploy installs what it links.
    ssh("kimi-h4", "dpkg --purge curl libcurl4 >/dev/null", cluster_state=pd_cluster)
    assert not ssh("kimi-h4", "ls /usr/lib/*/libcurl.so.4 2>/dev/null || true", cluster_state=pd_cluster)
    run, _ = _converge(inventory)
    assert run.code == 0, run.log[-4000:]
    assert ssh("kimi-h4", "dpkg-query -W -f '${Status}' libcurl4", cluster_state=pd_cluster) == "install ok installed"
    changed = run.changed()
    assert changed["Communication check"] == list(HOSTS)
    # A new topology, nothing to keep serving: both prefill instances and the decode instance at
    # once, then the router once every engine behind it answers; its smoke test goes through it.
    assert changed["Services: leaders"] == ["kimi-h1", "kimi-h2", "kimi-h3"]
    assert changed["Smoke test"] == ["kimi-h1", "kimi-h2", "kimi-h3"]
    assert "Services: leaders (second batch)" not in changed
    assert changed["Services: routers (last batch)"] == ["kimi-h4"]
    assert changed["Smoke test (last batch)"] == ["kimi-h4"]
    key = (PD_DIR / "api-key").read_text(encoding="utf-8").strip()
    router = next(h["address"] for h in pd_cluster["hosts"] if h["name"] == "kimi-h4")
    answer = chat(
        f"http://{router}:8000", "Reply with exactly the word READY and nothing else.", key_file=PD_DIR / "api-key"
    )
    assert answer["choices"][0]["message"]["content"] == "READY"
    # The real router renames its process (setproctitle: "vllm::router"): its command line is the
    # unit's; no process on the host shows the key in its argv.
    assert "--vllm-pd-disaggregation" in ssh(
        "kimi-h4", "systemctl show -p ExecStart --value kimi-router", cluster_state=pd_cluster
    )
    every_argv = ssh("kimi-h4", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '", cluster_state=pd_cluster)
    assert "vllm::router" in every_argv
    assert key not in every_argv
    # The router checks no client key (as the real vllm-router): nginx in front refuses a client
    # without the key before the router, and the router's own port is loopback's alone.
    wrong = tmp_path / "wrong-key"
    wrong.write_text("not-the-key\n", encoding="utf-8")
    with pytest.raises(urllib.error.HTTPError) as refused:
        chat(f"http://{router}:8000", "hi", key_file=wrong)
    assert refused.value.code == 401
    reach = ssh(
        "kimi-h1",
        f"curl -s -o /dev/null -m 3 -w '%{{http_code}}' http://{router}:8009/health || true",
        cluster_state=pd_cluster,
    )
    assert reach.strip() in ("000", "")
    assert "127.0.0.1:8009" in ssh("kimi-h4", "ss -ltnH", cluster_state=pd_cluster)
    _the_real_mooncake_master_serves_the_engines_config(pd_cluster, router)
    # No NVIDIA driver on the router's CPU host.
    assert (
        ssh("kimi-h4", "dpkg-query -W -f '${Status}' nvidia-driver-cuda 2>/dev/null || true", cluster_state=pd_cluster)
        != "install ok installed"
    )
    again, _ = _converge(inventory)
    assert again.code == 0
    assert again.changed() == {}


def _the_real_mooncake_master_serves_the_engines_config(pd_cluster: dict[str, Any], router: str) -> None:
    """The router host's Mooncake master (the real mooncake_master of mooncake-transfer-engine
    0.3.13.post1, from its own release beside the router's) runs under the unit's hardening, binds where the
    unit says, and answers at the addresses an engine's rendered mooncake.json names."""
    assert ssh("kimi-h4", "systemctl is-active kimi-mooncake-master", cluster_state=pd_cluster) == "active"
    pid = ssh("kimi-h4", "systemctl show -p MainPID --value kimi-mooncake-master", cluster_state=pd_cluster)
    assert ssh("kimi-h4", f"cat /proc/{pid}/comm", cluster_state=pd_cluster) == "mooncake_master"
    # the binary of its own release, not the router's (its console script execs the bundled one)
    exe = ssh("kimi-h4", f"readlink /proc/{pid}/exe", cluster_state=pd_cluster)
    assert exe.startswith(f"/opt/kimi/engines/mooncake-transfer-engine-{MOONCAKE}/"), exe
    # a user of its own that systemd made at its start (the range systemd.exec(5) gives DynamicUser=):
    # neither root nor the engine user, so no engine's process may read or signal it
    uid = int(ssh("kimi-h4", f"stat -c %u /proc/{pid}", cluster_state=pd_cluster))
    assert 61184 <= uid <= 65519, uid
    assert ssh("kimi-h4", "systemctl show -p User --value kimi-mooncake-master", cluster_state=pd_cluster) == (
        "kimi-mooncake-master"
    )
    listening = ssh("kimi-h4", f"ss -ltnpH | grep 'pid={pid},' | awk '{{print $4}}' | sort", cluster_state=pd_cluster)
    # The RPC port and the metrics follow their flags; the HTTP metadata server binds every address
    # whatever --http_metadata_server_host says, which is why the unit lets in its topology alone.
    assert sorted(listening.split()) == sorted([f"{router}:50051", "0.0.0.0:8080", "127.0.0.1:9003"])
    # (curl is gone from this host: see above)
    health = json.loads(
        ssh(
            "kimi-h4",
            "python3 -c 'import urllib.request as u; "
            'print(u.urlopen("http://127.0.0.1:9003/health", timeout=5).read().decode())\'',
            cluster_state=pd_cluster,
        )
    )
    assert (health["status"], health["service_ready"]) == ("ok", True)
    unit = ssh("kimi-h4", "systemctl cat kimi-mooncake-master", cluster_state=pd_cluster)
    addresses = sorted(h["address"] for h in pd_cluster["hosts"])
    allow = next(line for line in unit.splitlines() if line.startswith("IPAddressAllow="))
    assert sorted(allow.removeprefix("IPAddressAllow=").split()) == sorted(["localhost", *addresses])
    # An engine host reaches the master at its config's addresses: the metadata server at its URL
    # (the real server's answers: 404 "metadata not found", PUT 200, then the value back).
    config = json.loads(ssh("kimi-h1", "cat /etc/kimi/mooncake.json", cluster_state=pd_cluster))
    assert config["master_server_address"] == f"{router}:50051"
    url = f"{config['metadata_server']}?key=kimi-e2e"
    curl = "curl -s -m 5 -w ' %{http_code}'"
    assert ssh("kimi-h1", f"{curl} '{url}'", cluster_state=pd_cluster) == "metadata not found 404"
    assert ssh("kimi-h1", f"{curl} -X PUT --data-binary ready '{url}'", cluster_state=pd_cluster).endswith(" 200")
    assert ssh("kimi-h1", f"{curl} '{url}'", cluster_state=pd_cluster) == "ready 200"
    assert ssh("kimi-h1", f"{curl} -X DELETE '{url}'", cluster_state=pd_cluster).endswith(" 200")
    host, port = config["master_server_address"].rsplit(":", 1)
    assert (
        ssh("kimi-h1", f"timeout 5 bash -c '</dev/tcp/{host}/{port}' && echo open", cluster_state=pd_cluster) == "open"
    )


class _Hosted(BaseHTTPRequestHandler):
    """The hosted API, as far as the gateway sees it: one chat completion, recorded."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Hosted.seen.append({"path": self.path, "authorization": self.headers.get("Authorization"), "body": body})
        answer = json.dumps(
            {
                "id": "hosted-1",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "HOSTED"}}
                ],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


def test_the_hosted_api_answers_when_no_local_backend_is_healthy(pd_cluster: dict[str, Any], tmp_path: Path) -> None:
    # The hosted API on the router host's own loopback: a recipe sends a hosted key in the clear
    # nowhere else.
    hosted = serve_on_loopback_of(next(h["address"] for h in pd_cluster["hosts"] if h["name"] == "kimi-h4"), _Hosted)
    hosted_key = tmp_path / "hosted-key"
    hosted_key.write_text("hosted-secret-0123456789\n", encoding="utf-8")
    try:
        inventory = _files(
            tmp_path,
            fallback={
                "url": f"http://127.0.0.1:{hosted.server_address[1]}",
                "api_key": {"file": str(hosted_key)},
                "model": "kimi-hosted",
            },
        )
        run, _ = _converge(inventory)
        assert run.code == 0, run.log[-4000:]
        assert "kimi-h4" in run.changed()["Smoke test (last batch)"]  # through the gateway, to the engines
        router = next(h["address"] for h in pd_cluster["hosts"] if h["name"] == "kimi-h4")
        prompt = "Reply with exactly the word READY and nothing else."
        assert (
            chat(f"http://{router}:8000", prompt, key_file=PD_DIR / "api-key")["choices"][0]["message"]["content"]
            == "READY"
        )
        assert _Hosted.seen == []
        # Every secret is root's alone, read by systemd; the gateway, holding the hosted key, runs
        # as a user of its own, and the engine user cannot read its secrets.
        for host in HOSTS:
            modes = ssh(host, "stat -c '%n %U:%G %a' /etc/kimi/secrets/*", cluster_state=pd_cluster).splitlines()
            assert modes, host
            # the weights transfer key of a fan-out alone is the engine group's to read (its peer service)
            expected = {True: " root:kimi 440", False: " root:root 600"}
            assert all(line.endswith(expected["weights-transfer-key " in line]) for line in modes), (host, modes)
        # Debian's nginx, from the host's archive, serves as the gateway alone: the package's own
        # service is masked and nothing listens on port 80.
        assert (
            ssh("kimi-h4", "systemctl is-enabled nginx.service || true", cluster_state=pd_cluster).strip() == "masked"
        )
        assert ":80 " not in ssh("kimi-h4", "ss -ltnH", cluster_state=pd_cluster)
        assert (
            ssh(
                "kimi-h4", "cat /proc/$(systemctl show -p MainPID --value kimi-gateway)/comm", cluster_state=pd_cluster
            ).strip()
            == "nginx"
        )
        gateway_user = ssh(
            "kimi-h4", "ps -o user= -p $(systemctl show -p MainPID --value kimi-gateway)", cluster_state=pd_cluster
        )
        assert gateway_user.strip() not in ("root", "kimi")
        assert (
            ssh(
                "kimi-h4",
                "runuser -u kimi -- cat /etc/kimi/secrets/kimi-gateway.env >/dev/null 2>&1 || echo refused",
                cluster_state=pd_cluster,
            ).strip()
            == "refused"
        )
        for host in ("kimi-h1", "kimi-h2", "kimi-h3"):  # no local backend is healthy any more
            ssh(host, "systemctl stop kimi-vllm", cluster_state=pd_cluster)
        answer = chat(f"http://{router}:8000", prompt, key_file=PD_DIR / "api-key")
        assert answer["choices"][0]["message"]["content"] == "HOSTED"
        (seen,) = _Hosted.seen
        assert seen["authorization"] == "Bearer hosted-secret-0123456789"
        assert seen["body"]["model"] == "kimi-hosted"
        # Without the local key nobody gets the hosted API through the gateway.
        wrong = tmp_path / "wrong-key"
        wrong.write_text("not-the-key\n", encoding="utf-8")
        with pytest.raises(urllib.error.HTTPError) as refused:
            chat(f"http://{router}:8000", prompt, key_file=wrong)
        assert refused.value.code == 401
        # An absolute-form target with the right key is refused, not forwarded with the hosted key.
        key = (PD_DIR / "api-key").read_text(encoding="utf-8").strip()
        with socket.create_connection((router, 8000), timeout=10) as conn:
            conn.sendall(
                f"GET http://evil.example/steal HTTP/1.1\r\nHost: evil.example\r\n"
                f"Authorization: Bearer {key}\r\nConnection: close\r\n\r\n".encode()
            )
            status = conn.recv(64).split(b" ", 2)[1]
        assert status == b"400"
        assert len(_Hosted.seen) == 1
        journal = ssh("kimi-h4", "journalctl -u kimi-gateway -o cat --no-pager", cluster_state=pd_cluster)
        assert "fallback: POST /v1/chat/completions" in journal
        assert "hosted-secret" not in journal
    finally:
        hosted.shutdown()
