"""One rung of the context ladder, probed: a prompt of unique words that fills the rung, a needle
deep in it, and an answer that must hold the needle's word (``hostside/ladder.py`` runs it).

The prompt is words drawn by a generator seeded with the run and the rung (so neither the prefix
cache nor an earlier rung's prompt helps), sized with the engine's own tokenizer (``POST
/tokenize``, vLLM's and SGLang's) to ``fill`` of the rung, with ``needle`` placed ``depth`` of the
way in and ``question`` last. An engine that truncates the prompt or drops its middle answers
without the needle, and the rung fails on it. While the answer streams, the engine's KV cache use
(its /metrics) and the accelerators' memory (NVML's ``nvidia-smi``, where there is one) are
sampled; their peaks are part of the result, with time to first token and decode speed.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from hostside.unit_usage import memory_mib

# Filler: plain words, none a number (a needle's answer often is one).
WORDS = (
    "river", "stone", "window", "garden", "morning", "yellow", "paper", "silver", "market", "engine",
    "valley", "letter", "bridge", "candle", "forest", "mirror", "orange", "pocket", "ladder", "harbor",
    "season", "winter", "summer", "autumn", "spring", "cotton", "button", "island", "meadow", "copper",
    "thunder", "basket", "pillow", "marble", "saddle", "violin", "lantern", "feather", "blanket", "kettle",
    "anchor", "tunnel", "castle", "cellar", "chimney", "compass", "crystal", "dolphin", "eagle", "falcon",
    "glacier", "hammer", "jacket", "jungle", "kitten", "lemon", "magnet", "needle", "noodle", "ocean",
    "parrot", "pepper", "planet", "puzzle", "rabbit", "rocket", "salmon", "shadow", "spider", "sponge",
    "tiger", "tomato", "turtle", "velvet", "wagon", "walnut", "whistle", "wizard", "zebra", "acorn", "bamboo",
    "beacon", "biscuit", "blossom", "canyon", "carpet", "cherry", "cobweb", "coral", "cradle", "desert",
    "domino", "engineer", "fabric", "fountain", "gravel", "helmet", "hollow", "insect", "jasmine", "kernel",
    "lagoon", "lizard", "maple", "meteor", "mitten", "nectar", "orchard", "paddle", "pebble", "pigeon",
    "quarry", "quilt", "ribbon", "saffron", "sandal", "sequin", "sheriff", "signal", "sketch", "sleeve",
    "socket", "sparrow", "spindle", "stable", "tablet", "thimble", "timber", "trumpet", "tulip", "umbrella",
    "vapor", "vessel", "village", "voyage", "walrus", "weasel", "willow",
)  # fmt: skip
_METRICS = re.compile(
    r"^(vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc|sglang:token_usage)(?:\{[^}]*\})? (\S+)$", re.M
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SAMPLE_S = 0.5


def _request(url: str, key: str | None, body: Any = None) -> urllib.request.Request:
    data = json.dumps(body).encode() if body is not None else None
    # The URL is the deploy's own http://ADDRESS:PORT of the engine, never user input.
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")  # noqa: S310
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    return request


def _error_text(exc: urllib.error.HTTPError) -> str:
    """The engine's own message in an error answer, one bounded line."""
    try:
        raw = exc.read(8192).decode("utf-8", "replace")
        body = json.loads(raw)
        message = (
            (body.get("error") or {}).get("message") if isinstance(body.get("error"), dict) else body.get("message")
        )
        text = str(message or body.get("detail") or raw)
    except (OSError, ValueError, AttributeError):
        text = ""
    return _CONTROL.sub(" ", text)[:300]


def text(probe: dict[str, Any], seed: str, words: int) -> str:
    """``words`` filler words in sentences of twelve, the needle ``depth`` of the way in, the question last."""
    avoid = {w.strip(".,!?").lower() for w in f"{probe['needle']} {probe['expect']}".split()}
    pool = [w for w in WORDS if w not in avoid]
    rng = random.Random(seed)  # noqa: S311 - filler, not a secret
    drawn = [rng.choice(pool) for _ in range(max(words, 1))]
    sentences = [" ".join(drawn[i : i + 12]) + " ." for i in range(0, len(drawn), 12)]
    at = int(len(sentences) * float(probe["depth"]))
    return " ".join([*sentences[:at], str(probe["needle"]), *sentences[at:]]) + "\n\n" + str(probe["question"])


def count(base: str, key: str | None, served: str, content: str) -> int | None:
    """The prompt tokens of a chat request of ``content`` as the engine counts them; None: it has no /tokenize."""
    body = {"model": served, "messages": [{"role": "user", "content": content}], "add_generation_prompt": True}
    try:
        with urllib.request.urlopen(_request(f"{base}/tokenize", key, body), timeout=300) as response:  # noqa: S310
            answer = json.loads(response.read())
    except (OSError, ValueError):
        return None
    n = answer.get("count") if isinstance(answer, dict) else None
    return n if isinstance(n, int) else None


