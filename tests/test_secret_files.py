"""Secret files on a host: root's alone, written without a copy anywhere else, and counted in the
recorded unit digests by their path, owner and mode only, while a changed secret still restarts
the units that read it."""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.api.command import FileUploadCommand, StringCommand
from pyinfra.connectors.ssh import SSHConnector
from pyinfra.connectors.util import write_stdin

from kimi_deploy.converge.plan import Converge, converge_request, needs_start, unit_state
from kimi_deploy.hostside import state_probe
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe import Expose, Recipe, SecretRef
from kimi_deploy.render.files import RenderedFile, render_host
from kimi_pyinfra.operations import units
from tests.conftest import RECIPE, ROOT, sglang_slice
from tests.host_converge import host_converge, probe_answer

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

KEY = "sk-kimi-d41c9a0e77b2"
SECRETS = {"VLLM_API_KEY": KEY, "api-key": KEY, "KIMI_API_KEY": KEY, "OPENAI_API_KEY": KEY}
ROUTER = "gb300-rt01"


def _commands(
    files: list[RenderedFile],
    group: str,
    current: dict[str, str | None],
    owners: Mapping[str, str | None] | None = None,
) -> list[Any]:
    """The commands ``units.rendered`` yields, or its no-op sentence; ``owners`` as the host
    holds each file (default: as planned)."""
    noops: list[str] = []
    held = {f.path: f.owner_mode(group) for f in files} if owners is None else owners
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(units, "host", SimpleNamespace(noop=noops.append))
        out = list(units.rendered._inner(files=files, group=group, current=current, owners=held))
    return out or noops


def _secret_files(recipe: Recipe, prod: Inventory) -> list[RenderedFile]:
    """The secret files of the router of gb300-pd and of an exposed SGLang leader (the gateway's in
    front of the router: tests/test_router_fallback.py)."""
    exposed = sglang_slice(recipe, expose=Expose(bind="address", api_key=SecretRef(env="KIMI_API_KEY")))
    files = render_host(recipe, plan(recipe, RECIPE, prod).for_host(ROUTER), SECRETS)
    files += render_host(exposed, plan(exposed, RECIPE, prod, "tpu7x").for_host("tpu7x-w0"), SECRETS)
    return [f for f in files if f.secret and "kimi-gateway" not in f.path]


def test_secret_contents_travel_only_on_the_standard_input_of_the_command_writing_them(
    recipe: Recipe, prod: Inventory
) -> None:
    files = _secret_files(recipe, prod)
    assert sorted(f.path for f in files) == [
        "/etc/kimi/secrets/kimi-router.env",
        "/etc/kimi/secrets/kimi-sglang.yaml",
    ]
    before, *writes = _commands(files, "kimi", {})
    assert before == "install -d -m 0750 -o root -g kimi /etc/kimi/secrets"
    # No upload: pyinfra would stage one, with a sudo SSH user, in its temporary directory.
    assert not any(isinstance(c, FileUploadCommand) for c in writes)
    # Each file: a new one beside it, root's alone before its content comes, renamed over it once whole
    # (no unit changed: no systemd reload after).
    for f, command in zip(files, writes, strict=True):
        size, new = len(f.content.encode()), f"{f.path}.kimi-new"
        assert str(command) == (
            f"install -m 600 -o root -g root /dev/null {new} && head -c {size} > {new}"
            f' && test "$(stat -c %s {new})" = {size} && mv -f {new} {f.path}'
        )
        assert command.connector_arguments == {"_stdin": f.content}
        assert KEY not in str(command)


def test_a_changed_unit_is_followed_by_a_systemd_reload() -> None:
    unit = RenderedFile("/etc/systemd/system/kimi-router.service", "[Unit]\n", 0o644, "root")
    env = RenderedFile("/etc/kimi/kimi-router.env", "A=1\n", 0o644, "root")
    assert _commands([unit, env], "kimi", {})[-1] == "systemctl daemon-reload"
    assert not any("daemon-reload" in str(c) for c in _commands([unit, env], "kimi", {unit.path: unit.sha256}))


def test_the_weights_transfer_key_alone_is_readable_by_the_engine_group() -> None:
    key = RenderedFile("/etc/kimi/secrets/weights-transfer-key", "k\n", 0o440, "root", secret=True)
    token = RenderedFile("/etc/kimi/secrets/hf-token", "hf_x\n", 0o600, "root", secret=True)
    _, written_key, written_token = (str(c) for c in _commands([key, token], "kimi", {}))
    assert written_key.startswith(
        "install -m 440 -o root -g kimi /dev/null /etc/kimi/secrets/weights-transfer-key.kimi-new && "
    )
    assert written_token.startswith("install -m 600 -o root -g root /dev/null /etc/kimi/secrets/hf-token.kimi-new && ")


