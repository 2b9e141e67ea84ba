"""Recipe and inventory strings cannot add lines to unit files, and systemd reads every value as written.

Each attack goes in where a user's file goes in: the CLI (``kimi-deploy validate`` and ``plan
--render``) on a recipe or an inventory carrying it. A value that validation did not see (built in
code) is refused again when rendered. Values that systemd would expand (``%`` specifiers, ``$``
variables, quotes, backslashes) are read back from the rendered unit and environment file by
systemd's own rules (``config_parse_exec`` and ``parse_env_file_internal``), and ``systemd-analyze
verify`` accepts the unit.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from kimi_deploy.errors import ConfigError
from kimi_deploy.hostside.requests import SyncRequest
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe import Expose, Recipe, Scrub, SecretRef
from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.releases.host_paths import checkpoint_dir
from kimi_deploy.render.files import render_host
from kimi_deploy.render.scrub_units import scrub_files
from tests.cli_run import kimi
from tests.conftest import PROD, RECIPE, ROOT
from tests.unit_file import logical_lines

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

INJECTED = "ExecStartPre=+/usr/bin/touch /tmp/x"
COMMIT_RULE = "must be a commit, 40 lowercase hex digits (a branch or tag moves under the lock)"


def _one_line(run: subprocess.CompletedProcess[str]) -> str:
    assert (run.returncode, run.stdout) == (2, ""), run.stderr[-3000:]
    assert run.stderr.count("\n") == 1, run.stderr[-3000:]
    assert run.stderr.endswith("\n")
    assert "Traceback" not in run.stderr
    return run.stderr.rstrip("\n")


def _recipe(tmp_path: Path, edit: Any) -> Path:
    data = yaml.safe_load((ROOT / RECIPE).read_text(encoding="utf-8"))
    edit(data)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


# ---- the attacks, through the CLI ---------------------------------------------------------------


@pytest.mark.parametrize("trust_remote_code", [True, False])
def test_a_revision_with_a_unit_line_is_refused_by_validate_and_plan_render(
    tmp_path: Path, trust_remote_code: bool
) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["model"]["revision"] = f"main\n{INJECTED}"
        data["model"]["trust_remote_code"] = trust_remote_code

    recipe = _recipe(tmp_path, edit)
    expected = f"{recipe}: model.revision: {COMMIT_RULE}, found 'main\\n{INJECTED}'"
    assert _one_line(kimi("validate", str(recipe), PROD)) == expected
    out = tmp_path / "rendered"
    assert _one_line(kimi("plan", str(recipe), PROD, "--render", str(out))) == expected
    assert not out.exists()


@pytest.mark.parametrize(
    ("host_data", "field", "found"),
    [
        pytest.param(
            {"kimi_address": f"10.21.0.11\n{INJECTED}"},
            "kimi_address: must be an IP address or a DNS hostname",
            f"'10.21.0.11\\n{INJECTED}'",
            id="address-with-a-line",
        ),
        pytest.param(
            {"kimi_address": "10.21.0.11 --trust-remote-code"},
            "kimi_address: must be an IP address or a DNS hostname",
            "'10.21.0.11 --trust-remote-code'",
            id="address-with-a-flag",
        ),
        pytest.param(
            {"kimi_address": "10.21.0.256"},
            "kimi_address: must be an IP address or a DNS hostname",
            "'10.21.0.256'",
            id="address-mistyped",
        ),
        pytest.param(
            {"ssh_hostname": f"10.20.0.11\n{INJECTED}"},
            "ssh_hostname: is the host's address without kimi_address: "
            "an address must be an IP address or a DNS hostname",
            f"'10.20.0.11\\n{INJECTED}'",
            id="ssh-hostname-as-the-address",
        ),
        pytest.param(
            {"kimi_address": "10.21.0.11", "kimi_socket_ifname": "eth0\nX"},
            "kimi_socket_ifname: String should match pattern '^[A-Za-z0-9_.:@-]{1,15}$'",
            "str 'eth0\\nX'",
            id="ifname-with-a-line",
        ),
        pytest.param(
            {"kimi_address": "10.21.0.11", "kimi_recipe": f"recipes/x.yaml\n{INJECTED}"},
            "kimi_recipe: control character U+000A is refused in text that reaches a host's files",
            f"'recipes/x.yaml\\n{INJECTED}'",
            id="any-kimi-string",
        ),
    ],
)
def test_inventory_data_with_a_unit_line_is_refused(
    tmp_path: Path, host_data: dict[str, str], field: str, found: str
) -> None:
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"b300 = [('b300-01', {host_data!r})]\n", encoding="utf-8")
    assert _one_line(kimi("validate", RECIPE, str(inventory))) == f"{inventory}: host b300-01: {field}, found {found}"


def test_a_host_name_with_a_unit_line_is_refused(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"b300 = [({'b300-01' + chr(10) + INJECTED!r}, {{}})]\n", encoding="utf-8")
    assert _one_line(kimi("validate", RECIPE, str(inventory))) == (
        f"{inventory}: host 'b300-01\\n{INJECTED}': the host name holds control character U+000A"
    )


def test_a_billion_laughs_recipe_is_refused_quickly_in_512_mb(tmp_path: Path) -> None:
    """Nine levels of nine aliases: 387 million strings from 500 bytes. Refused before anything
    walks it; before, the error message's repr ran out of memory after 13 s (62 s and 2.5 GB free)."""
    levels = ["&a0 [" + ", ".join(['"lol"'] * 9) + "]"]
    levels += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    text = (ROOT / RECIPE).read_text(encoding="utf-8")
    assert "  quantization: mxfp4\n" in text
    recipe = tmp_path / "bomb.yaml"
    recipe.write_text(text.replace("  quantization: mxfp4\n", f"  quantization: [{', '.join(levels)}]\n"))
    run = kimi("validate", str(recipe), PROD, memory_bytes=512 * 2**20)
    assert (
        _one_line(run)
        == f"{recipe}: the document holds more than 100000 values with its YAML aliases expanded (an alias bomb?)"
    )


