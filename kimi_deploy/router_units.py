"""Units of the router host of a prefill/decode topology: the router and the Mooncake master."""

from __future__ import annotations

from kimi_deploy.host_paths import engine_dir, router_dir
from kimi_deploy.listen import LOOPBACK, api_port, bind_address
from kimi_deploy.placement import TopologyPlacement
from kimi_deploy.recipe import Recipe
from kimi_deploy.servespec import ConfigFile, Unit

ROUTER_UNIT = "kimi-router"
MOONCAKE_UNIT = "kimi-mooncake-master"
GATEWAY_UNIT = "kimi-gateway"


def _needs_mooncake_master(tp: TopologyPlacement) -> bool:
    kv = tp.topology.kv_transfer
    return kv is not None and "MooncakeStoreConnector" in kv.connectors


def router_unit(recipe: Recipe, tp: TopologyPlacement) -> Unit:
    topo = tp.topology
    assert topo.router is not None
    assert tp.router is not None
    package = topo.router.package
    version = recipe.routers[package].version
    bind = bind_address(topo, tp.router)
    port = topo.ports.router
    label = "router"
    if topo.router.fallback is not None:
        # The gateway takes the router's address and port; the router answers it on loopback.
        bind, port, label = LOOPBACK, topo.ports.router_backend, "router_backend"
    upstream = api_port(topo)
    argv: list[str] = [f"{router_dir(recipe, package)}/bin/{package}"]
    if package == "vllm-router":
        argv += ["--vllm-pd-disaggregation"]
        kv = topo.kv_transfer
        if kv is not None:
            argv += ["--kv-connector", "nixl" if "NixlConnector" in kv.connectors else "mooncake"]
        for leader in tp.leaders("prefill"):
            argv += ["--prefill", f"http://{leader.host.address}:{upstream}"]
    else:
        argv += ["--pd-disaggregation"]
        for leader in tp.leaders("prefill"):
            argv += ["--prefill", f"http://{leader.host.address}:{upstream}", str(topo.ports.bootstrap)]
    for leader in tp.leaders("decode"):
        argv += ["--decode", f"http://{leader.host.address}:{upstream}"]
    argv += ["--host", bind, "--port", str(port), "--policy", topo.router.policy]
    return Unit(
        name=ROUTER_UNIT,
        kind="router",
        stage=3,
        description=f"Kimi {recipe.model.served_name} {package} {version} ({tp.name} router)",
        argv=tuple(argv),
        env={},
        listens={label: port},
        bind=bind,
        # The router passes each client's bearer token on to the engines, so it holds no key of its
        # own in argv; the deploy's smoke test through it reads the key from its secret file.
        secret_env=("VLLM_API_KEY",) if topo.expose is not None and label == "router" else (),
    )


def gateway_unit(recipe: Recipe, tp: TopologyPlacement) -> Unit | None:
    """With ``router.fallback``: the gateway in front of the router (hostside/gateway.py). It
    answers clients that bear the topology's key, through the router while the router is healthy,
    else through the hosted API with the hosted key; both keys come from its secret file."""
    topo = tp.topology
    if topo.router is None or topo.router.fallback is None:
        return None
    assert tp.router is not None
    fallback = topo.router.fallback
    config = f"{recipe.paths.config}/{GATEWAY_UNIT}.json"
    bind = bind_address(topo, tp.router)
    data = {
        "bind": bind,
        "port": topo.ports.router,
        "backend": f"http://{LOOPBACK}:{topo.ports.router_backend}",
        "fallback": {"url": fallback.url, "model": fallback.model},
        "served_name": recipe.model.served_name,
        "health_every_s": 2.0,
        "timeout_s": 600,
    }
    return Unit(
        name=GATEWAY_UNIT,
        kind="gateway",
        stage=3,
        description=f"Kimi {recipe.model.served_name} gateway with the hosted API as fallback ({tp.name})",
        argv=("/usr/bin/python3", f"{recipe.paths.tools}/{GATEWAY_UNIT}.py", "--config", config),
        env={},
        listens={"router": topo.ports.router},
        bind=bind,
        secret_env=("KIMI_API_KEY", "KIMI_FALLBACK_API_KEY"),
        files={config: ConfigFile("json.j2", {"value": data})},
    )


def mooncake_master_unit(recipe: Recipe, tp: TopologyPlacement) -> Unit | None:
    """The Mooncake store's master, from the engine's own release (mooncake-transfer-engine)."""
    if not _needs_mooncake_master(tp):
        return None
    topo = tp.topology
    assert tp.router is not None
    address = tp.router.address
    ports = topo.ports
    argv = (
        f"{engine_dir(recipe, topo.engine)}/bin/mooncake_master",
        f"--port={ports.mooncake_master}",
        f"--rpc_address={address}",
        "--enable_http_metadata_server=true",
        f"--http_metadata_server_host={address}",
        f"--http_metadata_server_port={ports.mooncake_metadata}",
    )
    return Unit(
        name=MOONCAKE_UNIT,
        kind="mooncake-master",
        stage=0,
        description=f"Kimi {recipe.model.served_name} Mooncake master ({tp.name})",
        argv=argv,
        env={},
        listens={"mooncake_master": ports.mooncake_master, "mooncake_metadata": ports.mooncake_metadata},
        bind=address,
    )
