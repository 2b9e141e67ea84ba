"""The inventory: read exactly as pyinfra reads it, bad host data in one line, placement rules.

Nothing here connects to a host: the prod addresses are not reachable and must not receive
traffic, so every test runs with socket connections and name lookups turned into failures.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import pytest
from pyinfra.api.state import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory_from_files

from kimi_deploy.errors import ConfigError
from kimi_deploy.inventory import Inventory, InventoryHost, make_host
from kimi_deploy.plan.placement import Placement, TopologyPlacement, place
from kimi_deploy.recipe import Recipe
from kimi_pyinfra.inventory_file import load_inventory
from tests.conftest import PROD


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def _pyinfra_inventory(path: str) -> Any:
    """pyinfra's own inventory of ``path``, built the way its CLI builds it (no connection)."""
    with ctx_state.use(State()):
        return make_inventory_from_files(path, cwd=os.getcwd())


def _expected_address(host: Any) -> str:
    data = host.data.dict()
    address = data.get("kimi_address") or data.get("ssh_hostname") or host.name
    assert isinstance(address, str)
    return address


def _assert_agrees_with_pyinfra(path: str) -> Inventory:
    ours = load_inventory(path)
    theirs = _pyinfra_inventory(path)
    their_hosts = list(theirs)
    assert [h.name for h in ours.hosts] == [h.name for h in their_hosts]
    for mine, their in zip(ours.hosts, their_hosts, strict=True):
        assert mine.groups == tuple(their.groups), mine.name
        assert mine.address == _expected_address(their), mine.name
        data = their.data.dict()
        for key in ("kimi_address", "kimi_socket_ifname", "kimi_rdma_devices", "kimi_recipe"):
            assert getattr(mine.vars, key) == data.get(key), (mine.name, key)
    their_groups = {name: tuple(h.name for h in hosts) for name, hosts in theirs.groups.items() if hosts}
    assert dict(ours.groups) == their_groups
    for name, members in ours.groups.items():
        for member in members:
            assert name in ours.host(member).groups
    return ours


# ---- (a) the same view as pyinfra ------------------------------------------------------------------


def test_prod_agrees_with_pyinfra() -> None:
    ours = _assert_agrees_with_pyinfra(PROD)
    assert ours.source == PROD
    assert len(ours.hosts) == 23
    names = [h.name for h in ours.hosts]
    assert names[:2] == ["b300-01", "gb300-p01"]
    assert names[-3:] == ["b300-02", "h200-01", "h200-02"]


def test_prod_groups_and_data(prod: Inventory) -> None:
    assert prod.groups["gb300_prefill"] == tuple(f"gb300-p{i:02d}" for i in range(1, 7))
    assert prod.groups["gb300_decode"] == tuple(f"gb300-d{i:02d}" for i in range(1, 5))
    assert prod.groups["gb300_router"] == ("gb300-rt01",)
    assert prod.groups["tpu7x"] == tuple(f"tpu7x-w{i}" for i in range(8))
    # The file's own group holds every host, as pyinfra adds it.
    assert prod.groups["prod"] == tuple(h.name for h in prod.hosts)
    p01 = prod.host("gb300-p01")
    assert p01.groups == ("gb300_prefill", "gb300", "prod")
    # kimi_address (the cluster network) wins over ssh_hostname (where pyinfra connects).
    assert p01.address == "10.41.0.11"
    # group_data/gb300.py and group_data/prod.py reach the host.
    assert p01.vars.kimi_socket_ifname == "bond0"
    assert p01.vars.kimi_rdma_devices == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert p01.vars.kimi_recipe == "recipes/kimi-k3.1-pro.yaml"
    assert prod.host("tpu7x-w3").vars.kimi_socket_ifname == "ens8"
    assert prod.host("tpu7x-w3").vars.kimi_rdma_devices is None
    with pytest.raises(KeyError):
        prod.host("nope")


def _write_inventory(tmp_path: Path, body: str, group_data: Mapping[str, str] | None = None) -> str:
    (tmp_path / "group_data").mkdir(exist_ok=True)
    for group, text in (group_data or {}).items():
        (tmp_path / "group_data" / f"{group}.py").write_text(text, encoding="utf-8")
    path = tmp_path / "site.py"
    path.write_text(body, encoding="utf-8")
    return str(path)