def test_an_integer_of_5000_digits_is_one_line(tmp_path: Path) -> None:
    text = (ROOT / RECIPE).read_text(encoding="utf-8")
    recipe = tmp_path / "big.yaml"
    recipe.write_text(text.replace("  shards: 96\n", f"  shards: {'9' * 5000}\n"), encoding="utf-8")
    line = text.splitlines().index("  shards: 96") + 1
    assert _one_line(kimi("validate", str(recipe), PROD)) == (
        f"{recipe}:{line}:11: YAML syntax: an integer of 5000 digits is longer than Python reads (4300 at most)"
    )


# ---- systemd reads every value as written -------------------------------------------------------

_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "s": " "}
_C_ESCAPES.update({c: c for c in "\\\"'"})


def _words(value: str) -> list[str]:
    """``extract_first_word(EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE)`` over a whole value."""
    words: list[str] = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in " \t":
            i += 1
        if i >= n:
            return words
        word, quote = "", ""
        while i < n and (quote or value[i] not in " \t"):
            char = value[i]
            if char == "\\":
                escaped = value[i + 1]
                assert escaped in _C_ESCAPES, f"escape \\{escaped} is not modelled here"
                word += _C_ESCAPES[escaped]
                i += 2
            elif not quote and char in "'\"":
                quote = char
                i += 1
            elif char == quote:
                quote = ""
                i += 1
            else:
                word += char
                i += 1
        assert not quote, f"unbalanced quote in {value!r}"
        words.append(word)


def _specifiers(word: str) -> str:
    # unit_full_printf: %% is a percent sign; any other %X is replaced by what it stands for.
    return re.sub(r"%(.)", lambda m: "%" if m.group(1) == "%" else f"<specifier %{m.group(1)}>", word)


def _variables(word: str) -> str:
    # replace_env_argv: a word that is $NAME, or ${NAME} anywhere, is replaced; $$ is a dollar sign.
    if re.fullmatch(r"\$[A-Za-z_][A-Za-z0-9_]*", word):
        return f"<variable {word}>"
    return re.sub(r"\$\$|\$\{[^}]*\}", lambda m: "$" if m.group() == "$$" else f"<variable {m.group()}>", word)


def systemd_argv(unit: str) -> list[str]:
    """The argv systemd runs for the unit's one ExecStart=, by ``config_parse_exec``'s rules."""
    (value,) = [line.partition("=")[2] for line in logical_lines(unit) if line.partition("=")[0] == "ExecStart"]
    command, *args = _words(value)
    assert command.startswith("/"), f"prefix characters or a relative command: {command!r}"
    return [_specifiers(command)] + [_variables(_specifiers(word)) for word in args]


