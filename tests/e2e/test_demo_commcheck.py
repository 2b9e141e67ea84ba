"""The communication check and the start order on the demo cluster: before the SGLang engines of demo-sglang (kimi-h3
leader, kimi-h4 worker) restart, both hosts must reach each other's ports fast enough.

Each test changes the topology's environment (a change that restarts both engines) and breaks one
thing between the hosts: a firewall rule inside kimi-h3, kimi-h4 gone from the network, a link
shaped to a crawl. The check names the pair or host and the cause, on both hosts, and no engine is
started or restarted: the release that was serving keeps serving, its files untouched.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from harness.interrupted import run_until
from kimi_pyinfra.dead_peers import LOST
from localcluster.state import Settings
from tests.e2e.demo import address, chat, demo_recipe, host_lines, main_pid, pyinfra, ssh

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

TOPOLOGY = ("kimi-h3", "kimi-h4")
UNIT = "/etc/systemd/system/kimi-sglang.service"


@pytest.fixture
def serving(demo_cluster: None) -> dict[str, int]:
    run = pyinfra()
    assert run.code == 0, run.log[-3000:]
    return {host: main_pid(host, "kimi-sglang") for host in TOPOLOGY}


def _restarting(tmp_path: Path) -> Path:
    """The demo recipe with a changed environment for demo-sglang: both of its engines restart."""

    def edit(data: dict[str, Any]) -> None:
        data["topologies"]["demo-sglang"]["env"] = {"KIMI_DEMO_GENERATION": tmp_path.name}

    return demo_recipe(tmp_path / "recipe.yaml", edit)


def _untouched(before: dict[str, int], units: dict[str, str]) -> None:
    assert {host: main_pid(host, "kimi-sglang") for host in TOPOLOGY} == before
    assert {host: ssh(host, "sha256sum", UNIT) for host in TOPOLOGY} == units
    answer = chat(f"http://{address('kimi-h3')}:30000", "Reply with exactly the word READY and nothing else.")
    assert answer["choices"][0]["message"]["content"] == "READY"


def _check_lines(log: str) -> dict[str, str]:
    """The comm check's first line for each host that printed one."""
    return {h: lines[0] for h, lines in host_lines(log, "kimi-deploy: comm check: ", TOPOLOGY).items() if lines}


def _veth(host: str) -> str:
    return Settings.from_env().veth(address(host))


@pytest.fixture
def units(serving: dict[str, int]) -> dict[str, str]:
    return {host: ssh(host, "sha256sum", UNIT) for host in TOPOLOGY}


def test_a_restart_passes_the_check_on_both_hosts_first(serving: dict[str, int], tmp_path: Path) -> None:
    run = pyinfra("--data", f"kimi_recipe={_restarting(tmp_path)}")
    assert run.code == 0, run.log[-3000:]
    changed = run.changed()
    assert changed["Communication check"] == list(TOPOLOGY)
    assert {host: main_pid(host, "kimi-sglang") for host in TOPOLOGY} != serving
    # The leader was started before the worker (the hosts share one kernel, so one monotonic clock).
    started = {
        host: int(ssh(host, "systemctl show -p ExecMainStartTimestampMonotonic --value kimi-sglang"))
        for host in TOPOLOGY
    }
    assert 0 < started["kimi-h3"] < started["kimi-h4"]
    # The pool's only instance: said before anything changed, and the gap it caused after its smoke test.
    assert (
        "[kimi-h3] demo-sglang/serve: restarting the only instance (kimi-sglang): no service until it answers again"
        in run.log
    ), run.log[-3000:]
    gap = re.search(
        r"\[kimi-h3\] demo-sglang/serve: the only instance was without service for (\d+) s \(kimi-sglang answers again\)",
        run.log,
    )
    assert gap is not None, run.log[-3000:]
    assert int(gap[1]) < 600
    # Back to the demo recipe (another restart, checked again); then nothing to check.
    back = pyinfra()
    assert back.changed()["Communication check"] == list(TOPOLOGY)
    # the gap the smoke test recorded on the host, read back by the probe, said before this restart
    assert (
        f"restarting the only instance (kimi-sglang): no service until it answers again; its last restart: {gap[1]} s"
        in back.log
    ), back.log[-3000:]
    assert "Communication check" not in pyinfra().changed()


@contextmanager
def _dropped_on_h3(rule: str) -> Iterator[None]:
    """kimi-h3 drops what ``rule`` (an nftables rule of an input chain) matches, until the end."""
    ssh(
        "kimi-h3",
        "nft add table inet kimitest && nft add chain inet kimitest input "
        f"'{{ type filter hook input priority 0; }}' && nft add rule inet kimitest input {rule}",
    )
    try:
        yield
    finally:
        ssh("kimi-h3", "nft delete table inet kimitest")


@pytest.mark.parametrize(
    ("dropped", "label", "ports"),
    [
        # one port of the plan
        ("tcp dport 29500", "kimi-sglang dist_init", (29500, 29500)),
        # kimi-h3's ephemeral range (Linux's default, the hosts' own), to new connections only: the
        # replies to kimi-h3's own connections, whose local ports are of that range, and the plan's
        # ports (all below it) still pass, but NCCL's and Gloo's listeners would not be reached
        ("tcp dport 32768-60999 ct state new", "ephemeral range", (32768, 60999)),
    ],
)
def test_a_port_blocked_between_two_hosts_is_named_and_nothing_restarts(
    serving: dict[str, int], units: dict[str, str], tmp_path: Path, dropped: str, label: str, ports: tuple[int, int]
) -> None:
    with _dropped_on_h3(f"ip saddr {address('kimi-h4')} {dropped} drop"):
        run = pyinfra("--data", f"kimi_recipe={_restarting(tmp_path)}")
    assert run.code != 0
    assert sorted(run.errors()["Communication check"]) == list(TOPOLOGY)
    lines = _check_lines(run.log)
    assert set(lines) == set(TOPOLOGY)
    first = re.fullmatch(rf"kimi-h4 -> kimi-h3:(\d+) \({label}\): timed out", lines["kimi-h3"])
    assert first is not None, lines
    assert ports[0] <= int(first.group(1)) <= ports[1]
    assert lines["kimi-h4"] == lines["kimi-h3"]
    _untouched(serving, units)


