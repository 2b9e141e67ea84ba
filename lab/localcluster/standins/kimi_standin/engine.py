"""One stand-in engine process: command line, start checks, listeners, simulated load, SIGTERM."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from .api import ApiServer, ServedModel
from .cmdline import Catalog, ParsedArgs, UsageError, load_catalog, parse
from .weights import Weights, WeightsError, check

LOAD_SECONDS_ENV = "KIMI_STANDIN_LOAD_SECONDS"
DEFAULT_LOAD_SECONDS = 1.0
# Without a length in argv or config.json, vLLM falls back to this.
_FALLBACK_MAX_LEN = 2048
_SECRET_WORDS = ("key", "token", "secret", "password")


class StartupError(Exception):
    """The engine refuses to start: one ``ERROR`` line on stderr, exit 1."""


@dataclass(frozen=True)
class Traits:
    """How one engine's command line differs from the others'."""

    default_host: str
    default_port: int
    model_flag: str | None  # None: the model is vLLM's positional argument
    length_flag: str
    api_key_env: str | None
    long_length_env: str | None  # the variable that allows more than config.json says; None: nothing does
    underscores: bool
    guard_all: bool


TRAITS = {
    "vllm": Traits(
        # vLLM and TokenSpeed listen on every address unless told otherwise, as the real ones do.
        default_host="0.0.0.0",  # noqa: S104
        default_port=8000,
        model_flag=None,
        length_flag="--max-model-len",
        api_key_env="VLLM_API_KEY",
        long_length_env="VLLM_ALLOW_LONG_MAX_MODEL_LEN",
        underscores=True,
        guard_all=False,
    ),
    "sglang": Traits(
        default_host="127.0.0.1",
        default_port=30000,
        model_flag="--model-path",
        length_flag="--context-length",
        api_key_env=None,
        long_length_env="SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN",
        underscores=False,
        guard_all=True,
    ),
    "tokenspeed": Traits(
        default_host="0.0.0.0",  # noqa: S104
        default_port=8000,
        model_flag="--model",
        length_flag="--max-model-len",
        api_key_env=None,
        long_length_env=None,
        underscores=False,
        guard_all=True,
    ),
}

# Registry-checked values that hide inside JSON flags: (flag, key, registry).
_JSON_REGISTRY_VALUES = (
    ("--kv-transfer-config", "kv_connector", "kv_connector"),
    ("--speculative-config", "method", "speculative_method"),
)


class Log:
    """Engine-style lines on stderr (journald adds the unit and the time of day it was written)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __call__(self, message: str, level: str = "INFO") -> None:
        sys.stderr.write(f"{level} {time.strftime('%m-%d %H:%M:%S')} [{self.tag}] {message}\n")
        sys.stderr.flush()


@dataclass(frozen=True)
class Plan:
    """What the parsed command line asks for."""

    model_dir: Path
    host: str
    port: int
    names: tuple[str, ...]
    max_len: int | None
    api_key: str | None
    node_rank: int
    worker: bool
    rendezvous: tuple[str, int] | None  # the leader's address for workers to meet it


def _config_tokens(tokens: list[str], catalog: Catalog) -> list[str]:
    """The options of a ``--config`` YAML file (``key: value`` lines), as argv tokens placed before argv."""
    if "--config" not in catalog.flags:
        return []
    path = None
    for i, arg in enumerate(tokens):
        if arg == "--config" and i + 1 < len(tokens):
            path = tokens[i + 1]
        elif arg.startswith("--config="):
            path = arg.partition("=")[2]
    if path is None:
        return []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise StartupError(f"cannot read --config {path}: {exc.strerror}") from None
    out: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped == "---":
            continue
        key, colon, raw = stripped.partition(":")
        value = _yaml_scalar(raw.strip())
        if not colon or not key.strip() or line[:1].isspace() or value is None:
            raise StartupError(f"--config {path} line {number}: only 'key: value' lines are understood")
        flag = "--" + key.strip().replace("_", "-")
        if value in ("true", "True"):
            out.append(flag)
        elif value not in ("false", "False"):
            out += [flag, value]
    return out


