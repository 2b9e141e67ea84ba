"""Units of a topology's router host: the router (over prefill/decode pools, or over the
independent instances of a serve pool) and the Mooncake master (the gateway in front of every
router is ``kimi_deploy.render.gateway``)."""

from __future__ import annotations

from kimi_deploy.engines import engine
from kimi_deploy.plan.listen import LOOPBACK
from kimi_deploy.plan.placement import TopologyPlacement
from kimi_deploy.plan.servespec import Unit
from kimi_deploy.recipe import MOONCAKE_PACKAGE, Recipe, Topology
from kimi_deploy.releases.host_paths import router_dir, store_dir

ROUTER_UNIT = "kimi-router"
# Each router's gauge of an engine's health on its Prometheus page, one sample per engine labelled
# worker="URL", 1 while it sends to the engine: read off the real routers' /metrics (vllm-router
# 0.1.17, sglang-router 0.3.2; tests/localcluster/test_standins.py holds vllm-router to it).
HEALTH_GAUGES = {"vllm-router": "vllm_router_worker_health", "sglang-router": "smg_worker_health"}
# Each router's gauge of an engine's circuit breaker, labelled alike: 1 while open (vllm-router
# 0.1.17's /metrics; sglang-router 0.3.2's name as its binary holds it). The gauge changes only when
# a request comes: an open circuit admits trial requests once its time is up, whatever it says.
CIRCUIT_GAUGES = {"vllm-router": "vllm_router_cb_state", "sglang-router": "smg_worker_cb_state"}
MOONCAKE_UNIT = "kimi-mooncake-master"


def router_unit(recipe: Recipe, tp: TopologyPlacement) -> Unit:
    topo = tp.topology
    assert topo.router is not None
    assert tp.router is not None
    package = topo.router.package
    version = recipe.routers[package].version
    # vllm-router and sglang-router check no client key: the router listens on loopback, behind
    # the gateway (kimi_deploy.render.gateway) that takes the topology's address and port and checks it.
    bind, port = LOOPBACK, topo.ports.router_backend
    argv: list[str] = [f"{router_dir(recipe, package)}/bin/{package}"]
    serve = tp.leaders("serve")
    if serve:
        # Regular routing over independent instances: both routers spell it --worker-urls
        # (vllm-router 0.1.17's --help: "Regular mode: vllm-router --worker-urls http://worker1:8000
        # http://worker2:8000"; SGLang's router guide, docs.sglang.io/advanced_features/router.html,
        # launches sglang_router.launch_router with the same flag).
        argv += ["--worker-urls", *(worker_url(topo, leader.host.address) for leader in serve)]
    elif package == "vllm-router":
        argv += ["--vllm-pd-disaggregation"]
        kv = topo.kv_transfer
        if kv is not None:
            argv += ["--kv-connector", "nixl" if "NixlConnector" in kv.connectors else "mooncake"]
        for leader in tp.leaders("prefill"):
            argv += ["--prefill", worker_url(topo, leader.host.address)]
    else:
        argv += ["--pd-disaggregation"]
        for leader in tp.leaders("prefill"):
            argv += ["--prefill", worker_url(topo, leader.host.address), str(topo.ports.bootstrap)]
    for leader in tp.leaders("decode"):
        argv += ["--decode", worker_url(topo, leader.host.address)]
    argv += ["--host", bind, "--port", str(port), "--policy", topo.router.policy]
    # Both routers' runtime health checks (vllm-router 0.1.17 and sglang-router 0.3.2 spell them
    # alike): how soon an engine gone or back leaves or rejoins the rotation.
    health = topo.router.health
    argv += [
        "--health-check-interval-secs",
        str(health.interval_s),
        "--health-check-timeout-secs",
        str(health.timeout_s),
        "--health-failure-threshold",
        str(health.failures),
        "--health-success-threshold",
        str(health.successes),
        "--cb-timeout-duration-secs",
        str(health.circuit_open_s),
    ]
    # Its metrics on loopback at a port of the recipe's: the converge reads its health gauges
    # there between batches (hostside/router_view.py).
    argv += ["--prometheus-host", LOOPBACK, "--prometheus-port", str(topo.ports.router_metrics)]
    return Unit(
        name=ROUTER_UNIT,
        kind="router",
        stage=3,
        description=f"Kimi {recipe.model.served_name} {package} {version} ({tp.name} router)",
        argv=tuple(argv),
        env={},
        listens={"router_backend": port},
        bind=bind,
        local_listens={"router_metrics": topo.ports.router_metrics},
        # vllm-router 0.1.17 sends the engines "Bearer $OPENAI_API_KEY" from its own environment,
        # not the client's key (tests/localcluster/test_standins.py::test_vllm_router_keys_contract,
        # run against the real router): the topology's key, from its secret file, never in argv.
        secret_env=("OPENAI_API_KEY",) if topo.expose is not None else (),
    )


def worker_url(topo: Topology, address: str) -> str:
    """The URL a topology's router knows the engine instance led from ``address`` by."""
    return f"http://{address}:{engine(topo.engine).api_port(topo)}"


def mooncake_master_unit(recipe: Recipe, tp: TopologyPlacement) -> Unit | None:
    """The Mooncake store's master, from its own release (``stores``: mooncake-transfer-engine).

    mooncake_master 0.3.13.post1 binds its HTTP metadata server to every address whatever
    ``--http_metadata_server_host`` says (measured: ``ss -ltn`` shows 0.0.0.0:8080; its RPC and
    metrics ports follow their flags), and neither checks a key: the unit lets in loopback and the
    topology's own hosts alone (systemd's IPAddressAllow=), and its metrics stay on loopback."""
    if not tp.topology.mooncake_master:
        return None
    topo = tp.topology
    assert topo.router is not None
    assert tp.router is not None
    address = tp.router.address
    ports = topo.ports
    argv = (
        f"{store_dir(recipe, MOONCAKE_PACKAGE)}/bin/mooncake_master",
        f"--rpc_port={ports.mooncake_master}",
        f"--rpc_address={address}",
        "--enable_http_metadata_server=true",
        f"--http_metadata_server_host={address}",
        f"--http_metadata_server_port={ports.mooncake_metadata}",
        f"--metrics_host={LOOPBACK}",
        f"--metrics_port={ports.mooncake_metrics}",
    )
    return Unit(
        name=MOONCAKE_UNIT,
        kind="mooncake-master",
        stage=0,
        description=f"Kimi {recipe.model.served_name} Mooncake master ({tp.name})",
        argv=argv,
        env={},
        listens={"mooncake_master": ports.mooncake_master, "mooncake_metadata": ports.mooncake_metadata},
        local_listens={"mooncake_metrics": ports.mooncake_metrics},
        bind=address,
        # its own host's address too: a packet from the host to its own address is not loopback's
        peers=tuple(dict.fromkeys([address, *(p.host.address for p in tp.engines)])),
    )
