"""The hosted API as the router's fallback: a gateway takes the router's address, the router moves
to loopback behind it, and both keys stay in the gateway's secret file."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from kimi_deploy.inventory import Inventory
from kimi_deploy.planner import plan
from kimi_deploy.recipe import load_recipe
from kimi_deploy.render import render_host

ROOT = Path(__file__).resolve().parents[1]


def test_the_gateway_fronts_the_router_and_holds_both_keys(prod: Inventory, tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "recipes/kimi-k3.1-pro.yaml").read_text(encoding="utf-8"))
    data["topologies"]["gb300-pd"]["router"]["fallback"] = {
        "url": "https://api.moonshot.ai",
        "api_key": {"env": "KIMI_HOSTED_API_KEY"},
        "model": "kimi-k3.1-pro",
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    recipe = load_recipe(path)
    host = plan(recipe, str(path), prod).for_host("gb300-rt01")
    units = {u.name: u for u in host.units}
    router, gateway = units["kimi-router"], units["kimi-gateway"]
    assert (router.bind, dict(router.listens)) == ("127.0.0.1", {"router_backend": 8009})
    assert (gateway.bind, dict(gateway.listens)) == ("10.41.0.50", {"router": 8000})
    assert router.argv[router.argv.index("--host") + 1 : router.argv.index("--port") + 2] == (
        "127.0.0.1", "--port", "8009",
    )  # fmt: skip
    files = {f.path: f for f in render_host(recipe, host, {"KIMI_API_KEY": "local-key", "KIMI_FALLBACK_API_KEY": "hosted-key",
                                                           "VLLM_API_KEY": "local-key", "api-key": "local-key"})}  # fmt: skip
    secret = files["/etc/kimi/secrets/kimi-gateway.env"]
    assert (secret.secret, secret.mode, secret.owner) == (True, 0o600, recipe.paths.user)
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
