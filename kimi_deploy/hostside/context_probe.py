"""One rung of the context ladder, probed: a prompt of unique words that fills the rung, a needle
deep in it, and an answer that must hold the needle's word (``hostside/ladder.py`` runs it).

The prompt is words drawn by a generator seeded with the run and the rung (so neither the prefix
cache nor an earlier rung's prompt helps), sized with the engine's own tokenizer (``POST
/tokenize``, vLLM's and SGLang's) to ``fill`` of the rung, with ``needle`` placed ``depth`` of the
way in and ``question`` last. An engine that truncates the prompt or drops its middle answers
without the needle, and the rung fails on it. While the answer streams, the engine's KV cache use
(its /metrics) and the accelerators' memory (NVML's ``nvidia-smi``, where there is one) are
sampled; their peaks are part of the result, with time to first token and decode speed. Every
answer is read within bounds (``hostside.boundary_http``: size, and time answer included; JSON
through ``hostside.boundary_json``): an engine port that answers anything else fails the rung
with one line naming what it answered.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any

from kimi_deploy.hostside.boundary_http import Reply, Unanswered, answering, ask
from kimi_deploy.hostside.boundary_json import loads
from kimi_deploy.hostside.unit_usage import memory_mib

# Filler: plain words, none a number (a needle's answer often is one).
WORDS = tuple(
    """
    river stone window garden morning yellow paper silver market engine valley letter bridge candle
    forest mirror orange pocket ladder harbor season winter summer autumn spring cotton button
    island meadow copper thunder basket pillow marble saddle violin lantern feather blanket kettle
    anchor tunnel castle cellar chimney compass crystal dolphin eagle falcon glacier hammer jacket
    jungle kitten lemon magnet needle noodle ocean parrot pepper planet puzzle rabbit rocket salmon
    shadow spider sponge tiger tomato turtle velvet wagon walnut whistle wizard zebra acorn bamboo
    beacon biscuit blossom canyon carpet cherry cobweb coral cradle desert domino engineer fabric
    fountain gravel helmet hollow insect jasmine kernel lagoon lizard maple meteor mitten nectar
    orchard paddle pebble pigeon quarry quilt ribbon saffron sandal sequin sheriff signal sketch
    sleeve socket sparrow spindle stable tablet thimble timber trumpet tulip umbrella vapor vessel
    village voyage walrus weasel willow
    """.split()  # noqa: SIM905 - a table of names, many to a line
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SAMPLE_S = 0.5
# What is read of the engine's answers at most: its /metrics page; its /tokenize answer (vLLM's
# lists the prompt's tokens: about 8 MB for a million); the probe's streamed answer, and each of
# its lines.
METRICS_BYTES = 4 << 20
TOKENIZE_BYTES = 64 << 20
STREAM_BYTES = 16 << 20
STREAM_LINE = 1 << 20


def kv_cache_usage(page: str, metrics: Sequence[str]) -> float | None:
    """The highest KV cache use among the samples of ``page`` (Prometheus' text format, one
    sample a line: ``NAME{LABELS} VALUE [TIMESTAMP]``) of ``metrics`` (the engine's gauges, the
    controller's ``Engine.kv_usage_metrics``), or None; a line that is
    not such a sample, or whose value is not a finite number, is left out. Linear in the page."""
    found: list[float] = []
    for line in page.split("\n"):
        name = next((n for n in metrics if line.startswith(n)), None)
        if name is None:
            continue
        rest = line[len(name) :]
        if rest.startswith("{"):
            # the last "}" of the line closes the labels: a label's value may hold one, a number not
            _, closed, rest = rest.rpartition("}")
            if not closed:
                continue
        if not rest.startswith(" "):
            continue  # another series whose name starts alike
        fields = rest.split()
        stamp = fields[1].removeprefix("-") if len(fields) == 2 else ""
        if len(fields) != 1 and not (stamp.isascii() and stamp.isdigit()):
            continue  # a value, and at most a timestamp (milliseconds)
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isfinite(value):
            found.append(value)
    return max(found) if found else None


def _error_text(reply: Reply) -> str:
    """The engine's own message in an error answer, one bounded line."""
    try:
        raw = reply.read()
        try:
            body = loads(raw, reply.where, max_bytes=len(raw))
        except ValueError:
            body = None
        if isinstance(body, dict):
            error = body.get("error")
            message = error.get("message") if isinstance(error, dict) else body.get("message")
            text = str(message or body.get("detail") or raw.decode("utf-8", "replace"))
        else:
            text = raw[:8192].decode("utf-8", "replace")
    except Unanswered:
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
        answered = ask(f"{base}/tokenize", key=key, body=body, timeout_s=300, max_bytes=TOKENIZE_BYTES)
        answer = loads(answered.body, answered.where, max_bytes=TOKENIZE_BYTES) if answered.status == 200 else None
    except (Unanswered, ValueError):
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

    def __init__(
        self, base: str, key: str | None, unit: str, *, kv_metrics: Sequence[str] = (), accelerators: bool = True
    ) -> None:
        super().__init__(daemon=True)
        self.base, self.key, self.unit = base, key, unit
        self.kv_metrics = tuple(kv_metrics)
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
            page = ask(f"{self.base}/metrics", key=self.key, timeout_s=5, max_bytes=METRICS_BYTES)
            if page.status == 200 and self.kv_metrics:
                self.kv = self._peak(self.kv, kv_cache_usage(page.body.decode("utf-8", "replace"), self.kv_metrics))
        except Unanswered:
            pass  # no sample this time
        if self.smi:
            query = [self.smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
            out = subprocess.run(query, capture_output=True, text=True, check=False, timeout=10).stdout
            used = [int(v) for v in out.split() if v.isdigit()]
            self.accelerator_mib = self._peak(self.accelerator_mib, sum(used) if used else None)
        self.host_mib = self._peak(self.host_mib, memory_mib(self.unit))

    def run(self) -> None:
        while not self.done.is_set():
            # a sample missed (nvidia-smi late, say) ends no sampling
            with contextlib.suppress(Exception):
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
    peaks = Peaks(base, key, req["unit"], kv_metrics=req.get("kv_metrics") or ())
    peaks.start()
    started = time.monotonic()
    first: float | None = None
    last = started
    answer: list[str] = []
    usage: dict[str, Any] = {}
    reason = None
    try:
        asked = answering(
            f"{base}/v1/chat/completions",
            key=key,
            body=body,
            timeout_s=float(probe["timeout_s"]),
            max_bytes=STREAM_BYTES,
        )
        with asked as r:
            if not 200 <= r.status < 300:
                size = prompt_tokens or "unknown"
                reason = f"the engine refused the probe's {size}-token prompt with status {r.status}: {_error_text(r)}"
            else:
                for raw in r.lines(STREAM_LINE):
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    chunk = loads(line[5:], r.where, max_bytes=STREAM_LINE)
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
    except (Unanswered, ValueError) as exc:  # no answer within bounds, or a line of it not JSON
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
