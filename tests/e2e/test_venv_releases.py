"""Engine and tool releases installed with uv from a lock, on a one-host cluster of their own.

The same lock comes back on a fresh reinstall; a damaged release is found by the probe and rebuilt
from its lock while the engine keeps serving, even after the index has a newer dependency; an index
that is down and a pinned version missing from it give one line and leave the engine serving; the
lock the controller resolved is what is installed, whatever the index says by then.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.own_cluster import BIN, ROOT, Run
from kimi_deploy.hostside.boundary_lock import freeze_pins, lock_pins
from localcluster.hub import write_faults
from tests.e2e.demo import gpu_recipe_data, ssh
from tests.wheel_file import pure_wheel

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the test cluster needs root and iproute2"
)

CLUSTER_DIR = Path("/var/lib/kimi-cluster-venv")
ENV = {"KIMI_CLUSTER_DIR": str(CLUSTER_DIR), "KIMI_CLUSTER_SUBNET": "10.213.12.0/24"}
HOST = "kimi-h1"
ENGINE = "/opt/kimi/engines/vllm-0.34.0+fastsafetensors-0.5.0"
TOOLS = "/opt/kimi/tools/huggingface_hub-2.4.0"
SITE = "lib/python3.11/site-packages"


def _cli(*args: str) -> None:
    subprocess.run(
        [str(BIN / "kimi-deploy"), "cluster", *args], cwd=ROOT, check=True, timeout=900, env={**os.environ, **ENV}
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One host, its index and Hub; the demo inventory copied to put the vLLM topology on it."""
    _cli("up", "--hosts", "1", "--hardware", "b300x8")
    try:
        here = tmp_path_factory.mktemp("venv-releases")
        text = (ROOT / "inventories/demo.py").read_text(encoding="utf-8")
        (here / "inventory.py").write_text(
            text + "\ndemo_vllm = _hosts[:1]\ndemo_sglang: list = []\n", encoding="utf-8"
        )
        st = json.loads((CLUSTER_DIR / "state.json").read_text(encoding="utf-8"))
        yield {**st, "dir": here}
    finally:
        _cli("down")