def test_files_in_place_change_nothing(recipe: Recipe, prod: Inventory) -> None:
    files = _secret_files(recipe, prod)
    assert _commands(files, "kimi", {f.path: f.sha256 for f in files}) == ["2 rendered files are up to date"]


class _Host:
    """What pyinfra's SSH connector asks of a host and of its SSH session: records where the
    content of an upload is written, and each command with its standard input."""

    def __init__(self) -> None:
        self.written: list[str] = []
        self.commands: list[tuple[str, bytes]] = []
        self.host = self
        self.name = "gb300-rt01"

    def get_temp_filename(self, key: str) -> str:
        return "/tmp/pyinfra-" + hashlib.sha1(key.encode()).hexdigest()

    def _put_file(self, io: Any, remote: str) -> None:
        self.written.append(remote)

    def run_shell_command(self, command: StringCommand, **arguments: Any) -> tuple[bool, Any]:
        stdin = _Stdin()
        if arguments.get("_stdin"):
            write_stdin(arguments["_stdin"], stdin)  # type: ignore[no-untyped-call]
        self.commands.append((str(command), stdin.data))
        return True, SimpleNamespace(stderr="")


class _Stdin:
    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def close(self) -> None:
        pass


def test_with_a_sudo_ssh_user_no_secret_is_written_outside_its_own_file(recipe: Recipe, prod: Inventory) -> None:
    # Each command goes through pyinfra's own SSH connector as a sudo user's deploy runs it.
    files = _secret_files(recipe, prod)
    host = _Host()
    for command in _commands(files, "kimi", {}):
        if isinstance(command, FileUploadCommand):
            SSHConnector.put_file(host, command.src, command.dest, _sudo=True)  # type: ignore[arg-type]
        else:
            arguments = command.connector_arguments if isinstance(command, StringCommand) else {}
            host.run_shell_command(StringCommand(str(command)), _sudo=True, **arguments)
    assert host.written == []  # nothing staged in /tmp/pyinfra-<sha1>, readable there by others
    received = {command: stdin for command, stdin in host.commands if stdin}
    assert len(received) == len(files)
    for f in files:
        (stdin,) = [data for command, data in received.items() if f"> {f.path}.kimi-new " in command]
        assert stdin == f.content.encode()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder other users may enter, as /etc is: whether they read a file is its own mode's say."""
    path = Path(tempfile.mkdtemp(prefix="kimi-secrets-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _execute(commands: list[Any]) -> None:
    """Run an operation's commands here as root does over SSH (an upload writes the file in place)."""
    for command in commands:
        if isinstance(command, FileUploadCommand):
            with open(command.dest, "wb") as f:
                f.write(command.src.read())  # type: ignore[union-attr]
            continue
        stdin = _Stdin()
        arguments = command.connector_arguments if isinstance(command, StringCommand) else {}
        if arguments.get("_stdin"):
            write_stdin(arguments["_stdin"], stdin)  # type: ignore[no-untyped-call]
        subprocess.run(["sh", "-c", str(command)], input=stdin.data, check=True)


def _as_engine_user(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", "nobody", "--", *command], capture_output=True, text=True, check=False)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root and runuser")
def test_the_engine_user_can_neither_read_nor_rewrite_a_secret(
    recipe: Recipe, prod: Inventory, shared_dir: Path
) -> None:
    # The engine user is nobody here; every secret file of two hosts lands under shared_dir.
    config = str(shared_dir / "etc/kimi")
    mine = recipe.model_copy(update={"paths": recipe.paths.model_copy(update={"config": config, "user": "nobody"})})
    files = _secret_files(mine, prod)
    key = RenderedFile(f"{config}/secrets/weights-transfer-key", "k\n", 0o440, "root", secret=True)
    plain = RenderedFile(f"{config}/kimi-router.env", "A=1", 0o644, "root")  # no final newline
    os.makedirs(config)
    _execute(_commands([*files, key, plain], "nogroup", {}))
    assert Path(plain.path).read_text(encoding="utf-8") == "A=1"
    for f in files:
        assert Path(f.path).read_text(encoding="utf-8") == f.content
        read = _as_engine_user("cat", f.path)
        assert (read.returncode, KEY in read.stdout) == (1, False), f"{f.path}: the engine user reads it"
        rewrite = _as_engine_user("sh", "-c", f"printf 'api-key: \"mine\"\\n' > {f.path}")
        assert rewrite.returncode != 0, f"{f.path}: the engine user rewrites it"
        assert Path(f.path).read_text(encoding="utf-8") == f.content
    # The one secret the engine user's peer service reads: the run's transfer key.
    assert _as_engine_user("cat", key.path).stdout == "k\n"


def _stdin_of(command: StringCommand) -> bytes:
    """What pyinfra writes on ``command``'s standard input."""
    stdin = _Stdin()
    write_stdin(command.connector_arguments["_stdin"], stdin)  # type: ignore[no-untyped-call]
    return stdin.data


@pytest.mark.skipif(os.geteuid() != 0, reason="the folders are root's")
def test_a_write_cut_short_fails_and_leaves_the_previous_file_whole(tmp_path: Path) -> None:
    """The controller killed while a file's content streams (its SSH session cut: the standard
    input ends early): the command fails and the file keeps its previous content, byte for byte."""
    me, mine = pwd.getpwuid(os.geteuid()).pw_name, grp.getgrgid(os.getegid()).gr_name
    path = str(tmp_path / "etc/kimi/secrets/kimi-router.env")
    # a secret its group may read, of this test's own user and group
    old = RenderedFile(path, "VLLM_API_KEY=sk-old\n", 0o640, me, secret=True)
    new = RenderedFile(path, f"VLLM_API_KEY={KEY}\nOTHER=ünï\n", 0o640, me, secret=True)

    def run(commands: list[Any], cut: int | None = None) -> int:
        for command in commands:
            data = _stdin_of(command) if isinstance(command, StringCommand) else b""
            done = subprocess.run(["bash", "-c", str(command)], input=data[:cut], capture_output=True, check=False)
            if done.returncode:
                return done.returncode
        return 0

    # (a) the whole content lands, with its mode and owner, and nothing beside it
    assert run(_commands([old], mine, {})) == 0
    assert Path(path).read_bytes() == old.content.encode()
    st = os.stat(path)
    assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o640, os.geteuid(), os.getegid())
    assert os.listdir(os.path.dirname(path)) == ["kimi-router.env"]

    # (b) the new content cut short, at any point before its end: the command fails, the file is untouched
    write = _commands([new], mine, {path: old.sha256}, {path: old.owner_mode(mine)})[-1]
    size = len(new.content.encode())
    for cut in (0, 1, size // 2, size - 1):
        assert run([write], cut) != 0, cut
        assert Path(path).read_bytes() == old.content.encode(), cut
        assert os.stat(path).st_mode & 0o777 == 0o640
    # what arrived waits beside it, with the mode of the file, and the next run overwrites it
    assert os.stat(f"{path}.kimi-new").st_mode & 0o777 == 0o640
    assert run([write]) == 0
    assert Path(path).read_bytes() == new.content.encode()
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert not os.path.exists(f"{path}.kimi-new")


_DEPLOY = """
import os
from kimi_deploy.render.files import RenderedFile
from kimi_pyinfra.operations import units
out = os.environ["KIMI_TEST_OUT"]
units.rendered(name="Files", group="root", current={}, owners={}, files=[
    RenderedFile(out + "/secrets/kimi-router.env", "VLLM_API_KEY=sk-kimi-d41c9a0e77b2\\n", 0o600, "root", secret=True),
    RenderedFile(out + "/kimi-router.env", "A=1", 0o644, "root"),
])
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the files are root's")
def test_pyinfra_writes_each_file_from_the_standard_input_it_is_given(tmp_path: Path) -> None:
    deploy = tmp_path / "deploy.py"
    deploy.write_text(_DEPLOY, encoding="utf-8")
    pyinfra = str(Path(sys.executable).with_name("pyinfra"))
    env = {**os.environ, "KIMI_TEST_OUT": str(tmp_path / "out")}
    run = subprocess.run(
        [pyinfra, "@local", str(deploy), "-y"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert KEY not in run.stdout + run.stderr
    secret = tmp_path / "out/secrets/kimi-router.env"
    assert secret.read_text(encoding="utf-8") == f"VLLM_API_KEY={KEY}\n"
    assert (secret.stat().st_mode & 0o777, secret.stat().st_uid) == (0o600, os.geteuid())
    assert (tmp_path / "out/kimi-router.env").read_bytes() == b"A=1"


def _router_converge(recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch, key: str) -> Converge:
    monkeypatch.setenv("KIMI_API_KEY", key)
    return host_converge(recipe, prod, ROUTER)


def test_what_a_host_records_confirms_no_guessed_key(
    recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Anyone on the host reads the release's record and the units' applied markers; the
    # operator's logs show them too. Computing them for a guessed key must not tell it apart.
    real = _router_converge(recipe, prod, monkeypatch, KEY)
    for guess in ("sk-kimi-00000000", "password"):
        guessed = _router_converge(recipe, prod, monkeypatch, guess)
        assert guessed.release == real.release
        assert [u.release for u in guessed.units] == [u.release for u in real.units]
    assert any(u.secrets for u in real.units)
    shown = f"{real.release} {real.units} {converge_request(real)}"
    assert KEY not in shown
    assert not any(sha in shown for u in real.units for sha in u.secrets.values())


def test_a_changed_key_still_restarts_the_units_that_read_it(
    recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = _router_converge(recipe, prod, monkeypatch, "sk-kimi-old-key")
    new = _router_converge(recipe, prod, monkeypatch, KEY)
    state = probe_answer(old)  # the host as the last converge left it
    restarts = {u.name for u in new.units if needs_start(u.release, unit_state(u, state))}
    assert restarts == {"kimi-router", "kimi-gateway"}  # they read the key; the Mooncake master does not
    assert not any(needs_start(u.release, unit_state(u, state)) for u in old.units)
    # A secret another deploy left to the engine user reads as differing (the probe's null).
    router = next(u for u in old.units if u.name == "kimi-router")
    assert needs_start(router.release, unit_state(router, state | {"files": {}}))


def test_the_probe_finds_a_secret_written_after_the_units_last_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A converge that wrote the key and stopped before the restart: the next one restarts it.
    monkeypatch.setattr(state_probe, "APPLIED", str(tmp_path / "applied"))
    monkeypatch.setattr(state_probe, "_show", lambda unit, props: {"ActiveState": "active"})
    secret = tmp_path / "kimi-router.env"
    secret.write_text("VLLM_API_KEY=a\n", encoding="utf-8")
    time.sleep(0.05)
    (tmp_path / "applied").mkdir()
    (tmp_path / "applied/kimi-router").write_text("digest\n", encoding="utf-8")
    secrets = {"kimi-router": [str(secret)]}
    assert state_probe._units(["kimi-router"], {}, secrets)["kimi-router"]["secrets_changed"] is False
    time.sleep(0.05)
    secret.write_text("VLLM_API_KEY=b\n", encoding="utf-8")
    found = state_probe._units(["kimi-router", "kimi-mooncake-master"], {}, secrets)
    assert found["kimi-router"]["secrets_changed"] is True
    assert found["kimi-mooncake-master"]["secrets_changed"] is False
    assert needs_start("digest", found["kimi-router"])


def test_the_probe_reads_each_files_owner_and_mode_beside_its_content(tmp_path: Path) -> None:
    secret = tmp_path / "kimi-router.env"
    secret.write_bytes(b"VLLM_API_KEY=a\n")
    secret.chmod(0o600)
    sha = hashlib.sha256(b"VLLM_API_KEY=a\n").hexdigest()
    answer = state_probe.probe({"user": "root", "files": [str(secret), str(tmp_path / "absent")]})
    assert answer["files"] == {str(secret): sha, str(tmp_path / "absent"): None}
    assert answer["owners"][str(secret)] == "root:root:600"
    assert answer["owners"][str(tmp_path / "absent")] is None
    secret.chmod(0o640)
    again = state_probe.probe({"user": "root", "files": [str(secret)]})
    assert (again["files"][str(secret)], again["owners"][str(secret)]) == (sha, "root:root:640")


def test_a_file_of_the_right_content_gets_its_owner_and_mode_back_alone(recipe: Recipe, prod: Inventory) -> None:
    """Its content is not written again: its time stays, and nothing that reads it restarts."""
    files = _secret_files(recipe, prod)
    wrong = {f.path: f.owner_mode("kimi") for f in files} | {files[0].path: "kimi:kimi:644"}
    commands = _commands(files, "kimi", {f.path: f.sha256 for f in files}, wrong)
    q = shlex.quote
    assert commands == [f"chown root:root {q(files[0].path)} && chmod {files[0].mode:o} {q(files[0].path)}"]


def test_the_probe_request_names_the_secrets_and_files_each_unit_reads(
    recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = converge_request(_router_converge(recipe, prod, monkeypatch, KEY))
    # the probe reports every file's owner and mode (no expectation travels with the request)
    assert "modes" not in request
    assert request["unit_secrets"] == {
        "kimi-router": ["/etc/kimi/secrets/kimi-router.env"],
        "kimi-gateway": ["/etc/kimi/secrets/kimi-gateway-keys.conf", "/etc/kimi/secrets/kimi-gateway.env"],
    }


def test_the_release_record_holds_no_secret(recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    todo = _router_converge(recipe, prod, monkeypatch, KEY)
    assert "/etc/kimi/secrets/kimi-router.env" not in todo.release.record["files"]
    assert KEY not in repr(todo)
