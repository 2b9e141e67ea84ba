"""The watchdog of a serving host: between converges, it checks what serves and walks the recipe's
recovery ladder. One long-lived process (``kimi-watchdog.service``, root without capabilities:
it reads the engines' key files, asks systemd to restart or stop them, and writes its state).

Usage: ``watchdog.py --config FILE`` (JSON, written by the converge: ``kimi_deploy.render.watchdog_units``):
{"interval_s", "timeout_s" (of a health check), "canary_interval_s", "canary_timeout_s",
"restart_after" (failed checks in a row before a restart), "restarts"
(restarts that did not bring the unit back before it is drained), "grace_s" (how long a unit
started by anyone may take to answer before its checks count), "state" (JSON file),
"textfile" (Prometheus textfile-collector file, or null), "units": [{"unit", "url" (null: a
worker without an API: systemd's state only), "served_name", "prompt", "expect", "max_tokens",
"key_file", "key_var", "reads_weights"}], "accelerators" ({"vendor": "nvidia", "count"}, or null), "scrub" (the
scrub's result file beside the weights, or null), "kmsg" (the kernel's log, ``/dev/kmsg``, or
null), "xid_ignore" (Xid codes that say nothing of a GPU's health)}.

Each round, for each unit: systemd's state (one ``systemctl show`` for all), ``GET /health``, and,
every ``canary_interval_s`` while it passes and every round while it fails, a canary: the recipe's
smoke prompt as a chat completion whose answer must be the expected text (a 200 with wrong or
empty content fails it: a wrong answer), sent in a thread of its own and failed when not back within
``canary_timeout_s``; for the host: the accelerators (the count the plan expects, uncorrected ECC
errors, pages pending retirement, whether the GPUs of an NVLink fabric have joined it:
``nvidia-smi``, the probe's fallback; the Xid events the driver logged in the kernel's log), and
the scrub's last result. A unit that fails ``restart_after`` checks
in a row is restarted; one that fails again after ``restarts`` restarts, or whose checks in a row
were wrong answers (restarted, it would rejoin the router on its ``/health`` before a canary could
judge it), or whose host lost an accelerator or holds weights the scrub could not repair, or that
was running when the driver reported a GPU fault (an Xid not in ``xid_ignore``: an event, which
holds for the units that saw it: one started again after it, by an operator or a converge, is judged
afresh), is drained: stopped, so that the router's health checks take it out of rotation and the
gateway falls back when no instance is left. A unit that answers again is serving again. A unit
stopped on purpose (``systemctl stop``: inactive, result success) is left alone; one that systemd is
starting, or started less than ``grace_s`` ago and not healthy yet, is given time (a wrong answer
from a healthy one counts at once). Every change of state is one journal line; the state file and
the metrics file are rewritten whole every round.

Whatever answers on a unit's port is read within bounds (``hostside.boundary_http``: size, and
time answer included; JSON through ``hostside.boundary_json``): an answer that is not HTTP, too
long, too deep or too slow fails that check with one line naming it. An error of the watchdog's
own in one check (a unit's, the host's, the canary's thread) is one journal line, and the round
goes on with the others: the process never ends of one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from kimi_deploy.hostside import xid as xids
from kimi_deploy.hostside.boundary_http import Unanswered, ask
from kimi_deploy.hostside.boundary_json import loads
from kimi_deploy.hostside.boundary_text import error_line
from kimi_deploy.hostside.kmsg import KERNEL, Kmsg
from kimi_deploy.hostside.sd_notify import notify
from kimi_deploy.hostside.smoke import final, read_key
from kimi_deploy.hostside.whole_file import write_whole

# Journal lines, kept in the state file for the next converge's report.
ACTIONS_KEPT = 50
# GPU faults the kernel reported (Xid events), kept in memory and in the state file.
XIDS_KEPT = 20
# The most of an answer a line quotes.
QUOTE = 60
# The most of an engine's answer read: its /health answers nothing, a canary's chat completion a few KiB.
HEALTH_BYTES = 64 << 10
CANARY_BYTES = 1 << 20
SHOW = ("Id", "ActiveState", "SubState", "Result", "NRestarts", "ExecMainStartTimestampMonotonic")


def log(line: str) -> None:
    print(line, flush=True)


def quote(text: str) -> str:
    flat = " ".join(str(text).split())
    return repr(flat if len(flat) <= QUOTE else flat[:QUOTE] + "...")


def unexpected(exc: BaseException) -> str:
    """An error of the watchdog's own, in a few words of ASCII on one line."""
    return error_line(exc, QUOTE * 2)