def test_a_host_down_is_named_and_nothing_restarts(
    serving: dict[str, int], units: dict[str, str], tmp_path: Path
) -> None:
    veth = _veth("kimi-h4")
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)  # kimi-h4 is off the network
    try:
        run = pyinfra("--data", f"kimi_recipe={_restarting(tmp_path)}")
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
    assert run.code != 0
    lines = _check_lines(run.log)
    assert list(lines) == ["kimi-h3"]  # pyinfra could not reach kimi-h4 at all
    assert lines["kimi-h3"].startswith("kimi-h4 did not report (host down?"), lines
    _untouched(serving, units)


@pytest.fixture
def crawl() -> Iterator[None]:
    # Into kimi-h4 at 2 Mbit/s: SSH still works, the recipe asks for 200.
    veth = _veth("kimi-h4")
    subprocess.run(
        ["tc", "qdisc", "replace", "dev", veth, "root", "tbf", "rate", "2mbit", "burst", "32kb", "latency", "400ms"],
        check=True,
    )
    try:
        yield
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], check=False)


def test_a_link_shaped_to_a_crawl_is_named_with_its_rate_and_nothing_restarts(
    serving: dict[str, int], units: dict[str, str], crawl: None, tmp_path: Path
) -> None:
    run = pyinfra("--data", f"kimi_recipe={_restarting(tmp_path)}")
    assert run.code != 0
    lines = _check_lines(run.log)
    assert set(lines) == set(TOPOLOGY)
    line = lines["kimi-h3"]
    assert line.startswith("kimi-h3 -> kimi-h4: "), line
    assert line.endswith(" Mbit/s, needs >= 200 Mbit/s"), line
    assert float(line.split(": ")[1].split()[0]) < 5
    _untouched(serving, units)


def test_the_check_runs_alone_and_changes_nothing(serving: dict[str, int], units: dict[str, str]) -> None:
    def alone() -> tuple[int, str]:
        run = pyinfra(deploy="deploys/commcheck.py")
        return run.code, run.log

    code, log = alone()
    assert code == 0, log[-3000:]
    # The engines hold their ports: reaching them counts, and nothing is restarted.
    with _dropped_on_h3(f"ip saddr {address('kimi-h4')} tcp dport 30000 drop"):
        code, log = alone()
    assert code != 0
    assert _check_lines(log) == dict.fromkeys(TOPOLOGY, "kimi-h4 -> kimi-h3:30000 (kimi-gateway api): timed out")
    _untouched(serving, units)


def test_a_host_that_drops_off_during_the_run_fails_alone_and_its_instance_is_not_restarted(
    serving: dict[str, int], tmp_path: Path
) -> None:
    """kimi-h4, demo-sglang's worker, leaves the network once the communication check has passed
    (its link down as the first batch's files are written), in a run that restarts demo-vllm's
    engines too. kimi-h4 fails within a bound (its SSH connection's keepalive probes,
    kimi_pyinfra.dead_peers, rather than TCP's own minutes), named in the log; demo-sglang's
    leader on kimi-h3 is not restarted on its own (its files may be new, its engine is the one that
    ran); both vLLM hosts converge; back on the network, the next run completes it."""

    def edit(data: dict[str, Any]) -> None:
        for topology in ("demo-sglang", "demo-vllm"):
            data["topologies"][topology]["env"] = {"KIMI_DEMO_GENERATION": tmp_path.name}

    recipe = demo_recipe(tmp_path / "recipe.yaml", edit)
    vllm = {host: main_pid(host, "kimi-vllm") for host in ("kimi-h1", "kimi-h2")}
    veth = _veth("kimi-h4")
    started = time.monotonic()
    try:
        code, log = run_until(
            ["inventories/demo.py", "deploys/kimi.py", "--data", f"kimi_recipe={recipe}"],
            r"Starting operation: kimi \| Rendered units and configs\s*$",
            lambda _: subprocess.run(["ip", "link", "set", veth, "down"], check=True),
            0.0,
            {},
        )
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
    took = time.monotonic() - started
    assert code != 0, log[-4000:]
    said = host_lines(log, "kimi-deploy: ", ["kimi-h4"])["kimi-h4"]
    print(f"kimi-h4 off the network during the run: the run ended after {took:.0f} s; {said}")
    # one line naming it and why, not pyinfra's bare "Error: executed 0 commands"
    assert said == [f"kimi-h4: {LOST}"], log[-4000:]
    assert "[kimi-h4] Error: executed" not in log, log[-4000:]
    # within the keepalive's bound and the steps after it, not TCP's retransmissions (15 minutes)
    assert took < 240, log[-4000:]
    assert main_pid("kimi-h3", "kimi-sglang") == serving["kimi-h3"]
    for host, pid in vllm.items():
        assert main_pid(host, "kimi-vllm") != pid, host
    back = pyinfra("--data", f"kimi_recipe={recipe}")
    assert back.code == 0, back.log[-4000:]
    assert main_pid("kimi-h3", "kimi-sglang") != serving["kimi-h3"]
    assert pyinfra().code == 0