def test_the_reports_host_data_is_part_of_the_schema(tmp_path: Path) -> None:
    # deploys/report.py reads both; an inventory that sets them plans like any other.
    path = _write_inventory(
        tmp_path, 'web = [("w1", {"kimi_models_dir": "/data/models", "kimi_report_json": "out/report.json"})]\n'
    )
    ours = _assert_agrees_with_pyinfra(path)
    assert ours.host("w1").vars.kimi_models_dir == "/data/models"
    assert ours.host("w1").vars.kimi_report_json == "out/report.json"


def test_address_fallbacks_agree_with_pyinfra(tmp_path: Path) -> None:
    path = _write_inventory(
        tmp_path,
        "web = [\n"
        '    ("w-kimi", {"ssh_hostname": "192.0.2.1", "kimi_address": "198.51.100.1"}),\n'
        '    ("w-ssh", {"ssh_hostname": "192.0.2.2"}),\n'
        '    "w-bare",\n'
        "]\n"
        'db = ["w-bare", "d1"]\n',
        {"web": 'kimi_socket_ifname = "eth0"\n', "db": 'kimi_rdma_devices = ["mlx5_0:1"]\n'},
    )
    ours = _assert_agrees_with_pyinfra(path)
    assert [(h.name, h.address) for h in ours.hosts] == [
        ("w-kimi", "198.51.100.1"),
        ("w-ssh", "192.0.2.2"),
        ("w-bare", "w-bare"),
        ("d1", "d1"),
    ]
    assert set(ours.host("w-bare").groups) == {"web", "db", "site"}
    assert ours.host("w-bare").vars.kimi_socket_ifname == "eth0"
    assert ours.host("w-bare").vars.kimi_rdma_devices == ["mlx5_0:1"]
    assert ours.host("d1").vars.kimi_socket_ifname is None


# ---- (b) bad host data: one line naming the file and the host ------------------------------------