def systemd(units: list[str]) -> dict[str, dict[str, str]]:
    """systemd's view of ``units``: one ``systemctl show`` for all of them."""
    argv = ["systemctl", "show", "-p", ",".join(SHOW), *(f"{u}.service" for u in units)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False).stdout
    found: dict[str, dict[str, str]] = {}
    for block in out.split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if fields.get("Id", "").endswith(".service"):
            found[fields["Id"].removesuffix(".service")] = fields
    return found


def health(unit: dict[str, Any], timeout: float) -> str | None:
    """Why ``GET /health`` failed (one line: whatever answers on the unit's port may answer
    anything), or None."""
    try:
        answer = ask(f"{unit['url']}/health", timeout_s=timeout, max_bytes=HEALTH_BYTES)
    except Unanswered as exc:
        return f"health: {exc}"
    return None if answer.status == 200 else f"health: HTTP {answer.status}"


# A canary answered, and not with the expected text: an engine serving wrong answers, which its
# /health does not show; restarted, it would rejoin the router on that /health before a canary
# could judge it, so the ladder drains it at once.
WRONG = "canary: wrong answer:"


def canary(unit: dict[str, Any], timeout: float) -> tuple[str | None, float]:  # noqa: PLR0911 (one per way it fails)
    """Why the canary failed (None when its answer holds the expected text), and its seconds."""
    body = {
        "model": unit["served_name"],
        "messages": [{"role": "user", "content": unit["prompt"]}],
        "max_tokens": unit["max_tokens"],
        "temperature": 0,
    }
    start = time.monotonic()
    url = f"{unit['url']}/v1/chat/completions"
    try:
        answer = ask(url, key=read_key(unit), body=body, timeout_s=timeout, max_bytes=CANARY_BYTES)
    except Unanswered as exc:
        return f"canary: {exc}", time.monotonic() - start
    took = time.monotonic() - start
    if answer.status != 200:
        return f"canary: HTTP {answer.status}", took
    try:
        doc = loads(answer.body, answer.where)
    except ValueError as exc:  # not JSON, or JSON too deep for the decoder
        return f"{WRONG} not a chat completion ({exc})", took
    try:
        content = doc["choices"][0]["message"].get("content") or ""
    except (KeyError, IndexError, TypeError, AttributeError):
        return f"{WRONG} not a chat completion ({quote(answer.body.decode(errors='replace'))})", took
    if not str(content).strip():
        return f"{WRONG} empty", took
    if final(str(content)) != unit["expect"]:
        return f"{WRONG} {quote(content)}, not {quote(unit['expect'])}", took
    return None, took


