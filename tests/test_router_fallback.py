"""The hosted API as the router's fallback: a gateway takes the router's address, the router moves
to loopback behind it, and both keys stay in the gateway's secret file."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from hostside.gateway import MAX_CONNECTIONS
from kimi_deploy.inventory import Inventory
from kimi_deploy.planner import plan
from kimi_deploy.recipe import Recipe, load_recipe
from kimi_deploy.render import render_host
from kimi_deploy.servespec import HostPlan
from tests.unit_file import directives

ROOT = Path(__file__).resolve().parents[1]
SECRETS = {"KIMI_API_KEY": "local-key", "KIMI_FALLBACK_API_KEY": "hosted-key", "VLLM_API_KEY": "local-key",
           "api-key": "local-key"}  # fmt: skip


def _with_fallback(prod: Inventory, tmp_path: Path) -> tuple[Recipe, HostPlan]:
    data = yaml.safe_load((ROOT / "recipes/kimi-k3.1-pro.yaml").read_text(encoding="utf-8"))
    data["topologies"]["gb300-pd"]["router"]["fallback"] = {
        "url": "https://api.moonshot.ai",
        "api_key": {"env": "KIMI_HOSTED_API_KEY"},
        "model": "kimi-k3.1-pro",
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    recipe = load_recipe(path)
    return recipe, plan(recipe, str(path), prod).for_host("gb300-rt01")


def test_the_gateway_fronts_the_router_and_holds_both_keys(prod: Inventory, tmp_path: Path) -> None:
    recipe, host = _with_fallback(prod, tmp_path)
    units = {u.name: u for u in host.units}
    router, gateway = units["kimi-router"], units["kimi-gateway"]
    assert (router.bind, dict(router.listens)) == ("127.0.0.1", {"router_backend": 8009})
    assert (gateway.bind, dict(gateway.listens)) == ("10.41.0.50", {"router": 8000})
    assert router.argv[router.argv.index("--host") + 1 : router.argv.index("--port") + 2] == (
        "127.0.0.1", "--port", "8009",
    )  # fmt: skip
    files = {f.path: f for f in render_host(recipe, host, SECRETS)}
    secret = files["/etc/kimi/secrets/kimi-gateway.env"]
    assert (secret.secret, secret.mode, secret.owner) == (True, 0o600, "root")
    assert "hosted-key" in secret.content
    assert "local-key" in secret.content
    config = json.loads(files["/etc/kimi/kimi-gateway.json"].content)
    assert config == {
        "bind": "10.41.0.50", "port": 8000, "backend": "http://127.0.0.1:8009",
        "fallback": {"url": "https://api.moonshot.ai", "model": "kimi-k3.1-pro"},
        "served_name": recipe.model.served_name, "health_every_s": 2.0, "timeout_s": 600,
    }  # fmt: skip
    for f in files.values():
        if not f.secret:
            assert "hosted-key" not in f.content
    assert all("key" not in word for word in gateway.argv + router.argv)


def test_the_gateway_runs_as_a_user_of_its_own_within_bounds(prod: Inventory, tmp_path: Path) -> None:
    recipe, host = _with_fallback(prod, tmp_path)
    files = {f.path: f for f in render_host(recipe, host, SECRETS)}
    unit = directives(files["/etc/systemd/system/kimi-gateway.service"].content)
    # Not the engine user: the engines, the router and the Mooncake master (all running as it)
    # cannot read the gateway's memory, environment or keys, nor signal it.
    assert (unit["User"], unit["DynamicUser"]) == (["kimi-gateway"], ["yes"])
    assert recipe.paths.user not in unit["User"] + unit["Group"]
    assert unit["EnvironmentFile"][-1] == "/etc/kimi/secrets/kimi-gateway.env"
    assert files["/etc/kimi/secrets/kimi-gateway.env"].owner == "root"
    # Room for every connection the program serves (a thread and two descriptors each), no more.
    assert MAX_CONNECTIONS < int(unit["TasksMax"][0]) <= MAX_CONNECTIONS + 100
    assert 2 * MAX_CONNECTIONS < int(unit["LimitNOFILE"][0]) <= 8 * MAX_CONNECTIONS
    assert unit["MemoryMax"] == ["2G"]
    # The router beside it still runs as the engine user.
    assert directives(files["/etc/systemd/system/kimi-router.service"].content)["User"] == [recipe.paths.user]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_gateway_unit_and_rates_it_ok(prod: Inventory, tmp_path: Path) -> None:
    recipe, host = _with_fallback(prod, tmp_path)
    (gateway,) = [f for f in render_host(recipe, host, SECRETS) if f.path.endswith("/kimi-gateway.service")]
    path = tmp_path / "kimi-gateway.service"
    path.write_text(gateway.content, encoding="utf-8")
    verify = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True, check=False
    )
    assert [line for line in (verify.stdout + verify.stderr).splitlines() if line.strip()] == []
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    score = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", security.stdout)
    assert score is not None, security.stdout[-500:]
    assert (float(score.group(1)) <= 4.0, score.group(2)) == (True, "OK")
