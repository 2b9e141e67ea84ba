"""Who may open a connection to an engine's API port: the plan, the communication check, and the
rendered nftables table loaded by the real nft between two network namespaces."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kimi_deploy.errors import ConfigError
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.planner import plan
from kimi_deploy.plan.servespec import Unit
from kimi_deploy.recipe import Expose, KvTransfer, Recipe, SecretRef
from kimi_deploy.render.engine_guard import cleared, guarded
from kimi_deploy.render.files import environment
from kimi_deploy.serving.commcheck import check_request

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

RECIPE = "recipes/kimi-k3.1-pro.yaml"


def test_an_engine_behind_a_router_admits_the_routers_host_alone(recipe: Recipe, prod: Inventory) -> None:
    full = plan(recipe, RECIPE, prod, "gb300-pd")
    router = full.for_host("gb300-rt01")
    leaders = [h for h in full.hosts if h.node_role in ("leader", "single")]
    assert leaders
    for host in leaders:
        (engine,) = host.units
        assert engine.guard is not None, host.host
        assert (engine.guard.port, engine.guard.admits) == (engine.listens["api"], (router.address,))
        assert engine.guard.file in engine.files
    # the router host's own units are not engines: the gateway takes clients there
    assert all(u.guard is None for u in router.units)


def test_an_engine_on_loopback_needs_no_guard_and_an_exposed_one_without_router_is_behind_a_gateway(
    recipe: Recipe, prod: Inventory
) -> None:
    (single,) = plan(recipe, RECIPE, prod, "single-node").hosts
    assert single.units[0].guard is None
    topo = recipe.topologies["single-node"].model_copy(
        update={"expose": Expose(bind="address", api_key=SecretRef(env="KIMI_API_KEY"))}
    )
    exposed = recipe.model_copy(update={"topologies": {**recipe.topologies, "single-node": topo}})
    (host,) = plan(exposed, RECIPE, prod, "single-node").hosts
    engine, gateway = host.units
    # the engine answers some routes without its key: it stays on loopback, off the API port
    assert (engine.bind, engine.listens["api"], engine.guard) == ("127.0.0.1", topo.ports.api_backend, None)
    assert engine.argv[engine.argv.index("--host") + 1 :][:3] == ("127.0.0.1", "--port", str(topo.ports.api_backend))
    # the gateway takes the API port on the address, and the engine's table there admits everyone
    assert (gateway.kind, gateway.bind, gateway.listens) == ("gateway", host.address, {"api": 8000})
    assert gateway.guard is not None
    assert (gateway.guard.table, gateway.guard.port, gateway.guard.admits) == ("kimi_vllm", 8000, None)
    assert gateway.guard.file in gateway.files


def test_the_communication_check_reaches_a_guarded_api_from_admitted_hosts_alone(
    recipe: Recipe, prod: Inventory
) -> None:
    full = plan(recipe, RECIPE, prod, "gb300-pd")
    hosts = full.topology("gb300-pd")
    api = full.for_host("gb300-p01").units[0].listens["api"]
    from_router = check_request(recipe, full.for_host("gb300-rt01"), hosts, "run1")
    from_decode = check_request(recipe, full.for_host("gb300-d01"), hosts, "run1")
    prefill = "gb300-p01"
    assert api in {p["port"] for p in next(p for p in from_router["peers"] if p["host"] == prefill)["ports"]}
    assert api not in {p["port"] for p in next(p for p in from_decode["peers"] if p["host"] == prefill)["ports"]}
    # the engine still listens for the check on it: the router's host comes
    assert api in {p["port"] for p in check_request(recipe, full.for_host(prefill), hosts, "run1")["listen"]}


def test_a_router_named_by_hostname_is_refused_in_one_line(recipe: Recipe, prod: Inventory) -> None:
    named = "gb300-rt01.cluster.example"
    hosts = tuple(dataclasses.replace(h, address=named) if h.name == "gb300-rt01" else h for h in prod.hosts)
    # without the Mooncake store (whose master asks the same of its hosts), the engines' guard asks it
    kv = KvTransfer(connectors=["NixlConnector"], transport="rdma")
    topo = recipe.topologies["gb300-pd"].model_copy(update={"kv_transfer": kv})
    pd = recipe.model_copy(update={"topologies": {**recipe.topologies, "gb300-pd": topo}})
    with pytest.raises(ConfigError) as err:
        plan(pd, RECIPE, dataclasses.replace(prod, hosts=hosts), "gb300-pd")
    assert str(err.value) == (
        "inventories/prod.py: host gb300-rt01: kimi_address: topology gb300-pd's engines let in their router's "
        f"host by IP address (an nftables rule on their API port): set the host's IP address, found '{named}'"
    )


def _rendered(unit: Unit) -> str:
    assert unit.guard is not None
    config = unit.files[unit.guard.file]
    return environment().get_template(config.template).render(**config.data)


def _engine(admits: tuple[str, ...]) -> Unit:
    bare = Unit("kimi-vllm", "engine", 1, "test", ("vllm",), {}, {"api": 18000}, "10.213.250.1")
    return guarded(bare, "/etc/kimi", admits)


def _gateway() -> Unit:
    """The gateway that took port 18000 in front of kimi-vllm, now on loopback."""
    bare = Unit("kimi-gateway", "gateway", 3, "test", ("nginx",), {}, {"api": 18000}, "10.213.250.1")
    return cleared(bare, "/etc/kimi", "kimi-vllm", 18000)


nft = shutil.which("nft") or ""
ip = shutil.which("ip") or ""


@contextlib.contextmanager
def _two_namespaces() -> Iterator[tuple[str, str]]:
    """Namespaces ``a`` (10.213.250.1) and ``b`` (10.213.250.2), joined by a veth pair."""
    a, b = f"kimi-guard-a-{os.getpid()}", f"kimi-guard-b-{os.getpid()}"
    try:
        for ns in (a, b):
            subprocess.run([ip, "netns", "add", ns], check=True)
        subprocess.run([ip, "link", "add", "kgA", "netns", a, "type", "veth", "peer", "kgB", "netns", b], check=True)
        for ns, dev, addr in ((a, "kgA", "10.213.250.1/30"), (b, "kgB", "10.213.250.2/30")):
            subprocess.run([ip, "-n", ns, "addr", "add", addr, "dev", dev], check=True)
            subprocess.run([ip, "-n", ns, "link", "set", dev, "up"], check=True)
            subprocess.run([ip, "-n", ns, "link", "set", "lo", "up"], check=True)
        yield a, b
    finally:
        for ns in (a, b):
            subprocess.run([ip, "netns", "del", ns], check=False, capture_output=True)


def _connects(ns: str, address: str, port: int) -> str:
    """What a connection from namespace ``ns`` to ``address:port`` gets."""
    probe = (
        "import socket\n"
        "s = socket.socket(); s.settimeout(3)\n"
        f"try: s.connect(({address!r}, {port})); print('connected')\n"
        "except ConnectionRefusedError: print('refused')\n"
        "except OSError as e: print(type(e).__name__)\n"
    )
    out = subprocess.run(
        [ip, "netns", "exec", ns, "python3", "-c", probe], check=False, capture_output=True, text=True, timeout=20
    )
    return str(out.stdout).strip()


@pytest.mark.skipif(
    not nft or not ip or os.geteuid() != 0,
    reason="needs root, iproute2 and nftables (scripts/test installs it)",
)
def test_the_real_nft_loads_the_table_twice_and_resets_every_host_but_the_admitted(tmp_path: Path) -> None:
    with _two_namespaces() as (a, b):
        listener = subprocess.Popen(
            [
                ip,
                "netns",
                "exec",
                a,
                "python3",
                "-c",
                "import socket, time\ns = socket.create_server(('0.0.0.0', 18000))\ntime.sleep(60)",
            ],
        )
        try:
            for _ in range(50):
                if _connects(a, "127.0.0.1", 18000) == "connected":
                    break
            assert _connects(b, "10.213.250.1", 18000) == "connected"
            for admits, from_b in ((("10.213.250.9",), "refused"), (("10.213.250.2",), "connected")):
                script = tmp_path / "guard.nft"
                script.write_text(_rendered(_engine(admits)), encoding="utf-8")
                # loaded as the unit loads it, before each start: a second load replaces the first
                for _ in range(2):
                    subprocess.run([ip, "netns", "exec", a, nft, "-f", str(script)], check=True)
                assert _connects(b, "10.213.250.1", 18000) == from_b, admits
                # the host itself, on loopback and on its own address, always gets in
                assert _connects(a, "127.0.0.1", 18000) == "connected"
                assert _connects(a, "10.213.250.1", 18000) == "connected"
            # a gateway that takes the port (the topology lost its router) loads the engine's table
            # as one that admits everyone, and replaces the table that admitted a router alone
            script.write_text(_rendered(_engine(("10.213.250.9",))), encoding="utf-8")
            subprocess.run([ip, "netns", "exec", a, nft, "-f", str(script)], check=True)
            assert _connects(b, "10.213.250.1", 18000) == "refused"
            script.write_text(_rendered(_gateway()), encoding="utf-8")
            subprocess.run([ip, "netns", "exec", a, nft, "-f", str(script)], check=True)
            assert _connects(b, "10.213.250.1", 18000) == "connected"
        finally:
            listener.kill()
            listener.wait()
