"""The local cluster's stand-ins without a cluster: wheels, package index, engines and fake nvidia-smi.

The engines are installed the way a deploy installs them, with pip from the local index into fresh
virtual environments (nothing else is reachable: PIP_CONFIG_FILE=/dev/null, --index-url, no cache),
and driven over HTTP on loopback.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.hostside import router_drain, router_view
from kimi_deploy.hostside.requests import DrainRequest, RouterViewRequest
from localcluster import pypi_mirror
from localcluster.fake_nvidia import CONFIG_PATH, NVIDIA_SMI_PATH, install
from localcluster.pkgindex import IndexServer, serve
from localcluster.standins.kimi_standin.cmdline import Catalog
from localcluster.standins.kimi_standin.engine import check_command_line
from localcluster.wheels import DEFAULT_RELEASES, build_all, build_wheel, catalog_json, catalog_source
from tests.json_reply import send_json
from tests.unit_file import exec_argv
from tests.vllm_contract import check_vllm_api

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

LOAD_SECONDS = "0.2"
H200_TOPO = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "nvidia" / "h200x8_topo_m.txt"
# Every rendered unit that runs a stand-in engine (the router and the Mooncake master are real).
GOLDEN_ROUTERS = sorted(
    (Path(__file__).resolve().parents[1] / "golden").glob("*/*/etc/systemd/system/kimi-router.service")
)
GOLDEN_UNITS = sorted(
    unit
    for name in ("vllm", "sglang", "tokenspeed")
    for unit in (Path(__file__).resolve().parents[1] / "golden").glob(f"*/*/etc/systemd/system/kimi-{name}.service")
)
ENGINE_RELEASES = {
    "vllm": ["vllm==0.34.0", "fastsafetensors==0.5.0"],
    "sglang": ["sglang==0.5.23"],
    "tokenspeed": ["tokenspeed==0.1.1"],
}
PROMPT = "Reply with exactly the word READY and nothing else."


# ---- helpers ----------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def call(url: str, body: Any = None, key: str | None = None, method: str | None = None) -> tuple[int, Any]:
    """(status, parsed JSON or text) of one request; status 0 when nothing listens."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method or ("POST" if data else "GET"))
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except OSError:
        return 0, None
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode()


def pip_env() -> dict[str, str]:
    """No machine-wide pip configuration, proxy or cache can send pip anywhere but the local index."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and "proxy" not in k.lower()}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


class Engine:
    """A stand-in engine process with its stderr collected line by line."""

    def __init__(self, argv: list[str], extra_env: dict[str, str] | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "KIMI_STANDIN_"))}
        env.update({"KIMI_STANDIN_LOAD_SECONDS": LOAD_SECONDS, **(extra_env or {})})
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def finish(self, timeout: float = 10) -> int:
        """Exit status once the process ends by itself."""
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc

    def terminate(self) -> int:
        """Exit status after SIGTERM (the process must end within 5 s)."""
        self.proc.send_signal(signal.SIGTERM)
        return self.finish(5)

    def wait_ready(self, base: str, timeout: float = 10) -> list[int]:
        """The /health statuses seen until it answered 200."""
        seen: list[int] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, _ = call(f"{base}/health")
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == 200:
                return seen
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.lines}"
            time.sleep(0.02)
        raise AssertionError(f"not ready after {timeout} s: {seen} {self.lines}")


def write_shard(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A valid safetensors file: u64 LE header length, JSON header, the tensors' bytes."""
    sizes = {"BF16": 2, "F32": 4, "U8": 1}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    data = b""
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += hashlib.shake_256(name.encode()).digest(n)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IndexServer]:
    root = tmp_path_factory.mktemp("index")
    build_all(root)
    server = serve(root, "127.0.0.1", 0)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def venvs(index: IndexServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One fresh virtual environment per engine, made in parallel, its release installed from the index."""
    base = tmp_path_factory.mktemp("venvs")
    made = {e: subprocess.Popen([sys.executable, "-m", "venv", str(base / e)]) for e in ENGINE_RELEASES}
    assert all(p.wait(120) == 0 for p in made.values())
    pips = {}
    for engine, wanted in ENGINE_RELEASES.items():
        argv = [
            str(base / engine / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--no-cache-dir",
            "--only-binary",
            ":all:",
            "--index-url",
            index.url,
            "--trusted-host",
            "127.0.0.1",
            *wanted,
        ]
        pips[engine] = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=pip_env()
        )
    for engine, proc in pips.items():
        output = proc.communicate(timeout=120)[0]
        assert proc.returncode == 0, f"pip install for {engine} failed:\n{output}"
    return {engine: base / engine for engine in ENGINE_RELEASES}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-shard safetensors repository with its index and a config allowing 4096 tokens."""
    root = tmp_path_factory.mktemp("weights") / "tiny-kimi"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "kimi_k3", "max_position_embeddings": 4096}))
    shards = {
        "model-00001-of-00002.safetensors": {"model.embed_tokens.weight": ("BF16", [64, 16])},
        "model-00002-of-00002.safetensors": {"lm_head.weight": ("BF16", [64, 16]), "model.norm.weight": ("F32", [16])},
    }
    weight_map = {}
    for shard, tensors in shards.items():
        write_shard(root / shard, tensors)
        weight_map.update(dict.fromkeys(tensors, shard))
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