def environment_file(text: str) -> dict[str, str]:
    """The variables of an EnvironmentFile, by ``parse_env_file_internal``'s rules."""
    out: dict[str, str] = {}
    state, key, value = "pre_key", "", ""
    for char in text + "\n":
        if state == "pre_key":
            if char in "#;":
                state = "comment"
            elif char not in " \t\n\r":
                state, key, value = "key", char, ""
        elif state == "key":
            if char in "\n\r":
                state = "pre_key"
            elif char == "=":
                state = "pre_value"
            else:
                key += char
        elif state in ("pre_value", "value"):
            if char in "\n\r":
                out[key.strip()] = value.rstrip(" \t") if state == "value" else value
                state = "pre_key"
            elif state == "pre_value" and char in "'\"":
                state = "single" if char == "'" else "double"
            elif char == "\\":
                state = "value_escape"
            elif state == "value" or char not in " \t":
                state, value = "value", value + char
        elif state == "value_escape":
            state = "value"
            if char not in "\n\r":
                value += char
        elif state == "single":
            state, value = ("pre_value", value) if char == "'" else ("single", value + char)
        elif state == "double":
            if char == '"':
                state = "pre_value"
            elif char == "\\":
                state = "double_escape"
            else:
                value += char
        elif state == "double_escape":
            state = "double"
            value += char if char in '"\\`$' else ("" if char == "\n" else "\\" + char)
        elif state == "comment" and char in "\n\r":
            state = "pre_key"
    return out


def test_the_readers_follow_systemd() -> None:
    unit = (
        '[Service]\nExecStart=/bin/echo \'a b\' "c\\"d" e%%f g%n $HOME ${X}y $$Z \\\n    --flag\n'
        "# ExecStart=/not/this\n"
    )
    assert systemd_argv(unit) == [
        "/bin/echo",
        "a b",
        'c"d',
        "e%f",
        "g<specifier %n>",
        "<variable $HOME>",
        "<variable ${X}>y",
        "$Z",
        "--flag",
    ]
    env = 'A=plain\nB="x \\"q\\" \\\\ \\$ \\n"\nC=\'s $x\'\n# D=no\nE=  trailing  \n'
    assert environment_file(env) == {"A": "plain", "B": 'x "q" \\ $ \\n', "C": "s $x", "E": "trailing"}


EXPANDABLE = "k3 %n %%d ${HOME} $HOME $$ \"dq\" 'sq' back\\slash ; #"


def test_values_systemd_would_expand_reach_the_engine_as_written(tmp_path: Path, prod: Inventory) -> None:
    """Free text of a recipe (an environment value) in ExecStart= and the environment file: read
    back by systemd's rules, each is exactly the recipe's; the speculative draft's JSON too."""

    def edit(data: dict[str, Any]) -> None:
        data["topologies"]["gb300-pd"]["env"] = {"KIMI_X": EXPANDABLE}

    recipe = load_recipe(_recipe(tmp_path, edit))
    host = plan(recipe, RECIPE, prod, "gb300-pd").for_host("gb300-p01")
    files = {f.path: f.content for f in render_host(recipe, host)}
    (unit,) = host.units
    service = files[f"/etc/systemd/system/{unit.name}.service"]
    argv = systemd_argv(service)
    assert argv == list(unit.argv)
    draft = recipe.topologies["gb300-pd"].speculative.draft  # type: ignore[union-attr]
    assert json.loads(argv[argv.index("--speculative-config") + 1])["model"] == checkpoint_dir(recipe, draft)  # type: ignore[arg-type]
    assert environment_file(files[f"/etc/kimi/{unit.name}.env"])["KIMI_X"] == EXPANDABLE
    _systemd_accepts(tmp_path, service)


def _sync_request() -> SyncRequest:
    return {
        "repo": "a/b",
        "revision": "a" * 40,
        "dir": "/srv/models/a--b/" + "a" * 40,
        "lock": {},
        "endpoint": None,
        "token_file": None,
        "retries": 2,
        "progress_log": "/var/log/kimi/weights.log",
    }


def test_scrub_unit_paths_with_specifiers_and_variables_reach_the_program_as_written(tmp_path: Path) -> None:
    """Paths reach the scrub's ExecStart= from code as well as from the recipe: quoted all the same."""
    config_dir = "/etc/kimi %n ${HOME} $$ 'q'"
    files = scrub_files(
        Scrub(),
        config_dir=config_dir,
        tools_dir="/opt/kimi/tools",
        python="/opt/kimi/tools/hh-1!2.0 %n/bin/python",
        request=_sync_request(),
    )
    service = next(f.content for f in files if f.path.endswith(".service"))
    assert systemd_argv(service) == [
        "/opt/kimi/tools/hh-1!2.0 %n/bin/python",
        "/opt/kimi/tools/kimi-weights-sync.py",
        "--config",
        f"{config_dir}/kimi-weights-scrub.json",
    ]
    _systemd_accepts(tmp_path, service)


