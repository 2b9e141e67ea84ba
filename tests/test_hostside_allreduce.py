"""``hostside/allreduce.py`` without torch: its request, its figures, its verdicts, and what it says
when the engine release it runs with has no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.host.command import hostside_command
from kimi_deploy.hostside import allreduce
from kimi_deploy.parsers.nccl_tests import parse_nccl_tests

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

FIXTURES = Path(__file__).resolve().parent / "parsers" / "fixtures"


def _raw(**change: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "run": "r1",
        "label": "multi/serve#0",
        "me": "h200-02",
        "address": "10.31.0.12",
        "backend": "nccl",
        "rendezvous": {"address": "10.31.0.11", "port": 29498},
        "hosts": [
            {"host": "h200-01", "address": "10.31.0.11", "ranks": 8},
            {"host": "h200-02", "address": "10.31.0.12", "ranks": 8},
        ],
        "min_bytes": 2**20,
        "max_bytes": 2**30,
        "warmup_iters": 5,
        "iters": 20,
        "deadline_s": 120,
        "min_busbw_gbs": 300,
        "env": {"NCCL_IB_HCA": "mlx5"},
    }
    raw.update(change)
    return raw


def test_ranks_follow_the_hosts_in_order() -> None:
    req = allreduce.parse(_raw())
    assert req.world == 16
    assert (req.mine.first_rank, req.mine.ranks) == (8, 8)
    assert [req.host_of(r) for r in (0, 7, 8, 15)] == ["h200-01", "h200-01", "h200-02", "h200-02"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"backend": "mpi"}, "request.backend: 'mpi' is not nccl or gloo"),
        ({"me": "h200-09"}, "request.me: 'h200-09' is not among request.hosts"),
        ({"rendezvous": {"address": "10.31.0.11", "port": 70000}}, "rendezvous.port: 70000 is not a TCP port"),
        ({"rendezvous": {"address": "leader", "port": 29498}}, "rendezvous.address: 'leader' is not an IP address"),
        ({"min_bytes": 3}, "request: min_bytes 3 and max_bytes 1073741824 must be multiples of 4, min <= max"),
        ({"iters": 0}, "request.iters: 0 must be > 0"),
        ({"hosts": [{"host": "h200-02", "address": "10.31.0.12", "ranks": 8}] * 2}, "hosts[1].host: 'h200-02'"),
    ],
)
def test_a_bad_request_names_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(allreduce.BadRequest) as info:
        allreduce.parse(_raw(**change))
    assert str(info.value).startswith(message)


def test_sizes_double_and_end_at_the_largest() -> None:
    assert allreduce.sizes(2**20, 2**23) == [2**20, 2**21, 2**22, 2**23]
    assert allreduce.sizes(2**20, 3 * 2**20) == [2**20, 2**21, 3 * 2**20]
    assert allreduce.sizes(4, 4) == [4]


def test_bus_bandwidth_is_computed_as_nccl_tests_does() -> None:
    # Every row of a real run (2 nodes x 8 H100, nccl-tests issue 309): the same algbw and busbw
    # from the size and the printed time, to the printed precision.
    text = (FIXTURES / "nccl_allreduce_h100_2node_16rank_good_nvls_ompi_noise_nccltests309.txt").read_text()
    rows = parse_nccl_tests(text)["rows"]
    assert len(rows) > 20
    for row in rows:
        measured = row["out_of_place"]
        if measured["time_us"] < 100:  # the time's 2 printed digits bound the precision
            continue
        algbw, busbw = allreduce.bus_bandwidth(row["size_bytes"], measured["time_us"] * 1e-6, 16)
        assert abs(algbw - measured["algbw_gbs"]) < 0.01 + measured["algbw_gbs"] * 1e-3, row
        assert abs(busbw - measured["busbw_gbs"]) < 0.02 + measured["busbw_gbs"] * 1e-3, row
    assert allreduce.bus_bandwidth(2**20, 1e-3, 1)[1] == 0.0  # one rank moves nothing


def test_the_verdict_names_wrong_values_first_then_a_slow_bus() -> None:
    req = allreduce.parse(_raw())
    good = {"size_bytes": 2**30, "time_us": 5000.0, "algbw_gbs": 214.7, "busbw_gbs": 402.6, "wrong": 0}
    assert allreduce.verdict(req, [good]) is None
    slow = {**good, "busbw_gbs": 120.25}
    assert allreduce.verdict(req, [good, slow]) == "bus bandwidth 120 GB/s at 1 GiB, needs >= 300 GB/s"
    wrong = {**good, "size_bytes": 2**21, "wrong": 512}
    assert allreduce.verdict(req, [wrong, slow]) == "512 wrong values in the result at 2 MiB"


def test_absent_ranks_are_named_by_host() -> None:
    req = allreduce.parse(_raw())
    assert allreduce.never_joined(req, list(range(8, 16))) == (
        "h200-02 (ranks 8-15) never joined the rendezvous at 10.31.0.11:29498 within 120 s"
    )


def test_the_ranks_use_the_interface_of_the_hosts_address_unless_the_topology_says() -> None:
    assert allreduce.interface_of("127.0.0.1") == "lo"
    req = allreduce.parse(_raw())
    env = allreduce.rank_env(req, "eth1")
    assert env == {"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "eth1"}
    told = allreduce.parse(_raw(env={"NCCL_SOCKET_IFNAME": "bond0"}))
    assert allreduce.rank_env(told, "eth1")["NCCL_SOCKET_IFNAME"] == "bond0"


def test_a_release_without_torch_fails_with_one_line_naming_it() -> None:
    # This interpreter has no torch: the launcher forks its ranks, each finds none.
    request = _raw(
        me="a",
        address="127.0.0.1",
        backend="gloo",
        rendezvous={"address": "127.0.0.1", "port": 29597},
        hosts=[{"host": "a", "address": "127.0.0.1", "ranks": 2}],
        deadline_s=10,
    )
    run = subprocess.run(
        hostside_command(sys.executable, "allreduce.py", request),
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 1, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith("kimi-deploy:")]
    assert lines == [
        "kimi-deploy: all-reduce: multi/serve#0 on a (2 ranks, gloo): rank 0 (a): "
        "the engine release has no torch (No module named 'torch')"
    ]
    assert json.loads(run.stdout)["ok"] is False