def _yaml_scalar(raw: str) -> str | None:
    """A plain, single- or double-quoted scalar (a trailing comment dropped); None for anything else."""
    try:
        if raw.startswith('"'):
            # A double-quoted YAML scalar without YAML-only escapes is a JSON string (templates write tojson).
            value, end = json.JSONDecoder().raw_decode(raw)
            rest = raw[end:].strip()
        elif raw.startswith("'"):
            end = raw.index("'", 1)
            while raw[end + 1 : end + 2] == "'":
                end = raw.index("'", end + 2)
            value, rest = raw[1:end].replace("''", "'"), raw[end + 1 :].strip()
        else:
            value, rest = raw.partition(" #")[0].strip(), ""
    except ValueError:
        return None
    if not isinstance(value, str) or not value or (rest and not rest.startswith("#")):
        return None
    return value


def _address(value: str, flag: str) -> tuple[str, int]:
    host, colon, port = value.rpartition(":")
    if not colon or not port.isdigit() or not host:
        raise UsageError(f"argument {flag}: expected HOST:PORT, found {value!r}")
    return host.strip("[]"), int(port)


def _plan(engine: str, args: ParsedArgs, traits: Traits) -> Plan:
    if traits.model_flag is None:
        model = args.positionals[0] if args.positionals else args.value("--model")
    else:
        model = args.value(traits.model_flag)
    if model is None:
        raise StartupError("no model given: name a local weights directory")
    node_rank = args.integer("--node-rank", 0) or 0
    nnodes = args.integer("--nnodes", 1) or 1
    worker = "--headless" in args.switches or node_rank > 0
    rendezvous: tuple[str, int] | None = None
    if engine == "vllm":
        dp_address, dp_port = args.value("--data-parallel-address"), args.integer("--data-parallel-rpc-port")
        master, master_port = args.value("--master-addr"), args.integer("--master-port")
        if dp_address and dp_port:
            rendezvous = (dp_address, dp_port)
        elif master and master_port and nnodes > 1:
            rendezvous = (master, master_port)
    elif (dist := args.value("--dist-init-addr")) and nnodes > 1:
        rendezvous = _address(dist, "--dist-init-addr")
    key = args.value("--api-key")
    if key is None and traits.api_key_env:
        key = os.environ.get(traits.api_key_env) or None
    names = args.value("--served-model-name")
    return Plan(
        model_dir=Path(model),
        host=args.value("--host") or traits.default_host,
        port=args.integer("--port", traits.default_port) or traits.default_port,
        names=(names,) if names else (model,),
        max_len=args.integer(traits.length_flag, human=traits.underscores),
        api_key=key,
        node_rank=node_rank,
        worker=worker,
        rendezvous=rendezvous,
    )


def _check_registries(args: ParsedArgs, catalog: Catalog) -> None:
    def known(registry: str, value: str, where: str) -> None:
        names = catalog.registries.get(registry)
        if names is not None and value not in names:
            raise StartupError(f"{where}: unknown {registry} {value!r} (known: {', '.join(names)})")

    for registry in catalog.registries:
        flag = "--" + registry.replace("_", "-")
        value = args.value(flag)
        if value is not None:
            known(registry, value, flag)
    if (algorithm := args.value("--speculative-algorithm")) is not None:
        known("speculative_method", algorithm, "--speculative-algorithm")
    for flag, key, registry in _JSON_REGISTRY_VALUES:
        raw = args.value(flag)
        if raw is None:
            continue
        try:
            config = json.loads(raw)
        except ValueError:
            raise UsageError(f"argument {flag}: invalid JSON value: {raw!r}") from None
        if not isinstance(config, dict):
            raise UsageError(f"argument {flag}: expected a JSON object, found {raw!r}")
        # MultiConnector nests the connectors it combines.
        extra = config.get("kv_connector_extra_config")
        nested = extra.get("connectors") if isinstance(extra, dict) else None
        for part in [config, *(nested if isinstance(nested, list) else [])]:
            value = part.get(key) if isinstance(part, dict) else None
            if isinstance(value, str):
                known(registry, value, flag)


