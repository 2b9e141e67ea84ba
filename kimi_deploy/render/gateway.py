"""The gateway: Debian's nginx in front of a router, or of an exposed engine without one.

The routers (vllm-router, sglang-router) check no client key, so nginx takes the router's address
and port and the router listens on loopback behind it. An engine's own key check guards only some
of its routes (``kimi_deploy.render.engine_guard``), so an exposed topology without a router has a
gateway on each instance's API host, on the topology's API port, and the engine on loopback
behind it (``kimi_deploy.plan.listen``). It answers clients that bear the
topology's key, through the router, and with ``router.fallback``, when the router cannot answer (no
connection, or 500/502/503/504: vllm-router 0.1.17 answers 500 when it cannot reach its engines),
through the hosted API with the hosted key and the hosted model's name
(``templates/gateway.nginx.conf.j2``, ``templates/gateway.js.j2``). Both keys reach nginx as one
systemd credential: a root-only file of ``map`` blocks (``templates/gateway-keys.nginx.j2``) that
systemd copies into the unit's credentials directory at each start, for nginx, run as a user of its
own (``DynamicUser=``), to include.

The packages come from the host's own Debian archive: ``nginx`` and ``libnginx-mod-http-js``
(nginx's JavaScript module, njs, which puts the hosted model's name in a request body). Debian's
``nginx.service`` is masked before they are installed, so the package starts no server of its own
(its post-install script starts only a unit that is not masked); the gateway is the only nginx.
"""

from __future__ import annotations

from typing import TypedDict
from urllib.parse import urlsplit

from kimi_deploy.engines import engine
from kimi_deploy.plan.listen import LOOPBACK, client_address, gatewayed
from kimi_deploy.plan.placement import Placement, TopologyPlacement
from kimi_deploy.plan.servespec import ConfigFile, Unit
from kimi_deploy.recipe import Recipe, RouterFallback
from kimi_deploy.render.engine_guard import cleared

GATEWAY_UNIT = "kimi-gateway"
NGINX = "/usr/sbin/nginx"
# Debian's packages (bookworm: nginx 1.22.1, njs 0.7.9): the server and its JavaScript module.
PACKAGES = ("nginx", "libnginx-mod-http-js")
MASKED = ("nginx.service",)
NJS_MODULE = "/usr/lib/nginx/modules/ngx_http_js_module.so"
# Where systemd puts a unit's credentials (systemd.exec(5), "Credentials": $CREDENTIALS_DIRECTORY).
CREDENTIALS = f"/run/credentials/{GATEWAY_UNIT}.service"
# The keys file, under <config>/secrets and, as a credential of the same name, under CREDENTIALS.
KEYS_FILE = f"{GATEWAY_UNIT}-keys.conf"
# Limits (the unit's LimitNOFILE= and MemoryMax= leave room for them).
MAX_CONNECTIONS = 1024
# Requests one client address may have at once: a client of many streams gets them, and one
# client alone leaves the other half to the rest.
PER_ADDRESS = MAX_CONNECTIONS // 2
# Unauthenticated health checks one address may have at once.
HEALTH_PER_ADDRESS = 8
# The connections one client address can hold open to one listening address and port (as many as
# it has source ports): nginx counts nothing per address before a request head is complete, so the
# worker's connections leave room for all of them beside the requests'.
ONE_ADDRESS = 65536
HEADER_TIMEOUT_S = 5
IDLE_TIMEOUT_S = 15
TIMEOUT_S = 600
MAX_BODY_MB = 64
# The endpoints clients may ask for, and their methods: the OpenAI-compatible ones both routers
# serve for a generative model (vllm-router's src/server.rs routes them to the engines; its other
# routes manage workers and are not for clients).
HOSTED = " with the hosted API as fallback"
ROUTES = {"/v1/chat/completions": "POST", "/v1/completions": "POST", "/v1/models": "GET"}


class Upstream(TypedDict):
    scheme: str
    host: str
    netloc: str
    prefix: str


class GatewayConfig(TypedDict):
    """What ``gateway.nginx.conf.j2`` renders (``config_data``)."""

    bind: str
    port: int
    backend: str
    fallback: Upstream | None
    served_name: str
    hosted_model: str | None
    runtime_dir: str
    keys_file: str
    js_file: str
    njs_module: str
    fallback_log: str
    max_connections: int
    worker_connections: int
    one_address: int
    per_address: int
    health_per_address: int
    hosted_max_tokens: int | None
    header_timeout_s: int
    idle_timeout_s: int
    timeout_s: int
    max_body_mb: int
    routes: dict[str, str]


