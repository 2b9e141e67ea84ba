"""Properties every rendered unit must have, checked on every host of the example inventory."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kimi_deploy.errors import ConfigError
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.planner import argv_positionals, plan
from kimi_deploy.plan.servespec import HostPlan, Plan
from kimi_deploy.recipe import Expose, Recipe, SecretRef
from kimi_deploy.releases.catalog import load_catalog
from kimi_deploy.render.files import RenderedFile, render_host
from tests.conftest import RECIPE, sglang_slice
from tests.unit_file import directives, exec_argv

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

SECRET = "sk-kimi-test-9f1c2e7a"
SECRETS = {"VLLM_API_KEY": SECRET, "api-key": SECRET, "KIMI_API_KEY": SECRET, "OPENAI_API_KEY": SECRET}


@pytest.fixture(scope="module")
def full_plan(recipe: Recipe, prod: Inventory) -> Plan:
    return plan(recipe, RECIPE, prod)


def _units(recipe: Recipe, full_plan: Plan) -> list[tuple[HostPlan, RenderedFile]]:
    out = []
    for host in full_plan.hosts:
        for f in render_host(recipe, host, SECRETS):
            if f.path.endswith(".service"):
                out.append((host, f))
    return out


def test_exec_start_reads_back_as_the_planned_argv(recipe: Recipe, full_plan: Plan) -> None:
    for host, f in _units(recipe, full_plan):
        unit = next(u for u in host.units if f.path.endswith(f"/{u.name}.service"))
        assert exec_argv(f.content) == list(unit.argv), f"{host.host}: {f.path}"


def test_every_engine_flag_is_in_the_pinned_release_catalog(recipe: Recipe, full_plan: Plan) -> None:
    checked = 0
    for host, f in _units(recipe, full_plan):
        if host.role == "router":
            continue
        argv = exec_argv(f.content)
        catalog = load_catalog(host.engine, host.engine_version)
        assert (
            catalog.problems(tuple(argv), argv_positionals(recipe.topologies[host.topology].engine, catalog)) == []
        ), f"{host.host}: {f.path}"
        checked += 1
    assert checked == len([h for h in full_plan.hosts if h.role != "router"])


def test_units_run_unprivileged_and_hardened(recipe: Recipe, full_plan: Plan) -> None:
    for host, f in _units(recipe, full_plan):
        d = directives(f.content)
        # The gateway and the router hold keys, the Mooncake master faces the network: none is
        # the engine user, each a user of its own that systemd makes at each start.
        name = f.path.rsplit("/", 1)[-1].removesuffix(".service")
        own = name in ("kimi-gateway", "kimi-router", "kimi-mooncake-master")
        assert d["User"] == [name if own else recipe.paths.user], f"{host.host}: {f.path}"
        assert d.get("DynamicUser") == (["yes"] if own else None), f"{host.host}: {f.path}"
        assert d["NoNewPrivileges"] == ["yes"]
        assert d["ProtectSystem"] == ["strict"]
        assert d["CapabilityBoundingSet"] == [""]


def test_engines_listen_on_loopback_unless_the_recipe_exposes_them(recipe: Recipe, full_plan: Plan) -> None:
    for host in full_plan.hosts:
        topo = recipe.topologies[host.topology]
        for unit in host.units:
            if unit.kind == "router":
                # It checks no client key: on loopback, behind the gateway that checks it.
                assert unit.argv[unit.argv.index("--host") + 1] == "127.0.0.1", f"{host.host} {unit.name}"
                continue
            if "api" not in unit.listens:
                continue
            host_flag = unit.argv[unit.argv.index("--host") + 1]
            if topo.expose is None:
                assert host_flag == "127.0.0.1", f"{host.host} {unit.name}"
            else:
                assert host_flag == host.address, f"{host.host} {unit.name}"
                if unit.kind == "engine":
                    assert unit.secret_env or unit.secret_files, f"{host.host}: exposed without a key"


def test_secrets_only_in_files_root_alone_reads(recipe: Recipe, full_plan: Plan) -> None:
    # systemd reads them as PID 1: no process of the engine user reads or rewrites one.
    secret_files = 0
    for host in full_plan.hosts:
        for unit in host.units:
            assert all(SECRET not in a for a in unit.argv)
        for f in render_host(recipe, host, SECRETS):
            if f.secret:
                secret_files += 1
                assert (f.mode, f.owner, f.group(recipe.paths.user)) == (0o600, "root", "root")
                assert f.path.startswith(f"{recipe.paths.config}/secrets/")
                # the gateway's nginx holds the client key as the digest of its Authorization line
                assert SECRET in f.content or hashlib.sha256(f"Bearer {SECRET}".encode()).hexdigest() in f.content
            else:
                assert SECRET not in f.content, f"{host.host}: {f.path} holds a secret"
                assert f.mode == 0o644
    # Every exposed engine leader of gb300-pd (3 prefill + 1 decode) has its secret env file, the
    # router its own (the key it sends the engines), the gateway its keys and the smoke test's copy.
    assert secret_files == 7


def test_rendered_files_never_show_their_content_when_printed(recipe: Recipe, full_plan: Plan) -> None:
    # pyinfra prints operation arguments (--json, -v): a printed file list must not carry a secret.
    files = render_host(recipe, full_plan.for_host("gb300-p01"), SECRETS)
    assert any(f.secret for f in files)
    assert SECRET not in str(files)
    assert SECRET not in repr(files)


def test_plan_render_without_secrets_writes_no_secret_file(recipe: Recipe, full_plan: Plan) -> None:
    for host in full_plan.hosts:
        assert not [f for f in render_host(recipe, host) if f.secret or "/secrets/" in f.path]


def _exposed_sglang_leader(recipe: Recipe, prod: Inventory) -> tuple[Recipe, HostPlan]:
    exposed = sglang_slice(recipe, expose=Expose(bind="address", api_key=SecretRef(env="KIMI_API_KEY")))
    return exposed, plan(exposed, RECIPE, prod, "tpu7x").for_host("tpu7x-w0")


def test_sglang_api_key_travels_in_a_credential_not_argv(recipe: Recipe, prod: Inventory) -> None:
    exposed, leader = _exposed_sglang_leader(recipe, prod)
    unit, gateway = leader.units
    files = {f.path: f for f in render_host(exposed, leader, SECRETS)}
    source = "/etc/kimi/secrets/kimi-sglang.yaml"
    assert (files[source].secret, files[source].mode, files[source].owner) == (True, 0o600, "root")
    assert files[source].content.splitlines()[-1] == f'api-key: "{SECRET}"'
    # systemd (PID 1) loads the root-only file at each start; SGLang reads its copy in the
    # unit's credentials directory, which the unit file names with systemd's %d.
    service = files["/etc/systemd/system/kimi-sglang.service"].content
    assert directives(service)["LoadCredential"] == [f"kimi-sglang.yaml:{source}"]
    assert "--config %d/kimi-sglang.yaml" in service
    argv = exec_argv(service)
    assert argv[argv.index("--config") + 1] == "%d/kimi-sglang.yaml"
    # Exposed without a router: the gateway takes the address, the engine stays on loopback.
    assert unit.argv[unit.argv.index("--host") + 1] == "127.0.0.1"
    assert (gateway.kind, gateway.bind, gateway.listens) == ("gateway", "10.61.0.10", {"api": 30000})


def test_a_percent_d_from_the_recipe_stays_escaped(recipe: Recipe, prod: Inventory) -> None:
    # Only the credential path the engine module makes keeps systemd's specifier.
    named = recipe.model_copy(update={"model": recipe.model.model_copy(update={"served_name": "%d/x"})})
    exposed, leader = _exposed_sglang_leader(named, prod)
    service = next(f.content for f in render_host(exposed, leader, SECRETS) if f.path.endswith(".service"))
    argv = exec_argv(service)
    assert argv[argv.index("--served-model-name") + 1] == "%d/x"
    assert "%%d/x" in service


def test_tokenspeed_refuses_exposure_rather_than_a_key_in_argv(recipe: Recipe, prod: Inventory) -> None:
    topo = recipe.topologies["tokenspeed-single"].model_copy(
        update={"expose": Expose(bind="0.0.0.0", api_key=SecretRef(env="KIMI_API_KEY"))}
    )
    exposed = recipe.model_copy(update={"topologies": {**recipe.topologies, "tokenspeed-single": topo}})
    with pytest.raises(ConfigError) as err:
        plan(exposed, RECIPE, prod, "tokenspeed-single")
    assert str(err.value).startswith(f"{RECIPE}: topologies.tokenspeed-single.expose: TokenSpeed takes")


systemd_analyze = shutil.which("systemd-analyze")


@pytest.mark.skipif(systemd_analyze is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_every_unit_and_rates_it_ok(
    recipe: Recipe, prod: Inventory, full_plan: Plan, tmp_path: Path
) -> None:
    assert systemd_analyze is not None
    seen: set[tuple[str, str, str, str, bool]] = set()
    # and an exposed SGLang leader, whose unit loads a credential
    exposed, leader = _exposed_sglang_leader(recipe, prod)
    sglang = [(leader, f) for f in render_host(exposed, leader, SECRETS) if f.path.endswith(".service")]
    for host, f in _units(recipe, full_plan) + sglang:
        key = (host.topology, host.pool, host.node_role, f.path, host is leader)
        if key in seen:
            continue
        seen.add(key)
        path = tmp_path / Path(f.path).name
        path.write_text(f.content, encoding="utf-8")
        verify = subprocess.run(
            [systemd_analyze, "verify", "--man=no", str(path)], capture_output=True, text=True, check=False
        )
        problems = [
            line
            for line in (verify.stdout + verify.stderr).splitlines()
            if line.strip() and "is not executable" not in line
        ]
        assert problems == [], f"{host.host}: {f.path}"
        security = subprocess.run(
            [systemd_analyze, "security", "--offline=yes", "--no-pager", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        score = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", security.stdout)
        assert score is not None, security.stdout[-500:]
        assert float(score.group(1)) <= 4.0, f"{host.host}: {f.path} exposure {score.group(1)}"