def _check_length(plan: Plan, weights: Weights, traits: Traits) -> int:
    derived = weights.derived_max_len()
    if plan.max_len is None:
        return derived or _FALLBACK_MAX_LEN
    allowed = traits.long_length_env is not None and os.environ.get(traits.long_length_env) == "1"
    if derived is not None and plan.max_len > derived and not allowed:
        hint = f"; set {traits.long_length_env}=1 to allow it" if traits.long_length_env else ""
        raise StartupError(
            f"{traits.length_flag} {plan.max_len} is greater than the derived maximum {derived} "
            f"of the model's config.json{hint}"
        )
    return plan.max_len


def _listen(address: tuple[str, int]) -> socket.socket:
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {address[0]}:{address[1]}: {exc.strerror}") from None
    sock.listen(64)

    def accept() -> None:
        # Workers only need the port to accept; what a real rendezvous says is not simulated.
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    return sock


def _wait_for_leader(address: tuple[str, int], stop: threading.Event, log: Log) -> None:
    logged = False
    while not stop.is_set():
        try:
            with socket.create_connection(address, timeout=1.0):
                return
        except OSError:
            if not logged:
                log(f"waiting for the leader at {address[0]}:{address[1]}")
                logged = True
        stop.wait(0.5)


def _redacted(tokens: list[str]) -> str:
    out: list[str] = []
    hide = False
    for arg in tokens:
        if hide:
            out.append("***")
            hide = False
            continue
        name, eq, _ = arg.partition("=")
        secret = name.startswith("-") and any(w in name.lower() for w in _SECRET_WORDS)
        if secret and eq:
            out.append(f"{name}=***")
        else:
            out.append(arg)
            hide = secret
    return shlex.join(out)


def _load_seconds(log: Log) -> float:
    raw = os.environ.get(LOAD_SECONDS_ENV)
    if raw is None:
        return DEFAULT_LOAD_SECONDS
    try:
        return max(0.0, float(raw))
    except ValueError:
        log(f"{LOAD_SECONDS_ENV}={raw!r} is not a number; using {DEFAULT_LOAD_SECONDS}", "WARNING")
        return DEFAULT_LOAD_SECONDS


def check_command_line(catalog: Catalog, tokens: list[str]) -> tuple[ParsedArgs, Plan]:
    """``tokens`` (what follows ``serve``) parsed and checked as the release does before it loads anything.

    Raises UsageError (argparse would reject them) or StartupError (a value the release does not know).
    """
    traits = TRAITS[catalog.engine]
    args = parse(
        _config_tokens(tokens, catalog) + tokens,
        catalog,
        positionals=1 if traits.model_flag is None else 0,
        underscores=traits.underscores,
        required=() if traits.model_flag is None else (traits.model_flag,),
    )
    plan = _plan(catalog.engine, args, traits)
    _check_registries(args, catalog)
    return args, plan


def serve(package: str, prog: str, tokens: list[str], subcommand: tuple[str, ...] = ()) -> int:
    """Run ``PROG [SUBCOMMAND] TOKENS`` of the release installed as ``package``; the process's exit status."""
    catalog = load_catalog(package)
    traits = TRAITS[catalog.engine]
    log = Log("kimi-standin")
    label = f"{catalog.engine} {catalog.version}"
    if "-h" in tokens or "--help" in tokens:
        print(f"usage: {prog} [options]\n\nStand-in for {label}: takes the {len(catalog.flags)} flags of its catalog.")
        return 0
    try:
        args, plan = check_command_line(catalog, tokens)
        if args.value("--load-format") == "fastsafetensors" and importlib.util.find_spec("fastsafetensors") is None:
            raise StartupError("--load-format fastsafetensors needs the package: pip install fastsafetensors")
        try:
            weights = check(plan.model_dir)
        except WeightsError as exc:
            raise StartupError(f"cannot load the model from {plan.model_dir}: {exc}") from None
        max_len = _check_length(plan, weights, traits)
    except UsageError as exc:
        sys.stderr.write(f"{prog}: error: {exc}\n")
        return 2
    except StartupError as exc:
        log(f"{label}: {exc}", "ERROR")
        return 1
    return _run(catalog, traits, plan, weights, max_len=max_len, argv=_redacted([prog, *subcommand, *tokens]), log=log)