class Canary:
    """One unit's canary, sent in a thread of its own so that a slow answer (a loaded engine, a
    long reasoning budget) holds no other check: every ``interval_s`` while it passes, every
    round while it fails; an answer not back within ``timeout_s`` is a failure of its own."""

    def __init__(self, unit: dict[str, Any], interval_s: float, timeout_s: float) -> None:
        self.unit, self.interval_s, self.timeout_s = unit, interval_s, timeout_s
        self.lock = threading.Lock()
        self.started: float | None = None  # monotonic, while one is out
        self.last: float = -1e18  # monotonic start of the last one sent
        self.result: tuple[str | None, float] | None = None  # a result not yet read
        self.failing = False
        self.took: float | None = None

    def _send(self, started: float) -> None:
        try:
            why, took = canary(self.unit, self.timeout_s + 5)
        except Exception as exc:  # noqa: BLE001 - the thread's outcome comes back, whatever it met
            why, took = f"canary: failed unexpectedly: {unexpected(exc)}", time.monotonic() - started
        with self.lock:
            if self.started == started:  # not given up on
                self.result, self.started = (why, took), None

    def news(self, due_anyway: bool) -> str | bool | None:
        """The outcome of a canary finished since the last call (its failure, or None when it
        passed), or False when there is none (one is out, or none was due)."""
        now = time.monotonic()
        with self.lock:
            if self.result is not None:
                (why, took), self.result = self.result, None
                self.failing, self.took = why is not None, took
                return why
            if self.started is not None:
                if now - self.started <= self.timeout_s:
                    return False
                self.started, self.failing = None, True  # given up on: its thread ends at its own timeout
                return f"canary: no answer in {self.timeout_s:g} s"
            if self.failing or due_anyway or now - self.last >= self.interval_s:
                self.started = self.last = now
                threading.Thread(target=self._send, args=(now,), daemon=True).start()
            return False