def _inventory_error(path: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    text = str(info.value)
    assert text.splitlines() == [text], f"not a single line: {text!r}"
    assert text.startswith(path), text
    return text


@pytest.mark.parametrize(
    ("host_data", "expected"),
    [
        pytest.param(
            '{"kimi_adress": "10.0.0.1"}',
            "kimi_adress: unknown key (did you mean 'kimi_address'?)",
            id="typo-kimi_address",
        ),
        pytest.param(
            '{"kimi_rdma_device": ["mlx5_0"]}',
            "kimi_rdma_device: unknown key (did you mean 'kimi_rdma_devices'?)",
            id="typo-kimi_rdma_devices",
        ),
        pytest.param(
            '{"kimi_zzz": 1}',
            "kimi_zzz: unknown key",
            id="unknown-kimi-key-no-hint",
        ),
        pytest.param(
            '{"kimi_rdma_devices": "mlx5_0"}',
            "kimi_rdma_devices: Input should be a valid list, found str 'mlx5_0'",
            id="rdma-devices-string",
        ),
        pytest.param(
            '{"kimi_rdma_devices": []}',
            "kimi_rdma_devices: List should have at least 1 item after validation, not 0, found list []",
            id="rdma-devices-empty",
        ),
        pytest.param(
            '{"kimi_rdma_devices": ["mlx5 0"]}',
            "kimi_rdma_devices[0]: String should match pattern '^[A-Za-z0-9_]+(:[0-9]+)?$', found str 'mlx5 0'",
            id="rdma-device-bad-name",
        ),
        pytest.param(
            '{"kimi_socket_ifname": "enp0s31f6veryverylong"}',
            "kimi_socket_ifname: String should match pattern '^[A-Za-z0-9_.:@-]{1,15}$', "
            "found str 'enp0s31f6veryverylong'",
            id="ifname-too-long",
        ),
        pytest.param(
            '{"kimi_socket_ifname": 0}',
            "kimi_socket_ifname: Input should be a valid string, found int 0",
            id="ifname-int",
        ),
        pytest.param(
            '{"kimi_address": ""}',
            "kimi_address: String should have at least 1 character, found str ''",
            id="address-empty",
        ),
        pytest.param(
            '{"kimi_address": "10.0.0.1\\nExecStartPre=+/usr/bin/touch /tmp/x"}',
            "kimi_address: must be an IP address or a DNS hostname, found '10.0.0.1\\nExecStartPre=+/usr/bin/touch /tmp/x'",
            id="address-with-a-unit-line",
        ),
        pytest.param(
            '{"kimi_address": "gpu-07.example.com --trust-remote-code"}',
            "kimi_address: must be an IP address or a DNS hostname, found 'gpu-07.example.com --trust-remote-code'",
            id="address-with-an-argument",
        ),
        pytest.param(
            '{"kimi_address": "fe80::1%eth0"}',
            "kimi_address: must be an IP address or a DNS hostname, found 'fe80::1%eth0'",
            id="address-with-an-ipv6-zone",
        ),
        pytest.param(
            '{"kimi_models_dir": "models"}',
            "kimi_models_dir: String should match pattern '^/[A-Za-z0-9._+@=,:~/-]*$', found str 'models'",
            id="report-models-dir-relative",
        ),
        pytest.param(
            '{"kimi_address": "-gpu07"}',
            "kimi_address: must be an IP address or a DNS hostname, found '-gpu07'",
            id="address-like-a-flag",
        ),
        pytest.param(
            '{"ssh_hostname": "10.0.0.1;reboot"}',
            "ssh_hostname: is the host's address without kimi_address: an address must be an IP address or a DNS "
            "hostname, found '10.0.0.1;reboot'",
            id="ssh-hostname-as-address",
        ),
        pytest.param(
            '{"kimi_pip_index_url": "https://pypi.example/simple\\x01"}',
            "kimi_pip_index_url: control character U+0001 is refused in text that reaches a host's files, "
            "found 'https://pypi.example/simple\\x01'",
            id="url-with-a-control-character",
        ),
        pytest.param(
            '{"kimi_rdma_devices": ["mlx5_0", "mlx5_1\\n"]}',
            "kimi_rdma_devices[1]: String should match pattern '^[A-Za-z0-9_]+(:[0-9]+)?$', found str 'mlx5_1\\n'",
            id="rdma-device-with-a-line-break",
        ),
        pytest.param(
            '{"kimi_socket_ifname": 10**5000}',
            "kimi_socket_ifname: Input should be a valid string, found int <an integer of about 5001 digits>",
            id="integer-of-5000-digits",
        ),
        pytest.param(
            '{"ssh_hostname": 10**5000}',
            "ssh_hostname: expected a string, found <an integer of about 5001 digits>",
            id="ssh-hostname-of-5000-digits",
        ),
    ],
)
def test_bad_host_data(tmp_path: Path, host_data: str, expected: str) -> None:
    path = _write_inventory(tmp_path, f'web = [("ok1", {{}}), ("w1", {host_data})]\n')
    assert _inventory_error(path) == f"{path}: host w1: {expected}"


def test_bad_group_data_names_the_first_host_of_the_group(tmp_path: Path) -> None:
    """The bad key lives in group_data/web.py, but the line names the inventory file and host."""
    path = _write_inventory(tmp_path, 'db = ["d1"]\nweb = ["w1", "w2"]\n', {"web": 'kimi_socket_ifnam = "eth0"\n'})
    assert _inventory_error(path) == (
        f"{path}: host w1: kimi_socket_ifnam: unknown key (did you mean 'kimi_socket_ifname'?)"
    )


@pytest.mark.parametrize(
    ("host", "address"),
    [
        pytest.param('("w1", {"kimi_address": "fd00::41"})', "fd00::41", id="ipv6"),
        pytest.param('("w1", {"kimi_address": "gpu-07.cluster.example"})', "gpu-07.cluster.example", id="hostname"),
        pytest.param('("w1", {"ssh_hostname": "gpu-07"})', "gpu-07", id="ssh-hostname"),
        pytest.param('("@local", {})', "@local", id="pyinfra-connector"),
    ],
)
def test_addresses_that_are_addresses(tmp_path: Path, host: str, address: str) -> None:
    path = _write_inventory(tmp_path, f"web = [{host}]\n")
    assert load_inventory(path).hosts[0].address == address


def test_a_host_name_that_is_its_address_must_be_one(tmp_path: Path) -> None:
    path = _write_inventory(tmp_path, 'web = ["gpu_07"]\n')
    assert _inventory_error(path) == (
        f"{path}: host gpu_07: the host name is its address without kimi_address or ssh_hostname: "
        "an address must be an IP address or a DNS hostname"
    )


def test_a_host_name_with_a_control_character_is_refused(tmp_path: Path) -> None:
    path = _write_inventory(tmp_path, 'web = [("w1\\x1b[2J", {"kimi_address": "10.0.0.1"})]\n')
    assert _inventory_error(path) == f"{path}: host 'w1\\x1b[2J': the host name holds control character U+001B"


def test_keys_without_the_kimi_prefix_are_pyinfras(tmp_path: Path) -> None:
    path = _write_inventory(tmp_path, 'web = [("w1", {"ssh_port": 2222, "anything": [1]})]\n')
    assert load_inventory(path).host("w1").address == "w1"


def test_inventory_syntax_error(tmp_path: Path) -> None:
    path = _write_inventory(tmp_path, "web = [\n")
    assert _inventory_error(path).startswith(f"{path}: cannot load inventory: SyntaxError: ")


def test_missing_inventory_file(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.py")
    assert _inventory_error(path) == f"{path}: no such inventory file"


def test_directory_is_not_an_inventory_file(tmp_path: Path) -> None:
    assert _inventory_error(str(tmp_path)) == f"{tmp_path}: no such inventory file"


def test_inventory_file_that_raises(tmp_path: Path) -> None:
    path = _write_inventory(tmp_path, 'raise RuntimeError("no CMDB today")\n')
    assert _inventory_error(path) == f"{path}: cannot load inventory: RuntimeError: no CMDB today"


def test_group_data_file_that_raises(tmp_path: Path) -> None:
    path = _write_inventory(tmp_path, 'web = ["w1"]\n', {"web": "1 / 0\n"})
    assert _inventory_error(path) == f"{path}: cannot load inventory: ZeroDivisionError: division by zero"


def test_non_string_ssh_hostname(tmp_path: Path) -> None:
    path = _write_inventory(tmp_path, 'web = [("w1", {"ssh_hostname": 5})]\n')
    assert _inventory_error(path) == f"{path}: host w1: ssh_hostname: expected a string, found 5"


# ---- (c) placement -----------------------------------------------------------------------------------

SOURCE = "mem.py"


def _inventory(*hosts: tuple[str, tuple[str, ...]], data: Mapping[str, Mapping[str, Any]] | None = None) -> Inventory:
    built = tuple(make_host(SOURCE, name, groups, (data or {}).get(name, {})) for name, groups in hosts)
    groups: dict[str, list[str]] = {}
    for host in built:
        for group in host.groups:
            groups.setdefault(group, []).append(host.name)
    return Inventory(SOURCE, built, {g: tuple(names) for g, names in groups.items()})


def _pd_hosts(router: int = 1) -> list[tuple[str, tuple[str, ...]]]:
    hosts: list[tuple[str, tuple[str, ...]]] = [(f"p{i}", ("gb300", "gb300_prefill")) for i in range(6)]
    hosts += [(f"d{i}", ("gb300", "gb300_decode")) for i in range(4)]
    hosts += [(f"r{i}", ("gb300", "gb300_router")) for i in range(router)]
    return hosts


def _place_error(recipe: Recipe, inventory: Inventory, only: str | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        place(recipe, inventory, only)
    text = str(info.value)
    assert text.splitlines() == [text], f"not a single line: {text!r}"
    assert text.startswith(f"{SOURCE}: "), text
    return text


@pytest.mark.parametrize(
    ("hosts", "only", "expected"),
    [
        pytest.param(
            [("x", ("foo",))],
            None,
            "mem.py: host x: in no topology group of the recipe (expected one of: b300, gb300, tpu7x, ts_b300, ts_h200)",
            id="host-in-no-topology",
        ),
        pytest.param(
            [("x", ("b300", "tpu7x"))],
            None,
            "mem.py: host x: in the groups of several topologies: single-node, tpu7x",
            id="host-in-two-topologies",
        ),
        pytest.param(
            [("x", ("gb300",))],
            None,
            "mem.py: host x: topology gb300-pd: in no pool (expected one of groups: gb300_decode, gb300_prefill, "
            "gb300_router)",
            id="host-in-no-pool",
        ),
        pytest.param(
            [("x", ("gb300", "gb300_prefill", "gb300_decode"))],
            None,
            "mem.py: host x: topology gb300-pd: in several pools: gb300_prefill, gb300_decode",
            id="host-in-two-pools",
        ),
        pytest.param(
            [("x", ("gb300", "gb300_prefill", "gb300_router"))],
            None,
            "mem.py: host x: topology gb300-pd: in several pools: gb300_prefill, gb300_router",
            id="host-in-pool-and-router",
        ),
        pytest.param(
            [("t1", ("tpu7x",)), ("t2", ("tpu7x",))],
            None,
            "mem.py: group tpu7x: topology tpu7x: pool serve needs 8 hosts, found 2 (too few)",
            id="pool-too-few",
        ),
        pytest.param(
            [("b1", ("b300",)), ("b2", ("b300",))],
            None,
            "mem.py: group b300: topology single-node: pool serve needs 1 host, found 2 (too many)",
            id="pool-too-many",
        ),
        pytest.param(
            [*_pd_hosts()[:5], *_pd_hosts()[6:]],
            None,
            "mem.py: group gb300_prefill: topology gb300-pd: pool prefill needs 6 hosts, found 5 (too few)",
            id="prefill-one-short",
        ),
        pytest.param(
            _pd_hosts(router=0),
            None,
            "mem.py: group gb300_router: topology gb300-pd: the router needs exactly 1 host, found 0",
            id="router-none",
        ),
        pytest.param(
            _pd_hosts(router=2),
            None,
            "mem.py: group gb300_router: topology gb300-pd: the router needs exactly 1 host, found 2",
            id="router-two",
        ),
        pytest.param(
            [("b1", ("b300",))],
            "nope",
            "mem.py: topology 'nope' is not in the recipe "
            "(known: single-node, gb300-pd, tpu7x, tokenspeed-single, tokenspeed-multi)",
            id="only-unknown-topology",
        ),
        pytest.param(
            [("b1", ("b300",))],
            "tpu7x",
            "mem.py: topology tpu7x: group tpu7x has no hosts",
            id="only-topology-without-hosts",
        ),
        pytest.param(
            [],
            None,
            "mem.py: no host is in any topology group of the recipe",
            id="empty-inventory",
        ),
    ],
)
def test_placement_errors(
    recipe: Recipe, hosts: list[tuple[str, tuple[str, ...]]], only: str | None, expected: str
) -> None:
    assert _place_error(recipe, _inventory(*hosts), only) == expected


def test_only_keeps_one_topology(recipe: Recipe) -> None:
    inventory = _inventory(("b1", ("b300",)), ("b2", ("ts_b300",)))
    assert [t.name for t in place(recipe, inventory)] == ["single-node", "tokenspeed-single"]
    (only,) = place(recipe, inventory, only="tokenspeed-single")
    assert only.name == "tokenspeed-single"
    assert [p.host.name for p in only.engines] == ["b2"]


def test_only_still_checks_every_host(recipe: Recipe) -> None:
    inventory = _inventory(("b1", ("b300",)), ("x", ("foo",)))
    assert _place_error(recipe, inventory, only="single-node").startswith("mem.py: host x: in no topology group")


def test_instances_fill_in_inventory_order(recipe: Recipe) -> None:
    hosts = _pd_hosts()
    # List the prefill hosts in reverse: the order of the inventory decides instances and leaders.
    inventory = _inventory(*reversed(hosts[:6]), *hosts[6:])
    (tp,) = place(recipe, inventory)
    prefill = [p for p in tp.engines if p.pool_name == "prefill"]
    assert [p.host.name for p in prefill] == ["p5", "p4", "p3", "p2", "p1", "p0"]
    assert [p.leader.name for p in prefill] == ["p5", "p5", "p3", "p3", "p1", "p1"]


# ---- positive placement of prod ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def prod_placement(recipe: Recipe, prod: Inventory) -> dict[str, TopologyPlacement]:
    return {t.name: t for t in place(recipe, prod)}


def _row(p: Placement) -> tuple[str, int, int, int, str, int, int]:
    return (p.host.name, p.instance, p.node_rank, p.nodes, p.leader.name, p.dp_local, p.dp_start_rank)


def test_prod_places_every_topology(prod_placement: Mapping[str, TopologyPlacement], prod: Inventory) -> None:
    assert list(prod_placement) == [
        "single-node",
        "gb300-pd",
        "tpu7x",
        "tokenspeed-single",
        "tokenspeed-multi",
    ]
    placed = [p.host.name for t in prod_placement.values() for p in t.engines]
    routers = [t.router.name for t in prod_placement.values() if t.router is not None]
    assert sorted(placed + routers) == sorted(h.name for h in prod.hosts)
    assert len(placed) == len(set(placed))


def test_prod_gb300_prefill(prod_placement: Mapping[str, TopologyPlacement]) -> None:
    tp = prod_placement["gb300-pd"]
    prefill = [p for p in tp.engines if p.pool_name == "prefill"]
    # Three TP=8 instances of two 4-GPU hosts; TP spans hosts, so the worker has no DP rank.
    assert [_row(p) for p in prefill] == [
        ("gb300-p01", 0, 0, 2, "gb300-p01", 1, 0),
        ("gb300-p02", 0, 1, 2, "gb300-p01", 0, 0),
        ("gb300-p03", 1, 0, 2, "gb300-p03", 1, 0),
        ("gb300-p04", 1, 1, 2, "gb300-p03", 0, 0),
        ("gb300-p05", 2, 0, 2, "gb300-p05", 1, 0),
        ("gb300-p06", 2, 1, 2, "gb300-p05", 0, 0),
    ]
    assert all(p.pool.role == "prefill" for p in prefill)
    assert [p.host.name for p in tp.leaders("prefill")] == ["gb300-p01", "gb300-p03", "gb300-p05"]


def test_prod_gb300_decode(prod_placement: Mapping[str, TopologyPlacement]) -> None:
    tp = prod_placement["gb300-pd"]
    decode = [p for p in tp.engines if p.pool_name == "decode"]
    # One DP=16 instance over four hosts: four DP ranks on each, starting at 0, 4, 8, 12.
    assert [_row(p) for p in decode] == [
        ("gb300-d01", 0, 0, 4, "gb300-d01", 4, 0),
        ("gb300-d02", 0, 1, 4, "gb300-d01", 4, 4),
        ("gb300-d03", 0, 2, 4, "gb300-d01", 4, 8),
        ("gb300-d04", 0, 3, 4, "gb300-d01", 4, 12),
    ]
    assert sum(p.dp_local for p in decode) == 16
    assert [p.host.name for p in tp.leaders("decode")] == ["gb300-d01"]


def test_prod_gb300_router_and_store(prod_placement: Mapping[str, TopologyPlacement], prod: Inventory) -> None:
    tp = prod_placement["gb300-pd"]
    assert tp.router is not None
    assert tp.router.name == "gb300-rt01"
    assert tp.router.address == "10.41.0.50"
    assert {p.store_address for p in tp.engines} == {prod.host("gb300-rt01").address}
    assert "gb300-rt01" not in {p.host.name for p in tp.engines}


def test_prod_tpu7x(prod_placement: Mapping[str, TopologyPlacement]) -> None:
    tp = prod_placement["tpu7x"]
    assert tp.router is None
    rows = [_row(p) for p in tp.engines]
    assert rows == [(f"tpu7x-w{i}", 0, i, 8, "tpu7x-w0", 1 if i == 0 else 0, 0) for i in range(8)]
    assert {p.leader.address for p in tp.engines} == {"10.61.0.10"}
    assert {p.store_address for p in tp.engines} == {None}


def test_prod_single_hosts(prod_placement: Mapping[str, TopologyPlacement]) -> None:
    assert [_row(p) for p in prod_placement["single-node"].engines] == [("b300-01", 0, 0, 1, "b300-01", 1, 0)]
    assert [_row(p) for p in prod_placement["tokenspeed-single"].engines] == [("b300-02", 0, 0, 1, "b300-02", 1, 0)]
    assert [_row(p) for p in prod_placement["tokenspeed-multi"].engines] == [
        ("h200-01", 0, 0, 2, "h200-01", 1, 0),
        ("h200-02", 0, 1, 2, "h200-01", 0, 0),
    ]


def test_make_host_names_file_and_host() -> None:
    with pytest.raises(ConfigError) as info:
        make_host("inv.py", "h1", ("g",), {"kimi_adress": "x"})
    assert str(info.value) == "inv.py: host h1: kimi_adress: unknown key (did you mean 'kimi_address'?)"
    host: InventoryHost = make_host("inv.py", "h1", ("g",), {"ssh_hostname": "192.0.2.9", "other": object()})
    assert host.address == "192.0.2.9"