@pytest.mark.parametrize("python", ["+/opt/kimi/python", "/opt/kimi/$HOME/python", "/opt/kimi/'q'/python"])
def test_a_scrub_command_systemd_would_not_run_as_written_is_refused(python: str) -> None:
    # systemd reads the command's prefixes ("+" runs it as root) and expands no variable in it.
    with pytest.raises(ConfigError) as info:
        scrub_files(
            Scrub(),
            config_dir="/etc/kimi",
            tools_dir="/opt/kimi/tools",
            python=python,
            request=_sync_request(),
        )
    assert str(info.value) == (
        "/etc/systemd/system/kimi-weights-scrub.service: ExecStart: the command must be an absolute path "
        f"without '$', quotes or backslashes, found [{python!r}]"
    )


# ---- a value that validation did not see is refused when rendered -------------------------------


def _with_topology(recipe: Recipe, **update: Any) -> Recipe:
    topology = recipe.topologies["single-node"].model_copy(update=update)
    return recipe.model_copy(update={"topologies": {**recipe.topologies, "single-node": topology}})


def _served_as(recipe: Recipe, name: str) -> Recipe:
    return recipe.model_copy(update={"model": recipe.model.model_copy(update={"served_name": name})})


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param(
            lambda r: _with_topology(r, env={"KIMI_X": f"a\n{INJECTED}"}),
            "/etc/kimi/kimi-vllm.env: a value holds control character U+000A, which would start a line of its own",
            id="environment-value",
        ),
        pytest.param(
            lambda r: _served_as(r, f"kimi\n{INJECTED}"),
            "/etc/systemd/system/kimi-vllm.service: a value holds control character U+000A, "
            "which would start a line of its own",
            id="description-and-argument",
        ),
        pytest.param(
            lambda r: _with_topology(r, env={"KIMI_X": "a\u2028b"}),
            "/etc/kimi/kimi-vllm.env: a value holds control character U+2028, which would start a line of its own",
            id="unicode-line-separator",
        ),
    ],
)
def test_a_control_character_past_validation_is_refused_when_rendered(
    recipe: Recipe, prod: Inventory, change: Any, expected: str
) -> None:
    changed = change(recipe)
    host = plan(changed, RECIPE, prod, "single-node").for_host("b300-01")
    with pytest.raises(ConfigError) as info:
        render_host(changed, host)
    assert str(info.value) == expected


def test_an_argument_with_a_line_break_is_refused_when_rendered(recipe: Recipe, prod: Inventory) -> None:
    host = plan(recipe, RECIPE, prod, "single-node").for_host("b300-01")
    (unit,) = host.units
    forged = replace(host, units=(replace(unit, argv=(*unit.argv, "--x", f"y\n{INJECTED}")),))
    with pytest.raises(ConfigError) as info:
        render_host(recipe, forged)
    assert str(info.value) == (
        f"/etc/systemd/system/kimi-vllm.service: ExecStart: argument {len(unit.argv) + 1} holds control character "
        f"U+000A, which no quoting keeps on its line, found 'y\\n{INJECTED}'"
    )


def test_a_secret_with_a_line_break_is_refused_without_showing_it(recipe: Recipe, prod: Inventory) -> None:
    exposed = _with_topology(recipe, expose=Expose(bind="address", api_key=SecretRef(env="KIMI_API_KEY")))
    host = plan(exposed, RECIPE, prod, "single-node").for_host("b300-01")
    secret = f"sk-kimi-7f3a\n{INJECTED}"
    with pytest.raises(ConfigError) as info:
        render_host(exposed, host, {"VLLM_API_KEY": secret, "api-key": secret})
    assert str(info.value) == (
        "/etc/kimi/secrets/kimi-vllm.env: a value holds control character U+000A, which would start a line of its own"
    )
    assert "sk-kimi" not in str(info.value)


systemd_analyze = shutil.which("systemd-analyze")


def _systemd_accepts(tmp_path: Path, unit: str) -> None:
    if systemd_analyze is None:
        return
    path = tmp_path / "check.service"
    path.write_text(unit, encoding="utf-8")
    verify = subprocess.run(
        [systemd_analyze, "verify", "--man=no", str(path)], capture_output=True, text=True, check=False, timeout=60
    )
    problems = [
        line
        for line in (verify.stdout + verify.stderr).splitlines()
        if line.strip() and "is not executable" not in line
    ]
    assert problems == []
