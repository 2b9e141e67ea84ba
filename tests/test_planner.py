"""The planner's decisions: argv per role, ranks, start stages, and the faults it refuses."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kimi_deploy.accelerators import accelerator
from kimi_deploy.errors import ConfigError
from kimi_deploy.inventory import Inventory, InventoryHost
from kimi_deploy.plan.planner import plan
from kimi_deploy.plan.servespec import Plan
from kimi_deploy.recipe import EngineName, Expose, Ports, Recipe, SecretRef
from kimi_deploy.releases import catalog as catalog_module
from kimi_deploy.releases.catalog import Catalog, engine_catalog, load_catalog
from tests.conftest import RECIPE

MODEL = "/srv/models/moonshotai--Kimi-K3.1-Pro/5e2b7a09c41d8f36b0e9a4c7d21f58e3a6b90c1d"


@pytest.fixture(scope="module")
def full(recipe: Recipe, prod: Inventory) -> Plan:
    return plan(recipe, RECIPE, prod)


def _with_topology(recipe: Recipe, name: str, **update: object) -> Recipe:
    topo = recipe.topologies[name].model_copy(update=update)
    return recipe.model_copy(update={"topologies": {**recipe.topologies, name: topo}})


def test_single_node_is_the_reference_vllm_command(full: Plan) -> None:
    (unit,) = full.for_host("b300-01").units
    assert unit.argv == (
        "/opt/kimi/engines/vllm-0.33.0+fastsafetensors-0.5.0+mooncake-transfer-engine-cuda13-0.3.13.post1+nixl-1.5.1/bin/vllm",
        "serve",
        MODEL,
        "--served-model-name",
        "kimi-local",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "8",
        "--max-model-len",
        "32768",
        "--load-format",
        "fastsafetensors",
        "--trust-remote-code",
        "--tool-call-parser",
        "kimi_k3",
        "--enable-auto-tool-choice",
        "--reasoning-parser",
        "kimi_k3",
    )
    assert unit.env["VLLM_ENGINE_READY_TIMEOUT_S"] == "3600"
    assert unit.env["HF_HUB_OFFLINE"] == "1"
    assert dict(unit.listens) == {"api": 8000}


def test_decode_pool_uses_native_data_parallel_with_headless_workers(full: Plan) -> None:
    hosts = [full.for_host(f"gb300-d0{i}") for i in range(1, 5)]
    assert [h.dp_start_rank for h in hosts] == [0, 4, 8, 12]
    leader, *workers = [h.units[0].argv for h in hosts]
    assert "--headless" not in leader
    assert leader[leader.index("--data-parallel-address") + 1] == "10.41.0.31"
    assert leader[leader.index("--data-parallel-size") + 1] == "16"
    for rank, argv in zip((4, 8, 12), workers, strict=True):
        assert "--headless" in argv
        assert "--host" not in argv
        assert argv[argv.index("--data-parallel-start-rank") + 1] == str(rank)
        assert argv[argv.index("--data-parallel-size-local") + 1] == "4"
        assert argv[argv.index("--data-parallel-address") + 1] == "10.41.0.31"
    assert "nixl_side_channel_12" in hosts[3].units[0].listens


def test_prefill_instances_span_two_trays_with_tensor_parallel(full: Plan) -> None:
    leaders = {f"gb300-p0{i}": f"10.41.0.1{i}" for i in (1, 3, 5)}
    for i in range(1, 7):
        h = full.for_host(f"gb300-p0{i}")
        argv = h.units[0].argv
        leader = f"gb300-p0{i - (i + 1) % 2}"
        assert h.leader == leader
        assert h.instance == (i - 1) // 2
        assert argv[argv.index("--master-addr") + 1] == leaders[leader]
        assert argv[argv.index("--node-rank") + 1] == str((i + 1) % 2)
        assert ("--headless" in argv) == (i % 2 == 0)


def test_router_sends_to_every_instance_leader_and_starts_last(full: Plan) -> None:
    router = full.for_host("gb300-rt01")
    _master, front, gateway = router.units
    assert [(u.name, u.stage) for u in router.units] == [
        ("kimi-mooncake-master", 0),
        ("kimi-router", 3),
        ("kimi-gateway", 3),
    ]
    # The router checks no client key: it listens on loopback, the gateway on the topology's address.
    assert (front.bind, dict(front.listens)) == ("127.0.0.1", {"router_backend": 8009})
    assert (gateway.bind, dict(gateway.listens)) == ("10.41.0.50", {"router": 8000})
    assert front.secret_env == ("OPENAI_API_KEY",)
    argv = list(front.argv)
    prefill = [argv[i + 1] for i, a in enumerate(argv) if a == "--prefill"]
    decode = [argv[i + 1] for i, a in enumerate(argv) if a == "--decode"]
    assert prefill == ["http://10.41.0.11:8000", "http://10.41.0.13:8000", "http://10.41.0.15:8000"]
    assert decode == ["http://10.41.0.31:8000"]
    stages = {h.host: h.units[0].stage for h in full.topology("gb300-pd") if h.role != "router"}
    assert stages["gb300-p01"] == 1
    assert stages["gb300-p02"] == 2
    assert stages["gb300-d04"] == 2


def test_kv_transport_is_explicit(full: Plan) -> None:
    env = full.for_host("gb300-d01").units[0].env
    assert "tcp" not in env["UCX_TLS"].split(",")
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    files = full.for_host("gb300-d01").units[0].files
    assert files["/etc/kimi/mooncake.json"].data["mooncake"]["protocol"] == "rdma"


def test_pd_connectors_take_the_roles_of_their_pool(full: Plan) -> None:
    def kv_config(host: str) -> dict[str, object]:
        argv = full.for_host(host).units[0].argv
        config: dict[str, object] = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        return config

    def connectors(role: str, nixl: str, store: str) -> dict[str, object]:
        return {
            "kv_connector": "MultiConnector",
            "kv_role": role,
            "kv_connector_extra_config": {
                "connectors": [
                    {"kv_connector": "NixlConnector", "kv_role": nixl},
                    {"kv_connector": "MooncakeStoreConnector", "kv_role": store},
                ]
            },
        }

    # NIXL first (a MultiConnector loads from the first connector that holds the blocks)
    assert kv_config("gb300-p01") == connectors("kv_producer", "kv_producer", "kv_both")
    assert kv_config("gb300-d01") == connectors("kv_consumer", "kv_consumer", "kv_consumer")
    for host in ("gb300-p01", "gb300-d01"):
        unit = full.for_host(host).units[0]
        assert unit.env["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS"
        assert unit.env["MOONCAKE_REQUESTER_LOCAL_HOSTNAME"] == full.for_host(host).address
        assert unit.files["/etc/kimi/mooncake.json"].data["mooncake"] == {
            "metadata_server": "http://10.41.0.50:8080/metadata",
            "master_server_address": "10.41.0.50:50051",
            "protocol": "rdma",
            "device_name": "mlx5_0,mlx5_1,mlx5_2,mlx5_3",
            "mode": "embedded",
            "global_segment_size": "4GB",
            "local_buffer_size": "4GB",
            "enable_offload": False,
        }


def test_tpu_slice_runs_sglang_jax_across_eight_hosts_counting_two_devices_a_chip(full: Plan) -> None:
    w0, w7 = full.for_host("tpu7x-w0").units[0], full.for_host("tpu7x-w7").units[0]
    venv = "/opt/kimi/engines/sglang-jax-0.1.0rc0+jax-0.10.2+jaxlib-0.10.2+libtpu-0.0.42.1"
    for unit, rank in ((w0, "0"), (w7, "7")):
        argv = unit.argv
        # the wheel has no console script: its module, run by the release's own Python
        assert argv[:3] == (f"{venv}/bin/python", "-m", "sgl_jax.launch_server")
        assert argv[argv.index("--node-rank") + 1] == rank
        assert argv[argv.index("--dist-init-addr") + 1] == "10.61.0.10:29500"
        # 32 TPU7x chips, each two JAX devices: the runtime's tensor-parallel size is 64
        assert argv[argv.index("--tp-size") + 1] == "64"
        assert argv[argv.index("--device") + 1] == "tpu"
        # EP is honoured by the epmoe backend alone
        assert argv[argv.index("--ep-size") + 1] == "8"
        assert argv[argv.index("--moe-backend") + 1] == "epmoe"
        # KDA layers: the radix cache off, no host-memory offload, no parser it lacks
        assert "--disable-radix-cache" in argv
        assert not [a for a in argv if "hicache" in a or "hierarchical" in a or a.endswith("-parser")]
        assert unit.env["JAX_PLATFORMS"] == "tpu"
        assert unit.env["JAX_COMPILATION_CACHE_DIR"] == "/var/cache/kimi/kimi-sglang-jax/jax"
    assert w0.listens == {"api": 30000, "dist_init": 29500}
    assert w7.listens == {}


@pytest.mark.parametrize(
    ("parallel", "expected"),
    [
        (
            {"tp": 32, "ep": 48},
            "topologies.tpu7x.pools.serve.parallel: sglang-jax needs ep to divide the instance's 64 devices "
            "(32 x TPU7x at 2 each), found ep 48",
        ),
        (
            {"tp": 16, "pp": 2},
            "topologies.tpu7x.pools.serve.parallel: sglang-jax has no pipeline parallelism, found pp 2",
        ),
    ],
)
def test_tpu_layout_the_runtime_cannot_run_is_refused(
    recipe: Recipe, prod: Inventory, parallel: dict[str, int], expected: str
) -> None:
    pools = recipe.topologies["tpu7x"].pools
    serve = pools["serve"].model_copy(update={"parallel": pools["serve"].parallel.model_copy(update=parallel)})
    with pytest.raises(ConfigError) as err:
        plan(_with_topology(recipe, "tpu7x", pools={"serve": serve}), RECIPE, prod, "tpu7x")
    assert str(err.value) == f"{RECIPE}: {expected}"


@pytest.mark.parametrize(
    ("topology", "said"),
    [
        ("tpu7x", "sglang-jax takes its API key only on the command line (--api-key)"),
        ("tokenspeed-single", "TokenSpeed takes its API key only on the command line"),
    ],
)
def test_an_engine_taking_its_key_in_argv_is_served_on_loopback_only(
    recipe: Recipe, prod: Inventory, topology: str, said: str
) -> None:
    exposed = _with_topology(recipe, topology, expose=Expose(bind="address", api_key=SecretRef(env="KIMI_API_KEY")))
    with pytest.raises(ConfigError) as err:
        plan(exposed, RECIPE, prod, topology)
    label = said.split(" takes", 1)[0]
    assert str(err.value) == (
        f"{RECIPE}: topologies.{topology}.expose: {said}, which kimi-deploy never does with a secret: "
        f"serve {label} on loopback"
    )


def test_devices_the_runtime_counts_on_an_accelerator(recipe: Recipe) -> None:
    def devices(topology: str, model: str | None = None) -> int:
        acc = recipe.topologies[topology].accelerators
        return accelerator(acc.vendor).devices_per_accelerator(model or acc.model)

    assert devices("tpu7x") == 2
    assert devices("tpu7x", "tpu7X") == 2
    assert devices("single-node") == 1
    assert devices("gb300-pd") == 1


def test_port_clash_on_a_host_is_refused(recipe: Recipe, prod: Inventory) -> None:
    bad = _with_topology(recipe, "gb300-pd", ports=Ports(api=13345))
    with pytest.raises(ConfigError) as err:
        plan(bad, RECIPE, prod, "gb300-pd")
    assert str(err.value) == (
        f"{RECIPE}: topologies.gb300-pd.ports: host gb300-d01: kimi-vllm api and kimi-vllm dp_rpc both use port 13345"
    )


def test_parser_the_pinned_engine_lacks_is_refused(recipe: Recipe, prod: Inventory) -> None:
    # sglang-jax has no kimi_k3 parser: the recipe's tpu7x names none, and one that does is refused
    parsers = recipe.topologies["single-node"].parsers
    with pytest.raises(ConfigError) as err:
        plan(_with_topology(recipe, "tpu7x", parsers=parsers), RECIPE, prod, "tpu7x")
    message = str(err.value)
    assert message == (
        f"{RECIPE}: topologies.tpu7x.parsers.tool_call: sglang-jax 0.1.0rc0 has no tool_call_parser 'kimi_k3' "
        "(known: glm45, glm47, mimo, qwen25, qwen3_coder)"
    )


def test_engine_release_without_catalog_is_refused(recipe: Recipe, prod: Inventory) -> None:
    engines = {**recipe.engines, "vllm": recipe.engines["vllm"].model_copy(update={"version": "0.99.0"})}
    with pytest.raises(ConfigError) as err:
        plan(recipe.model_copy(update={"engines": engines}), RECIPE, prod, "single-node")
    assert str(err.value).startswith(f"{RECIPE}: engines.vllm.version: no flag catalog for vllm 0.99.0 (have: ")


def test_flag_missing_from_the_release_catalog_is_refused(
    recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = load_catalog("vllm", "0.34.0")
    older = dataclasses.replace(real, flags={k: v for k, v in real.flags.items() if k != "--headless"})

    def fake(pinned: Recipe, engine: EngineName) -> Catalog:
        return older if engine == "vllm" else engine_catalog(pinned, engine)

    monkeypatch.setattr("kimi_deploy.plan.planner.engine_catalog", fake)
    with pytest.raises(ConfigError) as err:
        plan(recipe, RECIPE, prod, "gb300-pd")
    assert str(err.value) == (
        f"{RECIPE}: topologies.gb300-pd: host gb300-p02: kimi-vllm: flag --headless is not accepted by vllm 0.34.0"
    )
    assert catalog_module.load_catalog("vllm", "0.34.0") is real


def test_rdma_topology_needs_rdma_devices_on_every_engine_host(recipe: Recipe, prod: Inventory) -> None:
    hosts = tuple(
        dataclasses.replace(h, vars=h.vars.model_copy(update={"kimi_rdma_devices": None}))
        if h.name == "gb300-d03"
        else h
        for h in prod.hosts
    )
    with pytest.raises(ConfigError) as err:
        plan(recipe, RECIPE, dataclasses.replace(prod, hosts=hosts), "gb300-pd")
    assert str(err.value) == (
        "inventories/prod.py: host gb300-d03: kimi_rdma_devices: "
        "topology gb300-pd moves KV cache over RDMA: list the host's RDMA devices"
    )


@pytest.mark.parametrize("name", ["gb300-p04", "gb300-rt01"], ids=["engine-host", "the-masters-own-host"])
def test_a_mooncake_topology_names_its_hosts_by_ip_address(recipe: Recipe, prod: Inventory, name: str) -> None:
    hosts = tuple(
        dataclasses.replace(h, address=f"{name}.cluster.example") if h.name == name else h for h in prod.hosts
    )
    with pytest.raises(ConfigError) as err:
        plan(recipe, RECIPE, dataclasses.replace(prod, hosts=hosts), "gb300-pd")
    assert str(err.value) == (
        f"inventories/prod.py: host {name}: kimi_address: topology gb300-pd's Mooncake master lets in its "
        f"hosts by IP address (systemd's IPAddressAllow=): set the host's IP address, found '{name}.cluster.example'"
    )


def test_the_mooncake_master_comes_from_its_own_release_and_lets_in_its_topology_alone(full: Plan) -> None:
    master = full.for_host("gb300-rt01").units[0]
    argv = dict(a.removeprefix("--").split("=", 1) for a in master.argv[1:])
    assert master.argv[0] == "/opt/kimi/engines/mooncake-transfer-engine-0.3.13.post1/bin/mooncake_master"
    assert argv["rpc_address"] == argv["http_metadata_server_host"] == "10.41.0.50"
    assert (argv["rpc_port"], argv["http_metadata_server_port"]) == ("50051", "8080")
    # Its metrics and admin server would bind every address by default: loopback, told so.
    assert (argv["metrics_host"], argv["metrics_port"]) == ("127.0.0.1", "9003")
    assert dict(master.local_listens) == {"mooncake_metrics": 9003}
    # Every engine host of the topology and the router host itself, nobody else.
    engines = [h.address for h in full.topology("gb300-pd") if h.role != "router"]
    assert master.peers == ("10.41.0.50", *engines)
    assert len(engines) == 10
    # The engines read the master's address from their own config, the one the master binds.
    config = full.for_host("gb300-d01").units[0].files["/etc/kimi/mooncake.json"].data["mooncake"]
    assert config["master_server_address"] == "10.41.0.50:50051"
    assert config["metadata_server"] == "http://10.41.0.50:8080/metadata"


def test_vllm_expert_parallel_must_span_the_instance(recipe: Recipe, prod: Inventory) -> None:
    pools = dict(recipe.topologies["gb300-pd"].pools)
    pools["decode"] = pools["decode"].model_copy(
        update={"parallel": pools["decode"].parallel.model_copy(update={"ep": 8})}
    )
    with pytest.raises(ConfigError) as err:
        plan(_with_topology(recipe, "gb300-pd", pools=pools), RECIPE, prod, "gb300-pd")
    assert str(err.value) == (
        f"{RECIPE}: topologies.gb300-pd.pools.decode.parallel: vLLM expert parallel spans tp*dp = 16 ranks, found ep 8"
    )


def test_plan_is_deterministic_and_ordered_like_the_inventory(recipe: Recipe, prod: Inventory, full: Plan) -> None:
    assert plan(recipe, RECIPE, prod) == full
    order = [h.name for h in prod.hosts]
    assert [h.host for h in full.hosts] == order
    assert isinstance(prod.hosts[0], InventoryHost)