def sized(req: dict[str, Any], key: str | None, rung: int, seed: str) -> tuple[str, int | None]:
    """The probe's prompt at ``fill`` of ``rung`` tokens (never more than the rung less the answer's budget)."""
    probe, base, served = req["probe"], req["smoke"]["url"].rstrip("/"), req["smoke"]["served_name"]
    target = min(int(rung * float(probe["fill"])), rung - int(probe["max_tokens"]) - 1)
    words = target
    content = text(probe, seed, words)
    n = count(base, key, served, content)
    if n is None:
        # No tokenizer to ask: English runs about 1.3 tokens a word.
        return text(probe, seed, int(target / 1.3)), None
    for _ in range(6):
        if 0.97 * target <= n <= target:
            break
        words = max(1, int(words * target / max(n, 1)) - (1 if n > target else 0))
        content = text(probe, seed, words)
        n = count(base, key, served, content)
        if n is None:
            return content, None
    return content, n


class Peaks(threading.Thread):
    """Samples the engine's KV cache use, the accelerators' memory and the unit's memory until stopped."""

    def __init__(self, base: str, key: str | None, unit: str, *, accelerators: bool = True) -> None:
        super().__init__(daemon=True)
        self.base, self.key, self.unit = base, key, unit
        self.kv: float | None = None
        self.accelerator_mib: int | None = None
        self.host_mib: int | None = None
        self.done = threading.Event()
        # NVML's tool, where the engine runs on NVIDIA GPUs (not on a CPU topology's host)
        self.smi = shutil.which("nvidia-smi") if accelerators else None

    def _peak(self, old: Any, new: Any) -> Any:
        return new if old is None or (new is not None and new > old) else old

    def sample(self) -> None:
        try:
            with urllib.request.urlopen(_request(f"{self.base}/metrics", self.key), timeout=5) as r:  # noqa: S310
                found = [float(v) for _, v in _METRICS.findall(r.read(4 << 20).decode("utf-8", "replace"))]
            self.kv = self._peak(self.kv, max(found) if found else None)
        except (OSError, ValueError):
            pass
        if self.smi:
            query = [self.smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
            out = subprocess.run(query, capture_output=True, text=True, check=False, timeout=10).stdout
            used = [int(v) for v in out.split() if v.isdigit()]
            self.accelerator_mib = self._peak(self.accelerator_mib, sum(used) if used else None)
        self.host_mib = self._peak(self.host_mib, memory_mib(self.unit))

    def run(self) -> None:
        while not self.done.is_set():
            self.sample()
            self.done.wait(SAMPLE_S)


def measure(req: dict[str, Any], key: str | None, rung: int, seed: str) -> dict[str, Any]:
    """Probe ``rung`` of ``req`` (``hostside/ladder.py``'s request): the result, passed or not, with its reason."""
    probe, base, served = req["probe"], req["smoke"]["url"].rstrip("/"), req["smoke"]["served_name"]
    content, prompt_tokens = sized(req, key, rung, seed)
    body = {
        "model": served,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": int(probe["max_tokens"]),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    peaks = Peaks(base, key, req["unit"])
    peaks.start()
    started = time.monotonic()
    first: float | None = None
    last = started
    answer: list[str] = []
    usage: dict[str, Any] = {}
    reason = None
    try:
        asked = _request(f"{base}/v1/chat/completions", key, body)
        with urllib.request.urlopen(asked, timeout=float(probe["timeout_s"])) as r:  # noqa: S310
            for raw in r:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if not isinstance(chunk, dict):
                    continue
                if chunk.get("error"):
                    reason = f"the answer broke off: {_CONTROL.sub(' ', str(chunk['error']))[:300]}"
                    break
                usage = chunk["usage"] if isinstance(chunk.get("usage"), dict) else usage
                choices = chunk.get("choices")
                for choice in choices if isinstance(choices, list) else []:
                    delta = choice.get("delta") if isinstance(choice, dict) else None
                    if not isinstance(delta, dict):
                        continue
                    piece = str(delta.get("content") or "") + str(
                        delta.get("reasoning") or delta.get("reasoning_content") or ""
                    )
                    if piece:
                        first = first or time.monotonic()
                        last = time.monotonic()
                        answer.append(str(delta.get("content") or ""))
                if time.monotonic() - started > float(probe["timeout_s"]):
                    reason = f"no whole answer within {probe['timeout_s']} s"
                    break
    except urllib.error.HTTPError as exc:
        size = prompt_tokens or "unknown"
        reason = f"the engine refused the probe's {size}-token prompt with status {exc.code}: {_error_text(exc)}"
    except (OSError, ValueError) as exc:
        reason = (
            f"the probe's request failed after {time.monotonic() - started:.0f} s: {_CONTROL.sub(' ', str(exc))[:200]}"
        )
    finally:
        peaks.done.set()
        peaks.join(timeout=15)
    said = "".join(answer)
    completion = usage.get("completion_tokens") if isinstance(usage.get("completion_tokens"), int) else None
    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else prompt_tokens
    if reason is None and probe["expect"] not in said:
        reason = (
            f"the answer to a {prompt_tokens or 'unknown'}-token prompt lacks the needle's {probe['expect']!r} "
            f"(answer {_CONTROL.sub(' ', said)[:80]!r}): the engine did not read the whole prompt"
        )
    decode = None
    if first is not None and completion and completion > 1 and last > first:
        decode = round((completion - 1) / (last - first), 2)
    return {
        "rung": rung,
        "passed": reason is None,
        "reason": reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "ttft_s": round(first - started, 3) if first is not None else None,
        "decode_tok_s": decode,
        "kv_cache_usage": peaks.kv,
        "accelerator_memory_mib": peaks.accelerator_mib,
        "unit_memory_mib": peaks.host_mib,
    }
