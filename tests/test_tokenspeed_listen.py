"""Where ``tokenspeed serve`` listens besides its API: its smg gateway's Prometheus exporter and its
control server, both on loopback at ports the plan declares (TokenSpeed 0.1.1 left alone binds the
exporter on 0.0.0.0 at a port drawn at each start, and the control server checks no key)."""

from __future__ import annotations

import pytest

from kimi_deploy.errors import ConfigError
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.planner import plan
from kimi_deploy.plan.servespec import HostPlan, Unit
from kimi_deploy.recipe import Recipe
from kimi_deploy.releases.catalog import load_catalog
from tests.conftest import RECIPE


def _unit(hosts: tuple[HostPlan, ...], host: str) -> Unit:
    (unit,) = (u for h in hosts if h.host == host for u in h.units if u.name == "kimi-tokenspeed")
    return unit


def _value(argv: tuple[str, ...], flag: str) -> str | None:
    """The value of ``flag`` in ``argv``, or None where it is absent; present once at most."""
    assert argv.count(flag) <= 1, flag
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_the_gateway_exporter_binds_loopback_at_a_declared_port(recipe: Recipe, prod: Inventory) -> None:
    unit = _unit(plan(recipe, RECIPE, prod, "tokenspeed-single").hosts, "b300-02")
    assert _value(unit.argv, "--prometheus-host") == "127.0.0.1"
    # ports.router_metrics, the smg router's own default, not one drawn at each start
    assert _value(unit.argv, "--prometheus-port") == "29000"
    assert unit.local_listens["gateway_metrics"] == 29000
    # on loopback alone: not among the ports the communication check opens between hosts
    assert 29000 not in unit.listens.values()


def test_the_control_server_port_is_declared(recipe: Recipe, prod: Inventory) -> None:
    unit = _unit(plan(recipe, RECIPE, prod, "tokenspeed-single").hosts, "b300-02")
    # It binds --host: the API's address, loopback for every TokenSpeed topology.
    assert unit.bind == "127.0.0.1"
    assert _value(unit.argv, "--host") == "127.0.0.1"
    assert _value(unit.argv, "--control-port") == "8001"
    assert dict(unit.local_listens) == {"gateway_metrics": 29000, "control": 8001}
    assert unit.every_port() == {"api": 8000, "gateway_metrics": 29000, "control": 8001}


def test_only_rank_0_runs_the_gateway_and_the_control_server(recipe: Recipe, prod: Inventory) -> None:
    hosts = plan(recipe, RECIPE, prod, "tokenspeed-multi").hosts
    leader, worker = _unit(hosts, "h200-01"), _unit(hosts, "h200-02")
    assert dict(leader.local_listens) == {"gateway_metrics": 29000, "control": 8001}
    assert _value(leader.argv, "--prometheus-host") == "127.0.0.1"
    # Other ranks run the engine alone (tokenspeed/cli/serve_smg.py:872-879): nothing to move.
    assert dict(worker.local_listens) == {}
    assert not {"--prometheus-host", "--prometheus-port", "--control-port"} & set(worker.argv)


@pytest.mark.parametrize("topology", ["tokenspeed-single", "tokenspeed-multi"])
def test_every_flag_is_the_releases(recipe: Recipe, prod: Inventory, topology: str) -> None:
    catalog = load_catalog("tokenspeed", "0.1.1")
    for host in plan(recipe, RECIPE, prod, topology).hosts:
        for unit in host.units:
            assert catalog.problems(unit.argv, len(catalog.launch)) == []


def _with_api_port(recipe: Recipe, port: int) -> Recipe:
    topo = recipe.topologies["tokenspeed-single"]
    ports = topo.ports.model_copy(update={"api": port})
    changed = topo.model_copy(update={"ports": ports})
    return recipe.model_copy(update={"topologies": {**recipe.topologies, "tokenspeed-single": changed}})


def test_a_control_port_taken_by_the_exporter_is_refused_at_plan_time(recipe: Recipe, prod: Inventory) -> None:
    with pytest.raises(ConfigError) as err:
        plan(_with_api_port(recipe, 28999), RECIPE, prod, "tokenspeed-single")
    assert str(err.value) == (
        f"{RECIPE}: topologies.tokenspeed-single.ports: host b300-02: kimi-tokenspeed gateway_metrics and "
        "kimi-tokenspeed control both use port 29000"
    )


def test_an_api_port_that_leaves_no_control_port_is_refused(recipe: Recipe, prod: Inventory) -> None:
    with pytest.raises(ConfigError) as err:
        plan(_with_api_port(recipe, 65535), RECIPE, prod, "tokenspeed-single")
    assert str(err.value) == (
        f"{RECIPE}: topologies.tokenspeed-single.ports.api: TokenSpeed's control server takes the API port + 1: "
        "65535 leaves none"
    )
