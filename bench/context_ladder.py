"""The context ladder's rungs on the real vLLM: time per rung, and how time to first token grows with the rung.

    python bench/context_ladder.py [--venv DIR] [--rungs 32768,65536,131072] [--refused 262144] [--fill 0.2]

Serves the local cluster's needle-reading tiny Llama (``localcluster.needle_llama``, written out at its
revision) with vLLM's CPU build on this machine, on 127.0.0.1 only, as the deploy launches the demo's CPU
topology (``recipes/demo.yaml``: release, KV cache of 1 GiB, memory share, dtype, eager), once per rung with
``--max-model-len`` at the rung, and probes each rung with the deploy's own probe
(``hostside/context_probe.py``: a prompt of unique words filling ``--fill`` of the rung, sized with the
engine's ``/tokenize``, a needle a quarter of the way in, the answer streamed). Then it starts the engine at
``--refused``, a rung its KV cache cannot hold, and prints the engine's own reason and how long it took to
give it. Prints per rung the seconds to ready, the prompt's tokens, time to first token, decode tokens/s,
the KV cache use the engine reported at its peak, the probe's own time and the rung's whole time; then the
ratios of TTFT and of prompt tokens to the first rung's, measured in the same run.

``--fill`` defaults to 0.2 (the deploy's default is 0.9): a prefill of 118K tokens takes minutes on two
cores. ``--venv`` is a venv with the release; without it one is made once under /var/cache/kimi-bench.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from client_load import free_port
from vllm_restart import _get, _stop, ensure_venv

from kimi_deploy.hostside import context_probe
from kimi_deploy.hostside.smoke import _first_exception
from kimi_deploy.recipe_file import load_recipe
from localcluster import hub_content, needle_llama
from localcluster.hub_repo import load_info, materialize

ROOT = Path(__file__).resolve().parent.parent


RECIPE = "recipes/demo.yaml"
TOPOLOGY = "demo-vllm"
PROBE = {
    "needle": "The word is test .",
    "question": "what is the word ?",
    "expect": "test",
    "depth": 0.25,
    "max_tokens": 8,
    "timeout_s": 1800,
}


def _launch(argv: list[str], env: dict[str, str], log: Path, deadline_s: float) -> tuple[Any, str, float]:
    """Start the server; (process, base URL, seconds to /health) or (process, reason, seconds) when it exits."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    out = log.open("wb")
    launched = time.perf_counter()
    proc = subprocess.Popen(
        [*argv, "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    while True:
        if proc.poll() is not None:
            cause = _first_exception(log.read_text(errors="replace").splitlines(), "none")
            return proc, f"exited with {proc.returncode}: {cause}", time.perf_counter() - launched
        if time.perf_counter() - launched > deadline_s:
            return proc, f"not ready within {deadline_s:.0f} s", time.perf_counter() - launched
        with contextlib.suppress(OSError):
            if _get(f"{base}/health", timeout=2) == 200:
                return proc, base, time.perf_counter() - launched
        time.sleep(0.25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, help="a venv with the recipe's vLLM CPU release")
    parser.add_argument("--rungs", default="32768,65536,131072", help="rungs the KV cache holds, rising")
    parser.add_argument("--refused", type=int, default=262144, help="a rung the KV cache cannot hold (0: none)")
    parser.add_argument("--fill", type=float, default=0.2, help="the share of each rung the prompt fills")
    parser.add_argument("--deadline", type=float, default=600, help="seconds each start may take to be ready")
    args = parser.parse_args()
    recipe = load_recipe(ROOT / RECIPE)
    release = recipe.engines["vllm"]
    topo = recipe.topologies[TOPOLOGY]
    assert topo.cpu is not None, f"{RECIPE}: {TOPOLOGY} is not a CPU topology"
    venv = ensure_venv(release, args.venv)
    run_dir = Path(tempfile.mkdtemp(prefix="kimi-context-ladder-", dir="/var/tmp"))
    hub_content.build(run_dir / "hub")
    info = load_info(run_dir / "hub", needle_llama.REPO_ID)
    revision = info.refs["main"]
    model = run_dir / "model"
    materialize(run_dir / "hub", needle_llama.REPO_ID, revision, model)
    base_argv = [
        str(venv / "bin/python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        recipe.model.served_name,
        "--host",
        "127.0.0.1",
        "--dtype",
        topo.cpu.dtype,
        "--gpu-memory-utilization",
        str(topo.cpu.memory_fraction),
        "--enforce-eager",
    ]
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": str(topo.cpu.kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": topo.cpu.threads_bind,
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",  # no usage report to vLLM's servers: loopback only
        "DO_NOT_TRACK": "1",
    }
    rungs = [int(r) for r in args.rungs.split(",")]
    print(
        f"{release.distribution('vllm')} {release.version}, {needle_llama.REPO_ID}@{revision[:12]}, KV cache "
        f"{topo.cpu.kv_cache_gib} GiB, fill {args.fill}, {os.cpu_count()} CPUs; logs in {run_dir}"
    )
    print(
        f"{'rung':>8} {'ready s':>8} {'prompt':>8} {'TTFT s':>8} {'tok/s':>7} {'KV peak':>8} {'probe s':>8} "
        f"{'rung s':>8}  answer"
    )
    results: list[dict[str, Any]] = []
    for rung in rungs:
        began = time.perf_counter()
        proc, base, ready = _launch(
            [*base_argv, "--max-model-len", str(rung)], env, run_dir / f"{rung}.log", args.deadline
        )
        try:
            if not base.startswith("http"):
                sys.exit(f"rung {rung}: the engine {base}")
            request = {
                "unit": "none",
                "smoke": {"url": base, "served_name": recipe.model.served_name},
                "probe": {**PROBE, "fill": args.fill},
            }
            probed = time.perf_counter()
            result = context_probe.measure(request, None, rung, f"bench/{rung}")
            result |= {"ready_s": ready, "probe_s": time.perf_counter() - probed}
        finally:
            _stop(proc)
        result["rung_s"] = time.perf_counter() - began
        results.append(result)
        kv = result["kv_cache_usage"]
        print(
            f"{rung:>8} {ready:>8.1f} {result['prompt_tokens']!s:>8} {result['ttft_s']!s:>8} "
            f"{result['decode_tok_s']!s:>7} {f'{kv:.1%}' if kv is not None else '-':>8} {result['probe_s']:>8.1f} "
            f"{result['rung_s']:>8.1f}  {'passed' if result['passed'] else result['reason']}"
        )
    first = results[0]
    print("ratios to the first rung (TTFT; prompt tokens):")
    for r in results[1:]:
        if r["ttft_s"] and first["ttft_s"] and r["prompt_tokens"] and first["prompt_tokens"]:
            print(
                f"  {r['rung']:>8}/{first['rung']}: TTFT {r['ttft_s'] / first['ttft_s']:6.1f}x  "
                f"prompt {r['prompt_tokens'] / first['prompt_tokens']:5.1f}x"
            )
    if args.refused:
        proc, reason, took = _launch(
            [*base_argv, "--max-model-len", str(args.refused)], env, run_dir / f"{args.refused}.log", args.deadline
        )
        _stop(proc)
        print(f"rung {args.refused}: after {took:.1f} s the engine {reason}")


if __name__ == "__main__":
    main()