def _recipe(st: dict[str, Any], edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    data = gpu_recipe_data()
    del data["topologies"]["demo-sglang"]
    vllm = data["topologies"]["demo-vllm"]
    vllm["expose"]["api_key"] = {"file": str(CLUSTER_DIR / "api-key")}
    vllm["pools"]["serve"].update(hosts=1, instances=1)
    if edit is not None:
        edit(data)
    path: Path = st["dir"] / f"recipe-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def converge(st: dict[str, Any], edit: Callable[[dict[str, Any]], None] | None = None) -> Run:
    proc = subprocess.run(
        [
            str(BIN / "pyinfra"),
            str(st["dir"] / "inventory.py"),
            "deploys/kimi.py",
            "-y",
            "--data",
            f"kimi_recipe={_recipe(st, edit)}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, **ENV},
    )
    return Run(proc.returncode, None, proc.stdout + proc.stderr)


def on_host(st: dict[str, Any], command: str) -> str:
    return ssh(HOST, command, cluster_state=st)


def engine_pid(st: dict[str, Any]) -> int:
    return int(on_host(st, "systemctl show -p MainPID --value kimi-vllm.service"))


def chat(st: dict[str, Any]) -> str:
    key = (CLUSTER_DIR / "api-key").read_text(encoding="utf-8").strip()
    body = {"model": "kimi-local", "messages": [{"role": "user", "content": "Reply with exactly the word READY."}]}
    request = urllib.request.Request(
        f"http://{st['hosts'][0]['address']}:8000/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return str(json.loads(answer.read())["choices"][0]["message"]["content"])


def release(st: dict[str, Any], path: str) -> dict[str, Any]:
    """A release's lock, freeze and marker as the host holds them."""
    lock = on_host(st, f"cat {path}/.kimi-lock.txt")
    freeze = on_host(st, f"cat {path}/.kimi-freeze.txt")
    return {"lock": lock, "freeze": freeze, "marker": json.loads(on_host(st, f"cat {path}/.kimi-release.json"))}


def lines(run: Run, needle: str) -> list[str]:
    return [line.strip() for line in run.log.splitlines() if needle in line]


def host_lines(run: Run, needle: str) -> list[str]:
    """The run's ``kimi-deploy:`` lines about ``HOST`` that hold ``needle`` (the host's own, or the
    controller's about it)."""
    return [line.strip() for line in run.log.splitlines() if f"[{HOST}] kimi-deploy: " in line and needle in line]


@pytest.fixture
def newer_idna(cluster: dict[str, Any]) -> Iterator[Path]:
    """A newer idna (a dependency of huggingface_hub's) built aside; removed from the index after."""
    wheel = pure_wheel(cluster["dir"], "idna", "99.0")
    try:
        yield wheel
    finally:
        (CLUSTER_DIR / "index/files" / wheel.name).unlink(missing_ok=True)


def test_releases_are_the_locked_set_and_a_fresh_reinstall_brings_the_same_back(cluster: dict[str, Any]) -> None:
    run = converge(cluster)
    assert run.code == 0, run.log[-3000:]
    before = {path: release(cluster, path) for path in (ENGINE, TOOLS)}
    for got in before.values():
        assert freeze_pins(got["freeze"]) == lock_pins(got["lock"])
        assert got["marker"]["lock"]["sha256"] == hashlib.sha256((got["lock"] + "\n").encode()).hexdigest()
    assert lock_pins(before[ENGINE]["lock"]) == {"vllm": "0.34.0", "fastsafetensors": "0.5.0"}
    assert "--hash=sha256:" in before[TOOLS]["lock"]
    pid = engine_pid(cluster)

    on_host(cluster, f"rm -rf {ENGINE} {TOOLS}")
    run = converge(cluster)
    assert run.code == 0, run.log[-3000:]
    after = {path: release(cluster, path) for path in (ENGINE, TOOLS)}
    assert {p: (r["lock"], r["freeze"]) for p, r in after.items()} == {
        p: (r["lock"], r["freeze"]) for p, r in before.items()
    }
    assert engine_pid(cluster) == pid
    assert chat(cluster) == "READY"


def test_a_damaged_release_is_rebuilt_from_its_lock_while_the_engine_serves(
    cluster: dict[str, Any], newer_idna: Path
) -> None:
    run = converge(cluster)
    assert run.code == 0, run.log[-3000:]
    locks = {path: release(cluster, path)["lock"] for path in (ENGINE, TOOLS)}
    pid = engine_pid(cluster)
    # A fresh resolution would now take idna 99.0; the rebuilt release must keep the idna it locked
    # (PyPI's newest when the cluster's index mirrored it).
    shutil.copy(newer_idna, CLUSTER_DIR / "index/files")
    on_host(cluster, f"rm {ENGINE}/{SITE}/vllm/__init__.py {TOOLS}/{SITE}/huggingface_hub/__init__.py")
    answers: list[str] = []
    stop = threading.Event()

    def ask() -> None:
        while not stop.is_set():
            try:
                answers.append(chat(cluster))
            except OSError as exc:
                answers.append(repr(exc))
            time.sleep(0.1)

    poller = threading.Thread(target=ask, daemon=True)
    poller.start()
    try:
        run = converge(cluster)
    finally:
        stop.set()
        poller.join()
    assert run.code == 0, run.log[-3000:]
    for path, rel in ((ENGINE, "vllm"), (TOOLS, "huggingface_hub")):
        (line,) = lines(run, f"[{HOST}] kimi-deploy: {path}:")
        assert line.endswith(
            f"{path}: 1 file missing or changed since install ({SITE}/{rel}/__init__.py): rebuilding it from its lock, beside it"
        )
        got = release(cluster, path)
        assert got["lock"] == locks[path]
        assert freeze_pins(got["freeze"]) == lock_pins(locks[path])
    assert lock_pins(locks[TOOLS])["idna"] != "99.0"
    on_host(cluster, f"test -f {ENGINE}/{SITE}/vllm/__init__.py")
    assert engine_pid(cluster) == pid
    assert answers
    assert set(answers) == {"READY"}


def test_an_index_that_is_down_leaves_the_running_release_serving(cluster: dict[str, Any]) -> None:
    run = converge(cluster)
    assert run.code == 0, run.log[-3000:]
    pid = engine_pid(cluster)
    index = cluster["services"]["index"]["url"]

    def upgrade(data: dict[str, Any]) -> None:
        data["engines"]["vllm"]["version"] = "0.34.1"

    write_faults(CLUSTER_DIR / "index", {"down": True})
    try:
        on_host(cluster, f"rm {ENGINE}/{SITE}/vllm/__init__.py")
        for edit in (None, upgrade):
            run = converge(cluster, edit)
            assert run.code != 0
            (line,) = host_lines(run, f"package index {index} does not answer")
            assert line.endswith(f"package index {index} does not answer")
            assert engine_pid(cluster) == pid
            assert chat(cluster) == "READY"
        # The damaged release is still the one in place; nothing half-made is left.
        assert on_host(cluster, "ls -A /opt/kimi/engines").split() == [ENGINE.rsplit("/", 1)[1]]
    finally:
        write_faults(CLUSTER_DIR / "index", None)
    run = converge(cluster)
    assert run.code == 0, run.log[-3000:]
    on_host(cluster, f"test -f {ENGINE}/{SITE}/vllm/__init__.py")
    assert engine_pid(cluster) == pid


def test_a_pinned_version_missing_from_the_index_is_one_line(cluster: dict[str, Any]) -> None:
    def missing_pin(data: dict[str, Any]) -> None:
        data["engines"]["vllm"]["packages"]["fastsafetensors"] = "0.5.1"

    pid = engine_pid(cluster)
    run = converge(cluster, missing_pin)
    assert run.code != 0
    index = cluster["services"]["index"]["url"]
    (line,) = host_lines(run, " is not on ")
    assert line.endswith(f"fastsafetensors==0.5.1 is not on {index} (available: 0.5.0)")
    assert "vllm-0.34.0+fastsafetensors-0.5.1" not in on_host(cluster, "ls -A /opt/kimi/engines").split()
    assert engine_pid(cluster) == pid
    assert chat(cluster) == "READY"


def test_what_is_installed_is_the_controllers_lock_even_when_the_index_changed(
    cluster: dict[str, Any], newer_idna: Path
) -> None:
    """The controller resolved the tools release's lock once; then the index publishes a newer
    dependency and the host loses the release: it gets the same lock again, not a new resolution."""
    run = converge(cluster)
    assert run.code == 0, run.log[-3000:]
    before = release(cluster, TOOLS)
    shutil.copy(newer_idna, CLUSTER_DIR / "index/files")
    on_host(cluster, f"rm -rf {TOOLS}")
    run = converge(cluster)
    assert run.code == 0, run.log[-3000:]
    got = release(cluster, TOOLS)
    assert got["lock"] == before["lock"]
    assert got["lock"].startswith("# platform: cp311-x86_64\n")
    # the idna of the lock resolved before, not the newer one the index offers now
    assert freeze_pins(got["freeze"])["idna"] == lock_pins(before["lock"])["idna"] != "99.0"
    assert (CLUSTER_DIR / "index/files" / newer_idna.name).is_file()