def upstream(url: str) -> Upstream:
    """What the templates need of an upstream URL (the recipe checked its form): scheme, host,
    ``host:port`` as the Host header, and its path prefix without the trailing ``/``."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return {
        "scheme": parts.scheme,
        "host": parts.hostname,
        "netloc": netloc,
        "prefix": parts.path.rstrip("/"),
    }


def config_data(
    *,
    bind: str,
    port: int,
    backend_port: int,
    fallback_url: str | None,
    served_name: str,
    hosted_model: str | None,
    runtime_dir: str = f"/run/{GATEWAY_UNIT}",
    keys_file: str = f"{CREDENTIALS}/{KEYS_FILE}",
    js_file: str,
    fallback_log: str = "syslog:server=unix:/dev/log,nohostname,tag=kimi_gateway",
    max_connections: int = MAX_CONNECTIONS,
    header_timeout_s: int = HEADER_TIMEOUT_S,
    idle_timeout_s: int = IDLE_TIMEOUT_S,
    timeout_s: int = TIMEOUT_S,
    per_address: int = PER_ADDRESS,
    hosted_max_tokens: int | None = None,
) -> GatewayConfig:
    """The data ``gateway.nginx.conf.j2`` renders; the defaults are the host's paths and limits.
    ``hosted_max_tokens`` bounds each fallback answer (required with ``fallback_url``)."""
    if fallback_url is not None and hosted_max_tokens is None:
        raise ValueError("config_data: a fallback_url needs hosted_max_tokens")
    return {
        "bind": f"[{bind}]" if ":" in bind else bind,
        "port": port,
        "backend": f"{LOOPBACK}:{backend_port}",
        "fallback": upstream(fallback_url) if fallback_url else None,
        "served_name": served_name,
        "hosted_model": hosted_model,
        "runtime_dir": runtime_dir,
        "keys_file": keys_file,
        "js_file": js_file,
        "njs_module": NJS_MODULE,
        "fallback_log": fallback_log,
        "max_connections": max_connections,
        "worker_connections": worker_connections(max_connections),
        "one_address": ONE_ADDRESS,
        "per_address": per_address,
        "health_per_address": HEALTH_PER_ADDRESS,
        "hosted_max_tokens": hosted_max_tokens,
        "header_timeout_s": header_timeout_s,
        "idle_timeout_s": idle_timeout_s,
        "timeout_s": timeout_s,
        "max_body_mb": MAX_BODY_MB,
        "routes": ROUTES,
    }


def worker_connections(max_connections: int = MAX_CONNECTIONS) -> int:
    """nginx's connections for ``max_connections`` requests at once: two each (the client's and
    the upstream's), one client address's every source port, and a margin."""
    return 2 * max_connections + ONE_ADDRESS + 64


def _gateway(
    recipe: Recipe,
    *,
    topology: str,
    bind: str,
    port: int,
    backend_port: int,
    label: str,
    fallback: RouterFallback | None,
) -> Unit:
    """nginx on ``bind:port`` in front of the backend on loopback at ``backend_port``, holding the
    topology's client key (and, with ``fallback``, the hosted key) as a credential."""
    topo = recipe.topologies[topology]
    folder = f"{recipe.paths.config}/{GATEWAY_UNIT}"
    conf, js = f"{folder}/nginx.conf", f"{folder}/gateway.js"
    data = config_data(
        bind=bind,
        port=port,
        backend_port=backend_port,
        fallback_url=fallback.url if fallback else None,
        served_name=recipe.model.served_name,
        hosted_model=fallback.model if fallback else None,
        hosted_max_tokens=(fallback.max_tokens or topo.max_model_len) if fallback else None,
        js_file=js,
    )
    return Unit(
        name=GATEWAY_UNIT,
        kind="gateway",
        stage=3,
        description=f"Kimi {recipe.model.served_name} gateway (nginx){HOSTED if fallback else ''} ({topology})",
        argv=(NGINX, "-c", conf, "-e", "stderr"),
        env={},
        listens={label: port},
        bind=data["bind"].strip("[]"),
        # The client key also in an EnvironmentFile: nginx does not read it there (its workers keep
        # no environment), the deploy's smoke test through the gateway does.
        secret_env=("KIMI_API_KEY",),
        secret_files={f"{recipe.paths.config}/secrets/{KEYS_FILE}": "gateway-keys.nginx.j2"},
        files={conf: ConfigFile("gateway.nginx.conf.j2", data), js: ConfigFile("gateway.js.j2", data)},
    )


def gateway_unit(recipe: Recipe, tp: TopologyPlacement) -> Unit | None:
    """In front of every router (which checks no client key): nginx on the topology's address and
    port, holding the client key and, with ``router.fallback``, the hosted key as a credential."""
    topo = tp.topology
    if topo.router is None:
        return None
    assert tp.router is not None
    return _gateway(
        recipe,
        topology=tp.name,
        bind=client_address(topo, tp.router),
        port=topo.ports.router,
        backend_port=topo.ports.router_backend,
        label="router",
        fallback=topo.router.fallback,
    )


def engine_gateway_unit(recipe: Recipe, placement: Placement, engine_unit: Unit) -> Unit | None:
    """In front of an exposed engine of a topology without a router (``listen.gatewayed``), on the
    host whose engine serves the instance's API: nginx on the exposed address and the topology's API
    port, the engine behind it on loopback. An engine's key check is no boundary (vLLM answers
    ``/invocations`` and ``/tokenize`` without it), the gateway's is: it passes the client API's
    routes alone, to key holders. It loads the engine's nftables table as one that admits every
    address (``engine_guard.cleared``), so that the table of an earlier release, which admitted
    only a router to this port, never shuts the clients out."""
    topo = placement.topology
    backend = engine_unit.listens.get("api")
    if not gatewayed(topo) or backend is None:
        return None
    port = engine(topo.engine).client_port(topo)
    unit = _gateway(
        recipe,
        topology=placement.topology_name,
        bind=client_address(topo, placement.host),
        port=port,
        backend_port=backend,
        label="api",
        fallback=None,
    )
    return cleared(unit, recipe.paths.config, engine_unit.name, port)
