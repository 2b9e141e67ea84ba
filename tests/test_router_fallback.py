"""The hosted API as the router's fallback: a gateway takes the router's address, the router moves
to loopback behind it, and both keys stay in the gateway's secret file."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kimi_deploy.errors import ConfigError
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.planner import plan
from kimi_deploy.plan.servespec import HostPlan
from kimi_deploy.recipe import Recipe
from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.render.files import render_host
from kimi_deploy.render.gateway import MAX_CONNECTIONS, worker_connections
from tests.unit_file import directives

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[1]
SECRETS = {
    "KIMI_API_KEY": "local-key",
    "KIMI_FALLBACK_API_KEY": "hosted-key",
    "VLLM_API_KEY": "local-key",
    "OPENAI_API_KEY": "local-key",
    "api-key": "local-key",
}


def _with_fallback(prod: Inventory, tmp_path: Path, **more: object) -> tuple[Recipe, HostPlan]:
    data = yaml.safe_load((ROOT / "recipes/kimi-k3.1-pro.yaml").read_text(encoding="utf-8"))
    data["topologies"]["gb300-pd"]["router"]["fallback"] = {
        "url": "https://api.moonshot.ai",
        "api_key": {"env": "KIMI_HOSTED_API_KEY"},
        "model": "kimi-k3.1-pro",
        **more,
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
        "127.0.0.1",
        "--port",
        "8009",
    )
    assert gateway.argv == ("/usr/sbin/nginx", "-c", "/etc/kimi/kimi-gateway/nginx.conf", "-e", "stderr")
    files = {f.path: f for f in render_host(recipe, host, SECRETS)}
    keys = files["/etc/kimi/secrets/kimi-gateway-keys.conf"]
    assert (keys.secret, keys.mode, keys.owner) == (True, 0o600, "root")
    # The client key as the digest of the header clients send; the hosted key as it is sent.
    assert f'default "{hashlib.sha256(b"Bearer local-key").hexdigest()}";' in keys.content
    assert "local-key" not in keys.content
    assert 'default "Bearer hosted-key";' in keys.content
    # The smoke test's copy of the client key; the hosted key is in the credential alone.
    env = files["/etc/kimi/secrets/kimi-gateway.env"]
    assert (env.secret, env.mode, env.owner, env.content.count("=")) == (True, 0o600, "root", 1)
    assert "hosted-key" not in env.content
    config = files["/etc/kimi/kimi-gateway/nginx.conf"].content
    assert 'listen "10.41.0.50:8000";' in config
    assert 'server "127.0.0.1:8009";' in config
    assert 'include "/run/credentials/kimi-gateway.service/kimi-gateway-keys.conf";' in config
    # The hosted API over TLS, its certificate checked, its own Host.
    assert 'proxy_pass "https://api.moonshot.ai";' in config
    assert "proxy_ssl_verify on;" in config
    assert 'proxy_set_header Host "api.moonshot.ai";' in config
    script = files["/etc/kimi/kimi-gateway/gateway.js"].content
    assert f'var SERVED = "{recipe.model.served_name}";' in script
    assert 'var HOSTED = "kimi-k3.1-pro";' in script
    # Each fallback answer bounded by the topology's context unless the recipe says less.
    assert f"var MAX_TOKENS = {recipe.topologies['gb300-pd'].max_model_len};" in script
    for f in files.values():
        if not f.secret:
            assert "hosted-key" not in f.content
            assert "local-key" not in f.content
    assert all("key" not in word for word in router.argv)


def test_the_recipe_bounds_each_fallback_answer(prod: Inventory, tmp_path: Path) -> None:
    recipe, host = _with_fallback(prod, tmp_path, max_tokens=2048)
    files = {f.path: f for f in render_host(recipe, host, SECRETS)}
    assert "var MAX_TOKENS = 2048;" in files["/etc/kimi/kimi-gateway/gateway.js"].content


def test_a_key_nginx_could_not_read_back_is_refused_without_showing_it(prod: Inventory, tmp_path: Path) -> None:
    recipe, host = _with_fallback(prod, tmp_path)
    with pytest.raises(ConfigError) as refused:
        render_host(recipe, host, {**SECRETS, "KIMI_FALLBACK_API_KEY": 'hosted"; } include /etc/shadow; #'})
    assert "is not allowed in an nginx value" in str(refused.value)
    assert "shadow" not in str(refused.value)


def test_the_gateway_runs_as_a_user_of_its_own_within_bounds(prod: Inventory, tmp_path: Path) -> None:
    recipe, host = _with_fallback(prod, tmp_path)
    files = {f.path: f for f in render_host(recipe, host, SECRETS)}
    unit = directives(files["/etc/systemd/system/kimi-gateway.service"].content)
    # Not the engine user: the engines, the router and the Mooncake master (each its own user)
    # cannot read the gateway's memory, environment or keys, nor signal it.
    assert (unit["User"], unit["DynamicUser"]) == (["kimi-gateway"], ["yes"])
    assert recipe.paths.user not in unit["User"] + unit["Group"]
    assert unit["LoadCredential"] == ["kimi-gateway-keys.conf:/etc/kimi/secrets/kimi-gateway-keys.conf"]
    assert files["/etc/kimi/secrets/kimi-gateway-keys.conf"].owner == "root"
    # Room for nginx's one worker and its connections (two descriptors per client), no more.
    assert int(unit["TasksMax"][0]) <= 16
    assert worker_connections(MAX_CONNECTIONS) < int(unit["LimitNOFILE"][0]) <= 2 * worker_connections(MAX_CONNECTIONS)
    assert unit["MemoryMax"] == ["2G"]
    # The router beside it, holding the topology's key, is a user of its own too.
    router = directives(files["/etc/systemd/system/kimi-router.service"].content)
    assert (router["User"], router["DynamicUser"]) == (["kimi-router"], ["yes"])


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