def vllm_argv(venvs: dict[str, Path], model: Path, port: int, *extra: str) -> list[str]:
    """The flags the single-node unit of our recipe passes (tests/golden/prod/b300-01)."""
    return [
        str(venvs["vllm"] / "bin" / "vllm"),
        "serve",
        str(model),
        "--served-model-name",
        "kimi-local",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tensor-parallel-size",
        "8",
        "--max-model-len",
        "2048",
        "--load-format",
        "fastsafetensors",
        "--trust-remote-code",
        "--tool-call-parser",
        "kimi_k3",
        "--enable-auto-tool-choice",
        "--reasoning-parser",
        "kimi_k3",
        *extra,
    ]


# ---- wheels and index -------------------------------------------------------------------------------


def test_wheels_rebuild_byte_identical_and_carry_their_catalog(tmp_path: Path) -> None:
    first = build_all(tmp_path / "a")
    stamps = {p.name: p.stat().st_mtime_ns for p in first}
    again = build_all(tmp_path / "a")
    other = build_all(tmp_path / "b")
    assert [p.name for p in first] == [p.name for p in other] == [p.name for p in again]
    assert all(p.read_bytes() == q.read_bytes() for p, q in zip(first, other, strict=True))
    assert {p.name: p.stat().st_mtime_ns for p in again} == stamps, "an unchanged wheel was rewritten"
    assert len(first) == sum(len(v) for v in DEFAULT_RELEASES.values())
    with zipfile.ZipFile(io.BytesIO(build_wheel("vllm", "0.34.1")[1])) as wheel:
        catalog = json.loads(wheel.read("vllm/kimi_standin_catalog.json"))
        entry_points = wheel.read("vllm-0.34.1.dist-info/entry_points.txt").decode()
        record = wheel.read("vllm-0.34.1.dist-info/RECORD").decode().splitlines()
        assert {i.date_time for i in wheel.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        for line in record[:-1]:
            name, digest, size = line.rsplit(",", 2)
            data = wheel.read(name)
            assert len(data) == int(size)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert (catalog["version"], catalog["catalog_of"]) == ("0.34.1", "0.34.1")
    # A patch release without a catalog of its own carries the newest older one's.
    assert catalog_source("vllm", "0.34.2") == "0.34.1"
    assert "--max-model-len" in catalog["flags"]
    assert "kimi_k3" in catalog["registries"]["tool_call_parser"]
    assert "vllm = vllm.entrypoints.cli.main:main" in entry_points


def test_index_lists_files_with_sha256_and_redirects_other_spellings(index: IndexServer) -> None:
    status, page = call(f"{index.url}/")
    assert status == 200
    assert {"vllm", "sglang", "tokenspeed", "fastsafetensors"} <= set(re.findall(r'href="/simple/([^/]+)/"', page))
    status, page = call(f"{index.url}/vllm/")
    links = dict(re.findall(r'href="/files/([^"#]+)#sha256=([0-9a-f]{64})"', page))
    assert set(links) == {"vllm-0.34.0-py3-none-any.whl", "vllm-0.34.1-py3-none-any.whl"}
    for name, digest in links.items():
        assert hashlib.sha256((index.index.files / name).read_bytes()).hexdigest() == digest
    assert 'data-requires-python="&gt;=3.10"' in page
    status, page = call(f"{index.url}/FastSafeTensors/")  # urllib follows the 301 to the normalized name
    assert status == 200
    assert "fastsafetensors-0.5.0-py3-none-any.whl" in page
    assert call(f"{index.url}/no-such-project/")[0] == 404


def test_index_faults_take_effect_on_the_next_request(tmp_path: Path) -> None:
    build_all(tmp_path, {"vllm": ["0.34.0", "0.34.1"]})
    server = serve(tmp_path, "127.0.0.1", 0)
    try:
        faults = tmp_path / "faults.json"
        faults.write_text('{"down": true}')
        assert call(f"{server.url}/")[0] == 503
        assert call(f"{server.url}/vllm/")[0] == 503
        faults.write_text('{"missing": ["vllm==0.34.0"]}')
        status, page = call(f"{server.url}/vllm/")
        assert status == 200
        assert "vllm-0.34.1-py3-none-any.whl" in page
        assert "vllm-0.34.0" not in page
        base = server.url.removesuffix("/simple")
        assert call(f"{base}/files/vllm-0.34.0-py3-none-any.whl")[0] == 404
        faults.write_text('{"missing": ["VLLM"]}')
        assert call(f"{server.url}/vllm/")[0] == 404
        faults.write_text('{"corrupt": ["vllm==0.34.1"]}')
        name = "vllm-0.34.1-py3-none-any.whl"
        listed = dict(re.findall(r'href="/files/([^"#]+)#sha256=([0-9a-f]{64})"', call(f"{server.url}/vllm/")[1]))
        with urllib.request.urlopen(f"{base}/files/{name}") as response:
            served = response.read()
        assert listed[name] == hashlib.sha256((tmp_path / "files" / name).read_bytes()).hexdigest()
        assert hashlib.sha256(served).hexdigest() != listed[name], "pip must see a hash mismatch"
        faults.unlink()
        assert call(f"{server.url}/vllm/")[0] == 200
    finally:
        server.stop()


def test_pip_installs_from_the_index_and_stats_count_the_download(venvs: dict[str, Path], index: IndexServer) -> None:
    status, stats = call(index.url.removesuffix("/simple") + "/_stats")
    assert status == 200
    wheel = stats["files"]["vllm-0.34.0-py3-none-any.whl"]
    assert wheel == {"requests": 1, "bytes": (index.index.files / "vllm-0.34.0-py3-none-any.whl").stat().st_size}
    assert "vllm-0.34.1-py3-none-any.whl" not in stats["files"]
    version = subprocess.run(
        [str(venvs["vllm"] / "bin" / "vllm"), "--version"], capture_output=True, text=True, check=True
    )
    assert version.stdout.strip() == "0.34.0"


# ---- engines ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("unit", GOLDEN_UNITS, ids=lambda p: f"{p.parts[-5]}/{p.name}")
def test_stand_ins_accept_every_rendered_command_line(unit: Path) -> None:
    argv = exec_argv(unit.read_text())
    program = Path(argv[0])
    release = program.parent.parent.name  # /opt/kimi/engines/<engine>-<version>/bin/<script>
    engine, _, version = release.partition("-")
    catalog = Catalog.from_json(json.loads(catalog_json(engine, version)))
    assert argv[1] == "serve"
    _, plan = check_command_line(catalog, argv[2:])
    assert str(plan.model_dir).startswith("/srv/models/")
    assert plan.names == ("kimi-local",)


def test_vllm_serve_loads_then_answers_deterministically(venvs: dict[str, Path], model: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    engine = Engine(vllm_argv(venvs, model, port))
    try:
        seen = engine.wait_ready(base)
        assert seen[-2:] == [503, 200], f"/health answered {seen}, not 503 while loading and then 200"
        status, models = call(f"{base}/v1/models")
        assert status == 200
        assert [(m["id"], m["max_model_len"], m["owned_by"]) for m in models["data"]] == [("kimi-local", 2048, "vllm")]
        body = {"model": "kimi-local", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 64}
        first, second = call(f"{base}/v1/chat/completions", body), call(f"{base}/v1/chat/completions", body)
        assert first[0] == second[0] == 200
        answer = first[1]
        choice = answer["choices"][0]
        assert (choice["message"]["content"], choice["finish_reason"], answer["model"]) == (
            "READY",
            "stop",
            "kimi-local",
        )
        assert second[1]["choices"][0]["message"]["content"] == "READY"
        usage = answer["usage"]
        assert usage["completion_tokens"] == 1
        assert usage["total_tokens"] == usage["prompt_tokens"] + 1
        ask = {"messages": [{"role": "user", "content": "What is 17 * 23?"}]}
        assert call(f"{base}/v1/chat/completions", ask)[1]["choices"][0]["message"]["content"] == "391"
        other = {"model": "kimi-local", "messages": [{"role": "user", "content": "hello there"}]}
        assert (
            call(f"{base}/v1/chat/completions", other)[1]["choices"][0]["message"]["content"]
            == "kimi-standin: ereht olleh"
        )
        status, error = call(f"{base}/v1/chat/completions", {**body, "model": "gpt-4"})
        assert status == 404
        assert error["error"]["message"] == "The model `gpt-4` does not exist. Valid aliases: kimi-local."
        assert call(f"{base}/version") == (200, {"version": "0.34.0"})
        status, metrics = call(f"{base}/metrics")
        assert status == 200
        assert 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="kimi-local"} 4.0' in metrics
    finally:
        rc = engine.terminate()
    assert rc == 0
    assert "vllm 0.34.0 stand-in starting" in engine.lines[0]
    assert str(model) in engine.lines[0]
    assert any("ready: serving kimi-local" in line for line in engine.lines)


def test_vllm_api_key_from_the_environment(venvs: dict[str, Path], model: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    engine = Engine(vllm_argv(venvs, model, port), {"VLLM_API_KEY": "s3cret"})
    try:
        engine.wait_ready(base)
        assert call(f"{base}/v1/models")[0] == 401
        assert call(f"{base}/v1/models", key="wrong")[0] == 401
        assert call(f"{base}/v1/models", key="s3cret")[0] == 200
        assert call(f"{base}/metrics")[0] == 200
    finally:
        assert engine.terminate() == 0
    assert not any("s3cret" in line for line in engine.lines)


def test_vllm_keeps_the_contract_the_real_engine_is_held_to(venvs: dict[str, Path], model: Path) -> None:
    """tests/vllm_contract.py: the checks tests/e2e/test_demo_real.py runs against the real vLLM."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    engine = Engine(vllm_argv(venvs, model, port), {"VLLM_API_KEY": "s3cret"})
    try:
        engine.wait_ready(base)
        check_vllm_api(base, "s3cret", "0.34.0", "kimi-local")
    finally:
        assert engine.terminate() == 0


def test_vllm_rejects_a_flag_its_release_lacks(venvs: dict[str, Path], model: Path) -> None:
    engine = Engine(vllm_argv(venvs, model, free_port(), "--foo", "--kv-cache-dtype", "fp8"))
    assert engine.finish() == 2
    assert engine.lines == ["vllm: error: unrecognized arguments: --foo"]


def test_vllm_refuses_missing_and_truncated_shards(venvs: dict[str, Path], model: Path, tmp_path: Path) -> None:
    missing = copy_model(model, tmp_path / "missing")
    (missing / "model-00002-of-00002.safetensors").unlink()
    engine = Engine(vllm_argv(venvs, missing, free_port()))
    assert engine.finish() == 1
    assert len(engine.lines) == 1
    assert engine.lines[0].startswith("ERROR ")
    assert "shard model-00002-of-00002.safetensors is missing" in engine.lines[0]
    truncated = copy_model(model, tmp_path / "truncated")
    shard = truncated / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    engine = Engine(vllm_argv(venvs, truncated, free_port()))
    assert engine.finish() == 1
    assert "shard model-00001-of-00002.safetensors is truncated" in engine.lines[0]


def test_vllm_refuses_a_context_beyond_the_config_and_an_unknown_parser(venvs: dict[str, Path], model: Path) -> None:
    engine = Engine(vllm_argv(venvs, model, free_port(), "--max-model-len", "8192"))
    assert engine.finish() == 1
    assert "--max-model-len 8192 is greater than the derived maximum 4096" in engine.lines[0]
    engine = Engine(vllm_argv(venvs, model, free_port(), "--tool-call-parser", "kimi_k9"))
    assert engine.finish() == 1
    assert "unknown tool_call_parser 'kimi_k9'" in engine.lines[0]


def test_vllm_headless_worker_waits_for_its_leader_and_serves_no_http(venvs: dict[str, Path], model: Path) -> None:
    rpc_port, api_port = free_port(), free_port()
    argv = vllm_argv(
        venvs,
        model,
        api_port,
        "--data-parallel-address",
        "127.0.0.1",
        "--data-parallel-rpc-port",
        str(rpc_port),
        "--headless",
    )
    engine = Engine(argv)
    try:
        deadline = time.monotonic() + 5
        while not any("waiting for the leader" in line for line in engine.lines):
            assert time.monotonic() < deadline, engine.lines
            time.sleep(0.02)
        with socket.create_server(("127.0.0.1", rpc_port)):
            while not any("ready: worker" in line for line in engine.lines):
                assert time.monotonic() < deadline + 5, engine.lines
                time.sleep(0.02)
        assert call(f"http://127.0.0.1:{api_port}/health")[0] == 0
        assert engine.proc.poll() is None
    finally:
        assert engine.terminate() == 0


def test_sglang_serve_takes_its_key_from_the_config_file(venvs: dict[str, Path], model: Path, tmp_path: Path) -> None:
    config = tmp_path / "kimi-sglang.yaml"
    config.write_text('# SGLang options that are secrets\napi-key: "k-123"\n')
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [
        str(venvs["sglang"] / "bin" / "sglang"),
        "serve",
        "--model-path",
        str(model),
        "--served-model-name",
        "kimi-local",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tp-size",
        "8",
        "--context-length",
        "1024",
        "--trust-remote-code",
        "--enable-hierarchical-cache",
        "--hicache-ratio",
        "2",
        "--hicache-write-policy",
        "write_through",
        "--config",
        str(config),
    ]
    engine = Engine(argv)
    try:
        engine.wait_ready(base)
        assert call(f"{base}/v1/models")[0] == 401
        status, models = call(f"{base}/v1/models", key="k-123")
        assert status == 200
        assert models["data"][0]["max_model_len"] == 1024
        body = {"model": "kimi-local", "messages": [{"role": "user", "content": 'Say "kimi is up"'}]}
        status, answer = call(f"{base}/v1/chat/completions", body, key="k-123")
        assert status == 200
        assert answer["choices"][0]["message"]["content"] == "kimi is up"
    finally:
        assert engine.terminate() == 0
    launcher = subprocess.run(
        [str(venvs["sglang"] / "bin" / "python"), "-m", "sglang.launch_server", "--model-path", str(model), "--nope"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert (launcher.returncode, launcher.stderr) == (2, "launch_server.py: error: unrecognized arguments: --nope\n")


def test_vllm_router_sends_prefill_then_decode(real_vllm_router: Path, venvs: dict[str, Path], model: Path) -> None:
    ports = [free_port() for _ in range(3)]
    engines = [Engine(vllm_argv(venvs, model, port)) for port in ports[:2]]
    router = Engine(
        [
            str(real_vllm_router),
            "--vllm-pd-disaggregation",
            "--kv-connector",
            "nixl",
            "--prefill",
            f"http://127.0.0.1:{ports[0]}",
            "--decode",
            f"http://127.0.0.1:{ports[1]}",
            "--host",
            "127.0.0.1",
            "--port",
            str(ports[2]),
            "--policy",
            "round_robin",
        ]
    )
    base = f"http://127.0.0.1:{ports[2]}"
    try:
        for engine, port in zip(engines, ports, strict=False):
            engine.wait_ready(f"http://127.0.0.1:{port}")
        router.wait_ready(base)
        body = {"model": "kimi-local", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 16}
        status, answer = call(f"{base}/v1/chat/completions", body)
        assert status == 200
        assert answer["choices"][0]["message"]["content"] == "READY"
        prefill, decode = (call(f"http://127.0.0.1:{port}/metrics")[1] for port in ports[:2])
        # One request each: the prefill engine's (max_tokens 1) and the decode engine's, whose answer came back.
        success = 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="kimi-local"} 1.0'
        assert success in prefill
        assert success in decode
    finally:
        codes = [e.terminate() for e in (router, *engines)]
    assert codes == [0, 0, 0]


class _Recorder(ThreadingHTTPServer):
    """An engine as a router sees it: answers every path 200 and records (method, path, Authorization)."""

    daemon_threads = True

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorder.seen.append((self.command, self.path, self.headers.get("Authorization")))
                if self.path == "/v1/models":
                    doc: Any = {"object": "list", "data": [{"id": "kimi-local", "object": "model"}]}
                else:
                    doc = {
                        "id": "x",
                        "object": "chat.completion",
                        "model": "kimi-local",
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "READY"}}
                        ],
                    }
                send_json(self, doc)

            do_GET = do_POST = _answer

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def api_calls(self) -> list[tuple[str, str, str | None]]:
        return [s for s in self.seen if s[1] not in ("/health", "/metrics")]


@pytest.fixture(scope="module")
def real_vllm_router(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vllm-router 0.1.17, the real wheel from PyPI (a Rust binary that runs on CPU) and its
    dependencies, from the files the cluster's index serves (downloaded once, cached)."""
    root = tmp_path_factory.mktemp("real-router")
    pypi_mirror.mirror(root / "files", wanted=pypi_mirror.real_routers())
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=120)
    pip = subprocess.run(
        [
            str(root / "venv" / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(root / "files"),
            "vllm-router==0.1.17",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return root / "venv" / "bin" / "vllm-router"


@pytest.mark.parametrize("unit", GOLDEN_ROUTERS, ids=lambda p: p.parts[-5])
def test_the_real_router_takes_every_rendered_router_command_line(unit: Path, real_vllm_router: Path) -> None:
    """Each rendered router unit's arguments, parsed by vllm-router 0.1.17's own parser."""
    argv = exec_argv(unit.read_text())
    assert Path(argv[0]).name == "vllm-router"
    parse = "import sys; from vllm_router.launch_router import parse_router_args; parse_router_args(sys.argv[1:])"
    run = subprocess.run(
        [str(real_vllm_router.parent / "python"), "-c", parse, *argv[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]


def test_vllm_router_keys_contract(real_vllm_router: Path) -> None:
    """What the deploy relies on of vllm-router 0.1.17's keys, held of the real router and of the
    stand-in alike: no client key is checked; a completion reaches the prefill and the decode engine
    with "Bearer $OPENAI_API_KEY" from the router's environment, whatever the client sent; a model
    list reaches an engine with the client's header as it came."""
    prefill, decode = _Recorder(), _Recorder()
    port = free_port()
    router = Engine(
        [
            str(real_vllm_router),
            "--vllm-pd-disaggregation",
            "--prefill",
            prefill.url,
            "--decode",
            decode.url,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--policy",
            "round_robin",
        ],
        {"OPENAI_API_KEY": "router-key"},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        router.wait_ready(base, timeout=60)
        body = {"model": "kimi-local", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}
        for key in ("client-key", None):
            status, answer = call(f"{base}/v1/chat/completions", body, key=key)
            assert (status, answer["choices"][0]["message"]["content"]) == (200, "READY")
        completions = [s for s in prefill.api_calls() + decode.api_calls() if s[1] == "/v1/chat/completions"]
        assert {s[2] for s in completions} == {"Bearer router-key"}
        assert {s[1] for s in prefill.api_calls()} >= {"/v1/chat/completions"}
        assert {s[1] for s in decode.api_calls()} >= {"/v1/chat/completions"}
        assert call(f"{base}/v1/models", key="client-key")[0] == 200
        models = [s for s in prefill.api_calls() + decode.api_calls() if s[1] == "/v1/models"]
        assert [s[2] for s in models] == ["Bearer client-key"]
    finally:
        router.proc.kill()
        router.finish()
        prefill.shutdown()
        decode.shutdown()


def test_tokenspeed_serve(venvs: dict[str, Path], model: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [
        str(venvs["tokenspeed"] / "bin" / "tokenspeed"),
        "serve",
        "--model",
        str(model),
        "--served-model-name",
        "kimi-local",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tensor-parallel-size",
        "8",
        "--max-model-len",
        "4096",
        "--trust-remote-code",
    ]
    engine = Engine(argv)
    try:
        engine.wait_ready(base)
        body = {"model": "kimi-local", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8}
        status, answer = call(f"{base}/v1/chat/completions", body)
        assert status == 200
        assert answer["choices"][0]["message"]["content"] == "READY"
        assert call(f"{base}/v1/models")[1]["data"][0]["owned_by"] == "tokenspeed"
    finally:
        assert engine.terminate() == 0


# ---- fake nvidia-smi --------------------------------------------------------------------------------


def smi(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KIMI_FAKE_ACCELERATORS": str(root / CONFIG_PATH)}
    return subprocess.run(
        [sys.executable, str(root / NVIDIA_SMI_PATH), *args], capture_output=True, text=True, env=env, check=False
    )


def test_fake_nvidia_smi_answers_like_the_real_one(tmp_path: Path) -> None:
    install(tmp_path, "b300x8")
    fields = "index,name,uuid,memory.total,pci.bus_id,driver_version,compute_cap"
    out = smi(tmp_path, f"--query-gpu={fields}", "--format=csv")
    assert out.returncode == 0
    rows = list(csv.reader(io.StringIO(out.stdout), skipinitialspace=True))
    assert rows[0] == ["index", "name", "uuid", "memory.total [MiB]", "pci.bus_id", "driver_version", "compute_cap"]
    assert len(rows) == 9
    assert rows[1][1:2] + rows[1][3:] == ["NVIDIA B300 SXM6 AC", "275040 MiB", "00000000:1A:00.0", "580.95.05", "10.3"]
    assert len({r[2] for r in rows[1:]}) == 8
    assert all(re.fullmatch(r"GPU-[0-9a-f-]{36}", r[2]) for r in rows[1:])
    bare = smi(tmp_path, "--query-gpu=memory.total,name", "--format=csv,noheader,nounits").stdout.splitlines()
    assert bare == ["275040, NVIDIA B300 SXM6 AC"] * 8
    listed = smi(tmp_path, "-L").stdout.splitlines()
    assert len(listed) == 8
    assert all(re.fullmatch(r"GPU \d: NVIDIA B300 SXM6 AC \(UUID: GPU-[0-9a-f-]{36}\)", line) for line in listed)
    bad = smi(tmp_path, "--query-gpu=index,bogus", "--format=csv")
    assert (bad.returncode, bad.stdout) == (2, 'Field "bogus" is not a valid field to query.\n\n')
    topo = smi(tmp_path, "topo", "-m").stdout.splitlines()
    assert topo[0].split("\t")[1:] == [
        *(f"GPU{i}" for i in range(8)),
        *(f"NIC{i}" for i in range(8)),
        "CPU Affinity",
        "NUMA Affinity",
        "GPU NUMA ID",
    ]
    assert (
        "| NVIDIA-SMI 580.95.05              Driver Version: 580.95.05      CUDA Version: 13.0     |"
        in smi(tmp_path).stdout
    )
    # A driver-install stand-in rewrites the version; the next call reports it.
    config = tmp_path / CONFIG_PATH
    config.write_text(json.dumps({**json.loads(config.read_text()), "driver_version": "580.105.08"}))
    assert smi(tmp_path, "--query-gpu=driver_version", "--format=csv,noheader").stdout == "580.105.08\n" * 8


def test_fake_h200_topology_is_the_captured_one(tmp_path: Path) -> None:
    install(tmp_path, "h200x8")
    out = smi(tmp_path, "topo", "-m").stdout
    if not H200_TOPO.is_file():
        pytest.skip(f"{H200_TOPO} is not there")
    # The capture lost trailing blanks (the real tool ends a row's " X " with one).
    assert [line.rstrip() for line in out.splitlines()] == H200_TOPO.read_text().splitlines()


def test_fake_accelerators_without_nvidia_smi(tmp_path: Path) -> None:
    install(tmp_path, "b300x8")
    install(tmp_path, "tpu7x4")
    assert not (tmp_path / NVIDIA_SMI_PATH).exists()
    described = json.loads((tmp_path / CONFIG_PATH).read_text())
    assert (described["vendor"], [c["device"] for c in described["chips"]]) == (
        "google",
        [f"/dev/vfio/{i}" for i in range(4)],
    )
    install(tmp_path / "none", "none")
    assert json.loads((tmp_path / "none" / CONFIG_PATH).read_text())["vendor"] is None
    with pytest.raises(ValueError, match="unknown hardware 'a100x8'"):
        install(tmp_path, "a100x8")


def test_the_real_router_with_its_engines_gone(real_vllm_router: Path) -> None:
    """What the gateway relies on of vllm-router 0.1.17 when its engines are gone: an engine not
    listening when the router starts is left out; once every engine is gone, its /health still
    says 200 and requests get 500 "Request failed: error sending request for url (...)" (so the
    gateway falls back on 500 too, templates/gateway.nginx.conf.j2)."""
    # an engine in a process of its own, to be killed with the connections the router keeps to it
    up_port, port, missing = free_port(), free_port(), free_port()
    up = subprocess.Popen([sys.executable, "-c", _ANSWERS_EVERYTHING, str(up_port)])
    up_url = f"http://127.0.0.1:{up_port}"
    deadline = time.monotonic() + 10
    while call(f"{up_url}/health")[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    router = Engine(
        [
            str(real_vllm_router),
            "--worker-urls",
            up_url,
            f"http://127.0.0.1:{missing}",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--policy",
            "round_robin",
        ],
        {"OPENAI_API_KEY": "router-key"},
    )
    base = f"http://127.0.0.1:{port}"
    body = {"model": "kimi-local", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}
    try:
        router.wait_ready(base, timeout=60)
        assert [call(f"{base}/v1/chat/completions", body)[0] for _ in range(4)] == [200] * 4
        up.kill()
        up.wait()
        for path, sent in (("/v1/chat/completions", body), ("/v1/models", None)):
            status, text = call(f"{base}{path}", sent)
            assert (status, str(text).startswith("Request failed: error sending request for url")) == (500, True), text
        assert call(f"{base}/health") == (200, "All servers healthy")
    finally:
        up.kill()
        router.proc.kill()
        router.finish()


def test_the_real_router_retries_on_the_engine_left_when_one_is_drained(real_vllm_router: Path) -> None:
    """What the watchdog's drain relies on (hostside/watchdog.py stops an engine the router then
    cannot reach): vllm-router 0.1.17 sends a request that finds its engine gone to the other one
    (its retries pick a worker again), so every client request is answered while one of two
    engines is stopped, before any health check of the router has noticed."""
    ports = [free_port(), free_port()]
    engines = [subprocess.Popen([sys.executable, "-c", _ANSWERS_EVERYTHING, str(p)]) for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    for url in urls:
        deadline = time.monotonic() + 10
        while call(f"{url}/health")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
    port = free_port()
    router = Engine(
        [
            str(real_vllm_router),
            "--worker-urls",
            *urls,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--policy",
            "round_robin",
        ],
        {"OPENAI_API_KEY": "router-key"},
    )
    base = f"http://127.0.0.1:{port}"
    body = {"model": "kimi-local", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}
    try:
        router.wait_ready(base, timeout=60)
        assert [call(f"{base}/v1/chat/completions", body)[0] for _ in range(4)] == [200] * 4
        engines[1].kill()
        engines[1].wait()
        # round robin sends every other request to the stopped engine: each is answered anyway
        assert [call(f"{base}/v1/chat/completions", body)[0] for _ in range(8)] == [200] * 8
    finally:
        for engine in engines:
            engine.kill()
        router.proc.kill()
        router.finish()


def test_the_real_router_takes_an_engine_out_and_back_by_its_health_checks(real_vllm_router: Path) -> None:
    """What the recipe's ``router.health`` relies on (kimi_deploy/render/router_units.py renders it as
    these flags): vllm-router 0.1.17 checks each engine's /health every ``--health-check-interval-secs``,
    sends an engine that failed ``--health-failure-threshold`` checks in a row nothing more (its
    ``vllm_router_worker_health`` gauge 0), and takes it back once it passed
    ``--health-success-threshold`` (the gauge 1 and requests reaching it again). With the router's
    default interval (60 s) neither would happen within the deadlines below."""
    ports, port, metrics = [free_port(), free_port()], free_port(), free_port()
    urls = [f"http://127.0.0.1:{p}" for p in ports]

    def engine(i: int) -> subprocess.Popen[bytes]:
        return _named_engine(ports[i], "AB"[i])

    engines = [engine(0), engine(1)]
    router = _checking_router(real_vllm_router, urls, port, metrics)
    base = f"http://127.0.0.1:{port}"
    body = {"model": "kimi-local", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}

    def answered_by() -> str:
        status, reply = call(f"{base}/v1/chat/completions", body)
        assert status == 200, reply
        return str(reply["choices"][0]["message"]["content"])

    def health(i: int) -> str | None:
        text = str(call(f"http://127.0.0.1:{metrics}/metrics")[1])
        found = re.search(rf'vllm_router_worker_health{{worker="{re.escape(urls[i])}"}} (\d)', text)
        return found.group(1) if found else None

    def within(seconds: float, done: Any) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if done():
                return True
            time.sleep(0.2)
        return False

    try:
        router.wait_ready(base, timeout=60)
        assert sorted(answered_by() for _ in range(4)) == ["A", "A", "B", "B"]
        assert (health(0), health(1)) == ("1", "1")
        engines[1].kill()
        engines[1].wait()
        assert within(20, lambda: health(1) == "0"), "the router still counts the stopped engine healthy"
        assert [answered_by() for _ in range(6)] == ["A"] * 6
        engines[1] = engine(1)
        assert within(20, lambda: health(1) == "1"), "the router has not taken the engine back"
        assert within(10, lambda: answered_by() == "B")
    finally:
        for proc in engines:
            proc.kill()
        router.proc.kill()
        router.finish()


def test_the_router_view_waits_until_the_real_router_sends_to_an_engine_back(real_vllm_router: Path) -> None:
    """hostside/router_view.py, run between a converge's batches, on the real vllm-router 0.1.17:
    while the router counts a stopped engine out, the view waits and, its time up, fails naming
    it; once the engine answers again, the view returns once the router has taken it back and the
    circuit that the requests failed on it opened is past its time (the gauge still says open
    until a request comes), and requests reach it then; with no router answering it waits on
    nothing."""
    ports, port, metrics = [free_port(), free_port()], free_port(), free_port()
    urls = [f"http://127.0.0.1:{p}" for p in ports]

    def engine(i: int) -> subprocess.Popen[bytes]:
        return _named_engine(ports[i], "AB"[i])

    engines = [engine(0), engine(1)]
    router = _checking_router(real_vllm_router, urls, port, metrics, "--cb-timeout-duration-secs", "3")
    base = f"http://127.0.0.1:{port}"
    body = {"model": "kimi-local", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}
    view: RouterViewRequest = {
        "router": "vllm-router",
        "metrics": f"http://127.0.0.1:{metrics}/metrics",
        "gauge": "vllm_router_worker_health",
        "circuit": "vllm_router_cb_state",
        "circuit_open_s": 3,
        "workers": [urls[1]],
        "timeout_s": 3,
    }
    try:
        router.wait_ready(base, timeout=60)
        engines[1].kill()
        engines[1].wait()
        # requests meet the stopped engine (answered by the other on retry) until its circuit opens
        for _ in range(30):
            assert call(f"{base}/v1/chat/completions", body)[0] == 200
        circuit = router_view.health(str(call(f"http://127.0.0.1:{metrics}/metrics")[1]), "vllm_router_cb_state", urls)
        assert circuit[urls[1]] == 1
        deadline = time.monotonic() + 20
        while router_view.wait(view | {"timeout_s": 0})[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        code, said = router_view.wait(view)
        assert code == 1
        assert said["reason"] == (
            f"vllm-router still counts {urls[1]} unhealthy after 3 s (its health gauge 0): "
            "the next batch would stop the engines it sends to"
        )
        engines[1] = engine(1)
        code, said = router_view.wait(view | {"timeout_s": 30})
        assert (code, said["routed"], said["unknown"], said["circuit_open"]) == (0, [urls[1]], [], [urls[1]]), said
        assert 3 <= said["waited_s"] < 30
        answers = set()
        for _ in range(4):
            status, reply = call(f"{base}/v1/chat/completions", body)
            assert status == 200, reply
            answers.add(reply["choices"][0]["message"]["content"])
        assert answers == {"A", "B"}
        # an engine the router does not know is not waited for; no router at all, nothing is
        assert router_view.wait(view | {"workers": ["http://127.0.0.1:1"]})[1]["unknown"] == ["http://127.0.0.1:1"]
        none = router_view.wait(view | {"metrics": f"http://127.0.0.1:{free_port()}/metrics"})
        assert none[0] == 0
        assert none[1]["said"].startswith("no vllm-router answers on http://127.0.0.1:")
    finally:
        for proc in engines:
            proc.kill()
        router.proc.kill()
        router.finish()


def _named_engine(port: int, name: str) -> subprocess.Popen[bytes]:
    """``_ANSWERS_EVERYTHING`` answering ``name`` on ``port``, once its /health answers."""
    proc = subprocess.Popen([sys.executable, "-c", _ANSWERS_EVERYTHING, str(port), name])
    deadline = time.monotonic() + 10
    while call(f"http://127.0.0.1:{port}/health")[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def _checking_router(binary: Path, urls: list[str], port: int, metrics: int, *more: str) -> Engine:
    """The real router over ``urls`` checking them every second (2 failures out, 2 successes back),
    its metrics on loopback at ``metrics``."""
    return Engine(
        [
            str(binary),
            "--worker-urls",
            *urls,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--policy",
            "round_robin",
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(metrics),
            "--health-check-interval-secs",
            "1",
            "--health-check-timeout-secs",
            "1",
            "--health-failure-threshold",
            "2",
            "--health-success-threshold",
            "2",
            *more,
        ],
        {"OPENAI_API_KEY": "router-key"},
    )


# An OpenAI-compatible engine as a router sees it, in a few lines: 200 and an answer everywhere, READY
# or the name given after the port.
_ANSWERS_EVERYTHING = """
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
NAME = sys.argv[2] if len(sys.argv) > 2 else "READY"
ANSWER = json.dumps({"object": "chat.completion", "model": "kimi-local", "data": [{"id": "kimi-local"}],
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": NAME}}]}).encode()
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args): pass
    def _answer(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)
    do_GET = do_POST = _answer
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


# An engine whose Prometheus page says it holds the requests a file gives (vLLM's gauge, as vLLM
# 0.32.0 labels it), answering everything else as ``_ANSWERS_EVERYTHING`` does.
_HOLDING = _ANSWERS_EVERYTHING.replace(
    "    do_GET = do_POST = _answer",
    """    def do_GET(self):
        if self.path != "/metrics":
            return self._answer()
        held = open(sys.argv[3]).read().strip()
        page = ('vllm:num_requests_running{engine="0",model_name="kimi-local"} ' + held + "\\n"
                'vllm:num_requests_waiting{engine="0",model_name="kimi-local"} 0.0\\n').encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)
    do_POST = _answer""",
)


def test_the_drain_takes_an_engine_out_of_the_real_router_until_it_holds_nothing_and_puts_it_back(
    real_vllm_router: Path, tmp_path: Path
) -> None:
    """hostside/router_drain.py on the real vllm-router 0.1.17: "out" removes the batch's engine
    from the router (every request then goes to the other) and waits until the engine's own gauges
    hold no request, twice in a row; "in" adds it back and requests reach it again. An engine
    whose router lists no other is left in; no router, nothing to drain."""
    ports, port, metrics = [free_port(), free_port()], free_port(), free_port()
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    held = tmp_path / "held"
    held.write_text("1.0\n")
    engines = [
        _named_engine(ports[0], "A"),
        subprocess.Popen([sys.executable, "-c", _HOLDING, str(ports[1]), "B", str(held)]),
    ]
    router = _checking_router(real_vllm_router, urls, port, metrics)
    base = f"http://127.0.0.1:{port}"
    body = {"model": "kimi-local", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}
    kept = tmp_path / "drained.json"
    req: DrainRequest = {
        "router": "vllm-router",
        "api": base,
        "phase": "out",
        "workers": [urls[1]],
        "timeout_s": 20,
        "drained_file": str(kept),
    }
    try:
        router.wait_ready(base, timeout=60)
        assert sorted(router_drain.listed(req) or []) == sorted(urls)
        # the engine holds a request for 2 s more: the drain waits for it
        threading.Timer(2.0, lambda: held.write_text("0.0\n")).start()
        said = router_drain.out(req)
        assert list(said["drained_s"]) == [urls[1]], said
        assert 2.0 <= said["drained_s"][urls[1]] < 20, said
        assert router_drain.listed(req) == [urls[0]]
        # recorded out until it is back: the next converge's probe reads what a stopped one left
        assert json.loads(kept.read_text()) == [urls[1]]
        for _ in range(6):
            status, reply = call(f"{base}/v1/chat/completions", body)
            assert (status, reply["choices"][0]["message"]["content"]) == (200, "A"), reply
        # held past its bound: said, not waited on
        held.write_text("3.0\n")
        router_drain.back_in(req)
        late = router_drain.out(req | {"timeout_s": 1})
        assert late["left"] == {urls[1]: 3.0}, late
        assert router_drain.back_in(req) == {"ok": True, "added": [urls[1]]}
        assert sorted(router_drain.listed(req) or []) == sorted(urls)
        assert not kept.exists()
        answers = {call(f"{base}/v1/chat/completions", body)[1]["choices"][0]["message"]["content"] for _ in range(6)}
        assert answers == {"A", "B"}
        # twice in: as asked
        assert router_drain.back_in(req) == {"ok": True, "added": []}
        # both of its engines: the router would have none left to send to
        both = router_drain.out(req | {"workers": urls})
        assert both["said"] == "vllm-router sends to no other engine: left in"
        assert sorted(router_drain.listed(req) or []) == sorted(urls)
        none = router_drain.out(req | {"api": f"http://127.0.0.1:{free_port()}"})
        assert none["said"].startswith("no vllm-router answers on http://127.0.0.1:")
    finally:
        for proc in engines:
            proc.kill()
        router.proc.kill()
        router.finish()
