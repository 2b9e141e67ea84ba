"""The serving benchmark's hosted API key never reaches a process of the engine user
(hostside/bench_load.py): the engine runs model code as that user, and /proc shows it the argv
and the environment of every process of its own.

The load generator (``vllm bench serve``) is stood in for by a fake that speaks its protocol with
bench_load (``loaded``, ``ready``, ``go``, ``done``) and saves each level's result where vLLM
would; the processes bench_load starts are recorded as the kernel would see them: their argv,
their environment and the user they run as."""

from __future__ import annotations

import json
import os
import pwd
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.hostside import bench_load

HOSTED_KEY = "sk-hosted-7f3c9e21d0b84a56"
LOCAL_KEY = "sk-kimi-d41c9a0e77b2"
ENGINE_USER = "nobody"


class _Lines:
    """The fake generator's standard output: lines it says as the words come."""

    def __init__(self, said: queue.Queue[str | None]) -> None:
        self.said = said

    def __iter__(self) -> Iterator[str]:
        while (line := self.said.get(timeout=10)) is not None:
            yield line


class _Words:
    def __init__(self, heard: queue.Queue[str | None]) -> None:
        self.heard = heard

    def write(self, text: str) -> int:
        for word in text.splitlines():
            self.heard.put(word)
        return len(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.heard.put(None)


class FakeGenerator:
    """``vllm bench serve`` as BENCH_SERVE runs it, the key it would send taken where BENCH_SERVE
    takes it: the environment variable its plan names, or the credential systemd gives it."""

    def __init__(self, argv: list[str], env: dict[str, str] | None, user: int | None, credentials: Path) -> None:
        self.argv, self.env, self.user = argv, env or {}, user
        self.sent_keys: list[str | None] = []
        said: queue.Queue[str | None] = queue.Queue()
        heard: queue.Queue[str | None] = queue.Queue()
        self.stdout, self.stdin = _Lines(said), _Words(heard)
        self.returncode: int | None = None
        self.others_running = False
        # what systemd would put in the service's credentials folder
        loaded = [w.split("=", 2)[2] for w in argv if w.startswith("--property=LoadCredential=")]
        given = {}
        for item in loaded:
            name, path = item.split(":", 1)
            given[name] = Path(path).read_text(encoding="utf-8")
        self.thread = threading.Thread(target=self._run, args=(said, heard, given, credentials), daemon=True)
        self.thread.start()

    def _run(
        self, said: queue.Queue[str | None], heard: queue.Queue[str | None], given: dict[str, str], credentials: Path
    ) -> None:
        with open(self.argv[-1], encoding="utf-8") as f:
            plan = json.load(f)
        said.put("kimi-bench: loaded 1.500\n")
        for i, run in enumerate(plan):
            said.put(f"kimi-bench: ready {i}\n")
            word = heard.get(timeout=10)
            if word == "skip":
                continue
            if word != "go":
                break
            key = self.env.get(run.get("key_env") or "")
            if run.get("key_credential"):
                key = given[run["key_credential"]].strip()
            self.sent_keys.append(key)
            argv = run["argv"]
            n = int(argv[argv.index("--num-prompts") + 1])
            results = argv[argv.index("--result-dir") + 1]
            os.makedirs(results, exist_ok=True)
            saved = {
                "generated_texts": [f"answer {j}" for j in range(n)],
                "errors": [""] * n,
                "ttfts": [0.1] * n,
                "latencies": [0.5] * n,
                "output_lens": [8] * n,
                "input_lens": [12] * n,
                "completed": n,
                "duration": 1.0,
                "output_throughput": 16.0,
            }
            Path(results, argv[argv.index("--result-filename") + 1]).write_text(json.dumps(saved), encoding="utf-8")
            said.put(f"kimi-bench: done {i} 0.250\n")
        said.put(None)
        self.returncode = 0

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.thread.join(timeout)
        return self.returncode or 0

    def kill(self) -> None:
        pass


@pytest.fixture
def started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[FakeGenerator]:
    procs: list[FakeGenerator] = []

    def popen(
        argv: list[str], *, env: dict[str, str] | None = None, user: int | None = None, **_: Any
    ) -> FakeGenerator:
        proc = FakeGenerator(list(argv), env, user, tmp_path / "credentials")
        proc.others_running = any(p.returncode is None for p in procs)
        procs.append(proc)
        return proc

    monkeypatch.setattr("kimi_deploy.hostside.bench_load.subprocess.Popen", popen)
    # the host's folders, here under the test's own
    for name in ("state", "run"):
        (tmp_path / name).mkdir()
    monkeypatch.setattr(bench_load, "HOSTED_INPUTS", str(tmp_path / "state"), raising=False)
    monkeypatch.setattr(bench_load, "RUNTIME_ROOT", str(tmp_path / "run"), raising=False)
    return procs


def _request(tmp_path: Path) -> dict[str, Any]:
    hosted = tmp_path / "bench-hosted.key"
    hosted.write_text(HOSTED_KEY, encoding="utf-8")
    hosted.chmod(0o600)
    local = tmp_path / "engine.env"
    local.write_text(f"VLLM_API_KEY={LOCAL_KEY}\n", encoding="utf-8")
    return {
        "run": "20260101T000000Z-0a1b2c3d",
        "python": "/opt/kimi/engines/vllm/bin/python",
        "tokenizer": "/srv/models/demo",
        "user": ENGINE_USER,
        "timeout_s": 10,
        "tasks": [{"id": "t0", "prompt": "Say hi.", "max_tokens": 8, "tools": []}],
        "targets": [
            {
                "name": "local",
                "url": "http://127.0.0.1:8000",
                "model": "demo",
                "key_file": str(local),
                "key_var": "VLLM_API_KEY",
            },
            {
                "name": "hosted",
                "url": "https://api.example.com",
                "model": "kimi-k3",
                "key_file": str(hosted),
                "key_var": None,
            },
        ],
        "levels": [{"concurrency": 1, "rows": [0, 0]}, {"concurrency": 4, "rows": [0] * 8}],
    }


def test_no_process_of_the_engine_user_holds_the_hosted_key(tmp_path: Path, started: list[FakeGenerator]) -> None:
    result = bench_load.run(_request(tmp_path))
    engine = pwd.getpwnam(ENGINE_USER).pw_uid
    assert started
    for proc in started:
        if proc.user == engine:
            assert HOSTED_KEY not in json.dumps(proc.env), "the engine user's generator holds the hosted key"
        # never in argv, whoever runs it: argv is every local user's to read
        assert HOSTED_KEY not in " ".join(proc.argv)
    # the hosted API's levels ran, with its key, in a process of a user of their own
    hosted = [p for p in started if HOSTED_KEY in p.sent_keys]
    assert len(hosted) == 1
    (proc,) = hosted
    assert proc.user != engine
    assert proc.argv[0] == "systemd-run"
    assert "--property=DynamicUser=yes" in proc.argv
    assert HOSTED_KEY not in json.dumps(proc.env)
    # and the endpoint's, with the endpoint's key, as the engine user
    (local,) = [p for p in started if LOCAL_KEY in p.sent_keys]
    assert local.user == engine
    # the report is the same: every level of both targets, each request recorded
    assert {
        name: [(lv["concurrency"], lv["error"], len(lv["requests"])) for lv in levels]
        for name, levels in result["targets"].items()
    } == {
        "local": [(1, None, 2), (4, None, 8)],
        "hosted": [(1, None, 2), (4, None, 8)],
    }
    assert result["generator_load_cpu_s"] == 1.5
    # nothing of the run is left behind
    assert list((tmp_path / "state").iterdir()) == []


def test_the_hosted_generator_is_not_started_before_the_endpoints_levels_end(
    tmp_path: Path, started: list[FakeGenerator]
) -> None:
    bench_load.run(_request(tmp_path))
    assert [(p.argv[0] == "systemd-run", p.others_running) for p in started] == [(False, False), (True, False)]