def _number(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


# What the watchdog asks nvidia-smi of each GPU, from the most to the least a driver may answer:
# a driver that refuses one of the fields (nvidia-smi exits with NVML_ERROR_INVALID_ARGUMENT, 2)
# is asked the next list. fabric.state and fabric.status are the NVLink fabric's registration
# ("Completed" and "Success" once the GPU has joined its domain; "N/A" on a GPU without one:
# nvidia-smi --help-query-gpu and all-field captures of drivers 590 to 610, in the parsers' fixtures).
FIELDS = "index,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending"
FIELD_LISTS = (f"{FIELDS},fabric.state,fabric.status", FIELDS, "index,pci.bus_id")
EXIT_INVALID_ARGUMENT = 2
# fabric.state values of a GPU that has no NVLink fabric to join
NO_FABRIC = ("", "N/A", "[N/A]", "[Not Supported]")


def _smi(fields: str, timeout: float) -> subprocess.CompletedProcess[str]:
    argv = ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def accelerators(want: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The host's GPUs as ``nvidia-smi`` reports them: {"count", "ecc" (uncorrected, volatile),
    "pending" (GPUs with pages pending retirement or rows pending remapping), "fault" (why the
    host cannot serve as planned, or None)}."""
    try:
        for fields in FIELD_LISTS:
            # an older driver, knowing no such field: fewer facts (the GPUs counted alone at last)
            run = _smi(fields, timeout)
            if run.returncode != EXIT_INVALID_ARGUMENT:
                break
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"count": 0, "ecc": 0, "pending": 0, "fault": f"nvidia-smi: {str(exc)[:120]}"}
    rows = [[c.strip() for c in line.split(",")] + [""] * 5 for line in run.stdout.splitlines() if "," in line]
    gpus = [r for r in rows if _number(r[0]) is not None]
    # a GPU of an NVLink fabric (NVSwitch, Grace Blackwell) not joined to it, or refused by it
    unjoined = [
        f"GPU {r[1]}: fabric {r[5]}" + (f", {r[6]}" if r[6] not in NO_FABRIC else "")
        for r in gpus
        if r[5] not in NO_FABRIC and (r[5] != "Completed" or r[6] != "Success")
    ]
    ecc = sum(_number(r[2]) or 0 for r in gpus)
    # pages pending retirement (before Ampere) or rows pending remapping (since): a GPU reset applies
    # them; counted, no fault ("[N/A]" where the GPU has the other mechanism)
    pending = sum(1 for r in gpus if "yes" in (r[3].lower(), r[4].lower()))
    fault = None
    if len(gpus) < want["count"]:
        said = next((line.strip() for line in run.stdout.splitlines() if line.strip() and "," not in line), "")
        fault = f"{len(gpus)} of {want['count']} GPUs answer nvidia-smi" + (f" ({said[:120]})" if said else "")
    elif ecc:
        fault = f"{ecc} uncorrected ECC errors"
    elif unjoined:
        fault = "; ".join(unjoined[:2]) + (f" (and {len(unjoined) - 2} more)" if len(unjoined) > 2 else "")
    return {"count": len(gpus), "ecc": ecc, "pending": pending, "fault": fault}


def scrub_result(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


class Ladder:
    """One unit's place on the recovery ladder, fed one check's outcome per round."""

    def __init__(self, unit: str, config: dict[str, Any], kept: dict[str, Any] | None = None) -> None:
        kept = kept or {}
        self.unit = unit
        self.restart_after = int(config["restart_after"])
        self.restarts_allowed = int(config["restarts"])
        self.state: str = kept.get("state", "serving")
        self.since: float = kept.get("since", time.time())
        self.failures: int = 0
        self.restarts: int = kept.get("restarts", 0)
        self.why: str | None = kept.get("why")
        self.systemd_restarts: int | None = kept.get("systemd_restarts")

    def record(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "since": self.since,
            "failures": self.failures,
            "restarts": self.restarts,
            "why": self.why,
            "systemd_restarts": self.systemd_restarts,
        }

    def _to(self, state: str, now: float) -> None:
        if state != self.state:
            self.state, self.since = state, now

    def step(self, now: float, why: str | None, hold: str | None, host_fault: str | None) -> str | None:
        """The action this round's outcome calls for: "restart", "stop" or None. ``why``: the
        failed check (None: it serves); ``hold``: why its checks do not count yet (starting,
        stopped on purpose); ``host_fault``: what of its host keeps it from serving as planned."""
        if hold is not None and why is not None and host_fault is None:
            if self.state != "drained":
                self._to(hold, now)
            self.failures = 0
            return None
        if why is None and host_fault is None:
            if self.state != "serving":
                again = f" again (was {self.state}: {self.why})" if self.why else f" (was {self.state})"
                log(f"{self.unit}: serving{again}")
            self._to("serving", now)
            self.failures, self.restarts, self.why = 0, 0, None
            return None
        if self.state == "drained":
            return None
        self.why = host_fault or why
        self.failures += 1
        if self.failures < self.restart_after:
            self._to("failing", now)
            return None
        self.failures = 0
        wrong = host_fault is None and why is not None and why.startswith(WRONG)
        if host_fault is None and not wrong and self.restarts < self.restarts_allowed:
            self.restarts += 1
            log(
                f"{self.unit}: {why} ({self.restart_after} checks in a row): restarting "
                f"({self.restarts} of {self.restarts_allowed})"
            )
            self._to("restarting", now)
            return "restart"
        in_a_row = f" ({self.restart_after} checks in a row)"
        after = f" after {self.restarts} restarts" if host_fault is None and not wrong else in_a_row
        log(f"{self.unit}: {self.why}{after}: draining (stopped; the router's health checks take it out)")
        self._to("drained", now)
        return "stop"


def _hold(shown: dict[str, str], grace_s: float) -> str | None:
    """Why a unit's failed checks do not count yet, or None."""
    active, result = shown.get("ActiveState", ""), shown.get("Result", "")
    if active == "inactive" and result == "success":
        return "stopped"
    if active in ("activating", "reloading", "deactivating"):
        return "starting"
    started = _number(shown.get("ExecMainStartTimestampMonotonic", "") or "") or 0
    if active == "active" and started and time.monotonic() - started / 1e6 < grace_s:
        return "starting"
    return None


def _metrics(
    units: dict[str, Ladder],
    checks: dict[str, dict[str, Any]],
    host: dict[str, Any],
    actions: dict[str, dict[str, int]],
    now: float,
) -> str:
    """The Prometheus text format (version 0.0.4) of this round."""
    out = [
        "# HELP kimi_watchdog_up 1 when the unit passed this round's checks.",
        "# TYPE kimi_watchdog_up gauge",
        *(f'kimi_watchdog_up{{unit="{u}"}} {int(ladder.state == "serving")}' for u, ladder in sorted(units.items())),
        "# HELP kimi_watchdog_state The unit's place on the recovery ladder (1 for its state).",
        "# TYPE kimi_watchdog_state gauge",
    ]
    states = ("serving", "failing", "restarting", "starting", "stopped", "drained")
    for u, ladder in sorted(units.items()):
        out += [f'kimi_watchdog_state{{unit="{u}",state="{s}"}} {int(ladder.state == s)}' for s in states]
    out += [
        "# HELP kimi_watchdog_actions_total Restarts and drains the watchdog made.",
        "# TYPE kimi_watchdog_actions_total counter",
    ]
    for u in sorted(units):
        out += [
            f'kimi_watchdog_actions_total{{unit="{u}",action="{a}"}} {actions[u].get(a, 0)}'
            for a in ("restart", "stop")
        ]
    out += [
        "# HELP kimi_watchdog_systemd_restarts_total systemd's own restarts of the unit (NRestarts).",
        "# TYPE kimi_watchdog_systemd_restarts_total counter",
    ]
    out += [
        f'kimi_watchdog_systemd_restarts_total{{unit="{u}"}} {checks[u].get("nrestarts", 0)}' for u in sorted(units)
    ]
    out += [
        "# HELP kimi_watchdog_canary_seconds How long the last canary took.",
        "# TYPE kimi_watchdog_canary_seconds gauge",
    ]
    out += [
        f'kimi_watchdog_canary_seconds{{unit="{u}"}} {checks[u]["canary_s"]:.3f}'
        for u in sorted(units)
        if checks[u].get("canary_s") is not None
    ]
    gpus = host.get("accelerators")
    if gpus is not None:
        out += [
            "# HELP kimi_watchdog_accelerators_present GPUs that answer nvidia-smi.",
            "# TYPE kimi_watchdog_accelerators_present gauge",
            f"kimi_watchdog_accelerators_present {gpus['count']}",
            "# HELP kimi_watchdog_accelerators_expected GPUs the plan expects on the host.",
            "# TYPE kimi_watchdog_accelerators_expected gauge",
            f"kimi_watchdog_accelerators_expected {gpus['expected']}",
            # volatile counts (since the driver loaded): a reload is a counter's reset
            "# HELP kimi_watchdog_ecc_uncorrected_errors_total Uncorrected ECC errors (volatile), all GPUs.",
            "# TYPE kimi_watchdog_ecc_uncorrected_errors_total counter",
            f"kimi_watchdog_ecc_uncorrected_errors_total {gpus['ecc']}",
            "# HELP kimi_watchdog_gpus_retirement_pending GPUs (not pages) with pages pending retirement or rows"
            " pending remapping, which a reset of the GPU applies.",
            "# TYPE kimi_watchdog_gpus_retirement_pending gauge",
            f"kimi_watchdog_gpus_retirement_pending {gpus['pending']}",
        ]
    if "xid_counts" in host:
        out += [
            "# HELP kimi_watchdog_xid_events_total GPU faults the driver logged (Xid events, by code) this boot.",
            "# TYPE kimi_watchdog_xid_events_total counter",
            *(f'kimi_watchdog_xid_events_total{{xid="{c}"}} {n}' for c, n in host["xid_counts"].items()),
            "# HELP kimi_watchdog_kernel_log_readable 1 when the watchdog reads the kernel's log (Xid events).",
            "# TYPE kimi_watchdog_kernel_log_readable gauge",
            f"kimi_watchdog_kernel_log_readable {int(host['kernel_log'] is None)}",
        ]
    scrub = host.get("scrub")
    if scrub is not None:
        out += [
            "# HELP kimi_watchdog_scrub_corrupt_files Files the weights' last scrub found corrupted and left so.",
            "# TYPE kimi_watchdog_scrub_corrupt_files gauge",
            f"kimi_watchdog_scrub_corrupt_files {scrub['left']}",
        ]
    out += [
        "# HELP kimi_watchdog_last_round_timestamp_seconds When the watchdog last checked.",
        "# TYPE kimi_watchdog_last_round_timestamp_seconds gauge",
        f"kimi_watchdog_last_round_timestamp_seconds {now:.3f}",
    ]
    return "\n".join(out) + "\n"


class Watchdog:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        kept: dict[str, Any] = {}
        try:
            with open(config["state"], encoding="utf-8") as f:
                kept = json.load(f)
        except (OSError, ValueError):
            pass
        units = kept.get("units", {}) if isinstance(kept, dict) else {}
        self.ladders = {u["unit"]: Ladder(u["unit"], config, units.get(u["unit"])) for u in config["units"]}
        self.actions: list[dict[str, Any]] = list(kept.get("actions", []))[-ACTIONS_KEPT:]
        self.counts: dict[str, dict[str, int]] = {u: dict(kept.get("counts", {}).get(u, {})) for u in self.ladders}
        self.host_fault: str | None = None
        # the last line said of an error of the watchdog's own, by what it broke (a unit, the host)
        self.errors: dict[str, str] = {}
        self.kmsg = Kmsg(config["kmsg"]) if config.get("kmsg") else None
        self.kmsg_error: str | None = None
        self.ignored = {int(c) for c in config.get("xid_ignore") or ()}
        # GPU faults the kernel reported: {"code", "bus", "details", "mono" (µs, CLOCK_MONOTONIC), "at"}
        self.xids: list[dict[str, Any]] = []
        self.xid_counts: dict[int, int] = {}
        interval, timeout = float(config["canary_interval_s"]), float(config["canary_timeout_s"])
        self.canaries = {u["unit"]: Canary(u, interval, timeout) for u in config["units"] if u.get("url")}

    def _act(self, unit: str, action: str, why: str | None, now: float) -> None:
        verb = "restart" if action == "restart" else "stop"
        run = subprocess.run(
            ["systemctl", verb, "--no-block", f"{unit}.service"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if run.returncode != 0:
            log(f"{unit}: systemctl {verb} failed: {run.stderr.strip()[:200]}")
        self.actions = [*self.actions, {"at": now, "unit": unit, "action": action, "why": why}][-ACTIONS_KEPT:]
        self.counts[unit][action] = self.counts[unit].get(action, 0) + 1

    def _kernel(self) -> None:
        """The Xid events logged since the last round (at the first, those of this boot)."""
        if self.kmsg is None:
            return
        first = self.kmsg.fd is None
        records = self.kmsg.read()
        if self.kmsg.error != self.kmsg_error:
            log(
                f"host: the kernel's log cannot be read, Xid events go unseen ({self.kmsg.error})"
                if self.kmsg.error
                else "host: the kernel's log is read again"
            )
            self.kmsg_error = self.kmsg.error
        now_mono, now = time.monotonic() * 1e6, time.time()
        for record in records:
            event = xids.parse(record.message) if record.facility == KERNEL else None
            if event is None or event.code in self.ignored:
                continue
            # the same fault in two lines (the Xid, then the driver's own "fallen off the bus")
            if any(
                x["bus"] == event.bus and x["code"] == event.code and abs(x["usec"] - record.usec) < 1e6
                for x in self.xids
            ):
                continue
            # when it happened: the record's clock for what the buffer held at the start; for an
            # event read live, when it was read (the kernel's clock may run apart from CLOCK_MONOTONIC
            # by NTP's slew; the read is at most a round late)
            mono = min(record.usec, now_mono) if first else now_mono
            self.xid_counts[event.code] = self.xid_counts.get(event.code, 0) + 1
            self.xids = [
                *self.xids,
                {
                    "code": event.code,
                    "bus": event.bus,
                    "details": event.details[: QUOTE * 2],
                    "usec": record.usec,
                    "mono": mono,
                    "at": now - (now_mono - mono) / 1e6,
                },
            ][-XIDS_KEPT:]
            log(f"host: Xid {event.code} on GPU {event.bus}: {quote(event.details)}")

    def _xid_fault(self, started_usec: int) -> str | None:
        """The GPU fault the kernel reported while a unit started at ``started_usec`` ran, or None."""
        seen = [x for x in self.xids if x["mono"] >= started_usec]
        if not seen:
            return None
        last = seen[-1]
        more = f" (and {len(seen) - 1} more)" if len(seen) > 1 else ""
        return f"accelerators: Xid {last['code']} on GPU {last['bus']}: {quote(last['details'])}{more}"

    def _host(self) -> tuple[dict[str, Any], str | None]:
        """The host's accelerators and weights: what was read, and what keeps it from serving."""
        cfg = self.config
        host: dict[str, Any] = {}
        faults = []
        if cfg.get("accelerators"):
            gpus = accelerators(cfg["accelerators"], float(cfg["timeout_s"]))
            host["accelerators"] = gpus | {"expected": cfg["accelerators"]["count"]}
            if gpus["fault"]:
                faults.append(f"accelerators: {gpus['fault']}")
        if self.kmsg is not None:
            self._kernel()
            host["xid"] = [{k: x[k] for k in ("code", "bus", "details", "at")} for x in self.xids]
            host["xid_counts"] = {str(c): n for c, n in sorted(self.xid_counts.items())}
            host["kernel_log"] = self.kmsg_error
        found = scrub_result(cfg["scrub"]) if cfg.get("scrub") else None
        if found is not None:
            repaired = len(found.get("repaired") or [])
            left = max(len(found.get("corrupted") or []) - repaired, 0)
            host["scrub"] = {"left": left, "at": found.get("time"), "repaired": repaired}
            if left:
                faults.append(f"weights: the scrub left {left} corrupted files")
        fault = "; ".join(faults) or None
        if fault != self.host_fault:
            log(f"host: {fault}" if fault else f"host: as planned again (was: {self.host_fault})")
            self.host_fault = fault
        return host, fault

    def _unit(
        self, unit: dict[str, Any], state: dict[str, str], host: dict[str, Any], fault: str | None, now: float
    ) -> dict[str, Any]:
        """One unit's round: its checks, and the ladder's action."""
        name, ladder = unit["unit"], self.ladders[unit["unit"]]
        nrestarts = _number(state.get("NRestarts", "") or "") or 0
        checks: dict[str, Any] = {"nrestarts": nrestarts, "canary_s": None}
        if ladder.systemd_restarts is not None and nrestarts > ladder.systemd_restarts:
            log(f"{name}: systemd restarted it (NRestarts {nrestarts}, result {state.get('Result', '?')})")
        ladder.systemd_restarts = nrestarts
        active = state.get("ActiveState") == "active"
        started = _number(state.get("ExecMainStartTimestampMonotonic", "") or "") or 0
        scrub = host.get("scrub")
        since = now - (time.monotonic() - started / 1e6)  # its start, on the wall clock
        at = scrub["at"] if scrub and isinstance(scrub["at"], (int, float)) else 0
        if unit.get("reads_weights") and scrub and scrub["repaired"] and active and started and at > since:
            # it may hold what it read of a file the scrub found corrupted: it reads them again
            fix = f"weights: the scrub re-fetched {scrub['repaired']} corrupted files since it started"
            log(f"{name}: {fix}: restarting")
            self._act(name, "restart", fix, now)
            return checks
        xid = self._xid_fault(started) if self.xids else None
        if xid is not None:
            fault = f"{fault}; {xid}" if fault else xid
        why: str | None = None
        if not active:
            why = f"unit {state.get('ActiveState', 'unknown')} ({state.get('SubState', '?')})"
        elif unit.get("url"):
            why = health(unit, float(self.config["timeout_s"]))
            if why is None:
                news = self.canaries[name].news(due_anyway=ladder.state != "serving")
                checks["canary_s"] = self.canaries[name].took
                if news is False and (fault is None or ladder.state == "drained"):
                    return checks  # healthy, no canary back this round: nothing new to judge
                why = news if isinstance(news, str) else None
        # an engine given time to start is one not healthy yet: a wrong answer once it is counts
        hold = _hold(state, float(self.config["grace_s"])) if why is None or not why.startswith("canary:") else None
        action = ladder.step(now, why, hold, fault if ladder.state != "drained" else None)
        if action is not None:
            self._act(name, action, ladder.why, now)
        return checks

    def _unexpected(self, what: str, exc: BaseException, outcome: str = "not judged this round") -> None:
        """One journal line for an error of the watchdog's own in ``what`` (said again only when
        it changes: a round a second would fill the journal)."""
        line = f"{what}: the check failed unexpectedly ({unexpected(exc)}): {outcome}"
        if self.errors.get(what) != line:
            log(line)
        self.errors[what] = line

    def round(self) -> None:
        """One round of every check. An error of the watchdog's own in one check (a unit's, the
        host's) is one journal line, and the round goes on with the others."""
        cfg, now = self.config, time.time()
        try:
            host, fault = self._host()
            self.errors.pop("host", None)
        except Exception as exc:  # noqa: BLE001
            self._unexpected("host", exc, "its faults as last read")
            host, fault = {}, self.host_fault
        try:
            shown: dict[str, dict[str, str]] | None = systemd(list(self.ladders))
            self.errors.pop("systemd", None)
        except Exception as exc:  # noqa: BLE001 - without systemd's view no unit is judged
            self._unexpected("systemd", exc, "no unit judged this round")
            shown = None
        checks: dict[str, dict[str, Any]] = {}
        for unit in cfg["units"]:
            name = unit["unit"]
            checks[name] = {"nrestarts": 0, "canary_s": None}
            if shown is None:
                continue
            try:
                checks[name] = self._unit(unit, shown.get(name, {}), host, fault, now)
                self.errors.pop(name, None)
            except Exception as exc:  # noqa: BLE001
                self._unexpected(name, exc)
        record = {
            "updated": now,
            "host": host | {"fault": fault},
            "units": {u: ladder.record() for u, ladder in self.ladders.items()},
            "counts": self.counts,
            "actions": self.actions,
        }
        try:
            write_whole(cfg["state"], json.dumps(record, sort_keys=True) + "\n", 0o644)
            if cfg.get("textfile") and os.path.isdir(os.path.dirname(cfg["textfile"])):
                write_whole(cfg["textfile"], _metrics(self.ladders, checks, host, self.counts, now), 0o644)
            self.errors.pop("state", None)
        except Exception as exc:  # noqa: BLE001
            self._unexpected("state", exc, "state and metrics files not written this round")


def main() -> None:
    parser = argparse.ArgumentParser(description="The serving host's watchdog.")
    parser.add_argument("--config", required=True)
    parser.add_argument("--once", action="store_true", help="one round, then exit")
    args = parser.parse_args()
    with open(args.config, encoding="utf-8") as f:
        config = json.load(f)
    dog = Watchdog(config)
    names = ", ".join(dog.ladders) or "no unit"
    log(f"watching {names} every {config['interval_s']} s")
    notify("READY=1")
    while True:
        started = time.monotonic()
        try:
            dog.round()
        except Exception as exc:  # noqa: BLE001 - the next round checks again; dying checks nothing
            log(f"round failed unexpectedly: {unexpected(exc)}")
        notify("WATCHDOG=1")
        if args.once:
            return
        time.sleep(max(0.0, float(config["interval_s"]) - (time.monotonic() - started)))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
