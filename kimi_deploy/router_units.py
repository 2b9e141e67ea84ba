"""Units of the router host of a prefill/decode topology: the router and the Mooncake master (the
gateway in front of a router with a fallback is ``kimi_deploy.gateway``)."""

from __future__ import annotations

from kimi_deploy.host_paths import engine_dir, router_dir
from kimi_deploy.listen import LOOPBACK, api_port, bind_address
from kimi_deploy.placement import TopologyPlacement
from kimi_deploy.recipe import Recipe
from kimi_deploy.servespec import Unit

ROUTER_UNIT = "kimi-router"
MOONCAKE_UNIT = "kimi-mooncake-master"


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