def _run(catalog: Catalog, traits: Traits, plan: Plan, weights: Weights, *, max_len: int, argv: str, log: Log) -> int:
    label = f"{catalog.engine} {catalog.version}"
    stop = threading.Event()
    received: list[str] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    role = f"worker, node rank {plan.node_rank}" if plan.worker else "leader" if plan.rendezvous else "single"
    load = _load_seconds(log)
    log(
        f"{label} stand-in starting ({role}): {argv} -- weights: {weights.shards} shards, {weights.tensors} "
        f"tensors, {weights.bytes} bytes; load time {load:g} s"
    )
    listeners: list[socket.socket] = []
    server: ApiServer | None = None
    ready = threading.Event()
    try:
        if plan.rendezvous is not None and not plan.worker:
            listeners.append(_listen(plan.rendezvous))
        if not plan.worker:
            model = ServedModel(
                engine=catalog.engine,
                version=catalog.version,
                names=plan.names,
                root=str(plan.model_dir),
                max_model_len=max_len,
                api_key=plan.api_key,
                guard_all=traits.guard_all,
            )
            try:
                server = ApiServer((plan.host, plan.port), model, ready, log)
            except OSError as exc:
                raise StartupError(f"cannot listen on {plan.host}:{plan.port}: {exc.strerror}") from None
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    except StartupError as exc:
        log(f"{label}: {exc}", "ERROR")
        for sock in listeners:
            sock.close()
        return 1
    if plan.worker and plan.rendezvous is not None:
        _wait_for_leader(plan.rendezvous, stop, log)
    if not stop.wait(load):
        ready.set()
        if server is None:
            log(f"ready: worker (node rank {plan.node_rank}), no HTTP server")
        else:
            names = ", ".join(plan.names)
            log(f"ready: serving {names} on http://{plan.host}:{plan.port} (max_model_len {max_len})")
    while not stop.wait(0.5):
        pass
    log(f"shutting down ({received[0] if received else 'stop'})")
    if server is not None:
        server.shutdown()
        server.server_close()
    for sock in listeners:
        sock.close()
    return 0


def cli_main(package: str) -> None:
    """The release's console script (``vllm``, ``sglang``, ``tokenspeed``): ``serve`` and ``--version``."""
    prog = Path(sys.argv[0]).name or package
    argv = sys.argv[1:]
    if argv[:1] == ["serve"]:
        sys.exit(serve(package, prog, argv[1:], ("serve",)))
    if argv in (["--version"], ["-v"]):
        print(load_catalog(package).version)
        sys.exit(0)
    if argv[:1] in (["-h"], ["--help"]):
        print(f"usage: {prog} {{serve}} ...")
        sys.exit(0)
    if not argv:
        sys.stderr.write(f"{prog}: error: the following arguments are required: subcommand\n")
        sys.exit(2)
    sys.stderr.write(f"{prog}: error: argument subcommand: invalid choice: {argv[0]!r} (choose from 'serve')\n")
    sys.exit(2)


def module_main(package: str) -> None:
    """A ``python -m PACKAGE.MODULE`` launcher that takes the serve flags directly (``sglang.launch_server``)."""
    sys.exit(serve(package, Path(sys.argv[0]).name, sys.argv[1:]))
