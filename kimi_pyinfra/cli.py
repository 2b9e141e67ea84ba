"""kimi-deploy: plan, check and converge Kimi K3.1 Pro serving clusters from one controller.

A recipe says what to serve, a pyinfra inventory where. The converge is a pyinfra deploy:
"kimi-deploy converge INVENTORY" runs it with the pyinfra installed beside kimi-deploy, from a
folder "kimi-deploy init" wrote (or a checkout).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from kimi_deploy import __version__
from kimi_deploy.converge import before_connecting
from kimi_deploy.converge.host_files import host_files
from kimi_deploy.converge.plan import PYPI, plan_converge
from kimi_deploy.errors import ConfigError
from kimi_deploy.host.captured import CAPTURES
from kimi_deploy.host.preflight import GATES, Needs, rdma_asked
from kimi_deploy.host.profile import parse_profile, port_active
from kimi_deploy.host.profile_types import HostProfile
from kimi_deploy.hostside.boundary_lock import lock_pins
from kimi_deploy.hostside.boundary_text import printable
from kimi_deploy.parsers import (
    ParseError,
    ibstat,
    ibv_devinfo,
    nccl_tests,
    nvidia_smi_fabric,
    nvidia_smi_query,
    nvidia_smi_topo,
    tpu_pci,
)
from kimi_deploy.plan.deploy_plan import part_of
from kimi_deploy.plan.planner import plan
from kimi_deploy.plan.servespec import Plan
from kimi_deploy.plan.table import format_plan
from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.releases import committed_locks
from kimi_deploy.releases.index_pins import missing_pins
from kimi_deploy.releases.servability import refusals
from kimi_deploy.render.emitted import emissions
from kimi_deploy.render.fidelity_ledger import gaps, read_citations, render
from kimi_deploy.serving.allreduce import nccl_verdict
from kimi_deploy.weights.hub_lock import make_lock
from kimi_deploy.weights.lockfile import lock_path
from kimi_pyinfra.converge_command import run_converge
from kimi_pyinfra.inventory_file import load_inventory
from kimi_pyinfra.logs_command import run_logs
from kimi_pyinfra.starter import init
from kimi_pyinfra.status_command import run_status


def _plan(args: argparse.Namespace) -> tuple[Any, Plan]:
    recipe = load_recipe(args.recipe)
    inventory = load_inventory(args.inventory)
    return recipe, plan(recipe, args.recipe, inventory, getattr(args, "topology", None))


def _validate(args: argparse.Namespace) -> int:
    recipe, result = _plan(args)
    topologies = sorted({h.topology for h in result.hosts})
    # the engine release of each topology must load the model (kimi_deploy.releases.servability)
    refused = refusals(recipe, args.recipe, topologies)
    for refusal in refused.values():
        print(refusal, file=sys.stderr)
    kept = [name for name in topologies if name not in refused]
    stale = committed_locks.problems(recipe, topologies=kept)
    for line in stale:
        print(f"kimi-deploy: {line}", file=sys.stderr)
    # the checkpoints' locks and the API keys, which the converge reads before it connects
    missing = before_connecting.refusals(recipe, args.recipe, topologies, os.environ)
    for line in missing:
        print(line, file=sys.stderr)
    if refused or stale or missing:
        return 2
    if args.index:
        missing = missing_pins(recipe, args.index)
        for line in missing:
            print(f"kimi-deploy: {args.recipe}: {line}", file=sys.stderr)
        if missing:
            return 1
    hosts = f"{len(result.hosts)} host{'' if len(result.hosts) == 1 else 's'}"
    print(f"ok: {args.recipe} x {args.inventory}: {hosts} in {', '.join(topologies)}")
    if args.index:
        print(f"ok: every release the recipe pins is on {args.index}")
    return 0


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _render_folder(out: Path) -> None:
    """``out`` made if missing; ``ConfigError`` naming it when nothing can be written in it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(str(out), "--render", f"cannot write there: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(str(out), "--render", "cannot write there: Permission denied")


def _write_rendered(target: Path, content: str) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    except OSError as exc:
        where = str(exc.filename or target)
        raise ConfigError(where, "--render", f"cannot write there: {exc.strerror or exc}") from None


def _render(args: argparse.Namespace, recipe: Any, result: Plan) -> int:
    """Write every file a converge writes to each host (``kimi_deploy.converge.host_files``) under
    ``DIR/<host>/``, but secrets and files whose content the plan cannot know: each of those is
    named on stderr, with the hosts it goes to and why."""
    out = Path(args.render)
    _render_folder(out)
    inventory = load_inventory(args.inventory)
    written = 0
    left: dict[tuple[str, str], list[str]] = {}
    for spec in result.hosts:
        deploy = part_of(recipe, args.recipe, inventory.host(spec.host), result)
        # the controller's environment: whether it has a Hub token (no secret is read)
        todo = plan_converge(deploy, os.environ, plan_only=True)
        for f in host_files(deploy, todo):
            why = "secret" if f.secret else f.withheld
            if why:
                # a release folder is named by its own digest, one per host: its files are named once
                path = f.path.replace(todo.release.dir, f"{recipe.paths.releases}/*", 1)
                left.setdefault((path, why), []).append(spec.host)
                continue
            _write_rendered(out / spec.host / f.path.lstrip("/"), f.content)
            written += 1
    for (path, why), hosts in left.items():
        on = hosts[0] if len(hosts) == 1 else f"{len(hosts)} hosts ({', '.join(hosts)})"
        print(printable(f"kimi-deploy: not rendered: {path} on {on}: {why}"), file=sys.stderr)
    print(f"rendered {written} files for {len(result.hosts)} hosts under {out}", file=sys.stderr)
    return 0


def _show_plan(args: argparse.Namespace) -> int:
    recipe, result = _plan(args)
    if args.json:
        print(json.dumps(_jsonable(result), indent=2, sort_keys=True))
    else:
        sys.stdout.write(format_plan(result, recipe))
    if args.render:
        return _render(args, recipe, result)
    return 0


def _lock_releases(recipe: Any, index: str, asked: bool) -> int:
    kept, refused = committed_locks.lock_all(recipe, index, os.environ)
    for path in kept:
        print(f"{path}: {len(lock_pins(path.read_text(encoding='utf-8')))} pins")
    for line in refused:
        print(f"kimi-deploy: {line}", file=sys.stderr)
    if asked and not kept and not refused:
        print("no release to lock: the recipe names no hosts' OS (os); hosts' locks are resolved during the converge")
    return 1 if refused else 0


def _lock(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe)
    if args.releases:
        return _lock_releases(recipe, args.index, asked=True)
    # before huggingface_hub is imported: it reads these once
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
    # every checkpoint the hosts hold: the model, and each topology's speculative draft
    for field, checkpoint in recipe.all_checkpoints():
        lock = make_lock(checkpoint, args.recipe, args.endpoint, os.environ, field)
        path = lock_path(checkpoint)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(lock.to_json(), encoding="utf-8")
        print(f"{path}: {len(lock.files)} files, {lock.total_bytes} bytes")
    return _lock_releases(recipe, args.index, asked=False)


# --kind of `facts parse` -> the parser of that command's output (text, --fields).
_FACT_PARSERS: dict[str, Callable[[str, list[str] | None], Any]] = {
    "nvidia-smi-query": nvidia_smi_query.parse_query,
    "nvidia-smi-topo": lambda text, _: nvidia_smi_topo.parse_topo(text),
    "nvidia-smi-fabric": lambda text, _: nvidia_smi_fabric.parse_fabric(text),
    "ibv-devinfo": lambda text, _: ibv_devinfo.parse_ibv_devinfo(text),
    "ibstat": lambda text, _: ibstat.parse_ibstat(text),
    "tpu-pci": lambda text, _: tpu_pci.parse_tpu_pci(text),
    "nccl-all-reduce": lambda text, _: nccl_tests.parse_nccl_tests(text),
}


def _facts_parse(args: argparse.Namespace) -> int:
    fields = [f.strip() for f in args.fields.split(",")] if args.fields else None
    if fields is not None and args.kind != "nvidia-smi-query":
        raise ConfigError(args.file, args.kind, "--fields applies to nvidia-smi-query only")
    try:
        text = Path(args.file).read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise ConfigError(args.file, args.kind, exc.strerror or "cannot be read") from exc
    try:
        data = _FACT_PARSERS[args.kind](text, fields)
    except ParseError as exc:
        raise ConfigError(args.file, args.kind, str(exc)) from exc
    print(json.dumps(data, indent=2, sort_keys=True))
    return 0


def _fields(args: argparse.Namespace) -> list[str] | None:
    return [f.strip() for f in args.fields.split(",")] if args.fields else None


def _facts_check(args: argparse.Namespace) -> int:
    """The preflight gates a deploy runs on HOST, on what was captured there instead of the probe."""
    given = {name: getattr(args, name) for name in CAPTURES if getattr(args, name)}
    if not given:
        raise ConfigError(
            args.inventory,
            args.host,
            "give a capture: " + ", ".join("--" + name.replace("_", "-") for name in CAPTURES),
        )
    if len({CAPTURES[name].section for name in given}) < len(given):
        raise ConfigError(args.inventory, args.host, "one capture per probe section: --ibv-devinfo or --ibstat")
    if args.fields and "nvidia_smi_query" not in given:
        raise ConfigError(args.inventory, args.host, "--fields applies to --nvidia-smi-query only")
    recipe, result = _plan(args)
    try:
        spec = result.for_host(args.host)
    except KeyError:
        raise ConfigError(args.inventory, args.host, "not a host of the plan") from None
    host = load_inventory(args.inventory).host(args.host)
    raw: dict[str, Any] = {}
    for name, path in given.items():
        try:
            text = Path(path).read_bytes().decode("utf-8", errors="replace")
            raw[CAPTURES[name].section] = CAPTURES[name].read(text, _fields(args))
        except OSError as exc:
            raise ConfigError(path, name.replace("_", "-"), exc.strerror or "cannot be read") from exc
        except ParseError as exc:
            raise ConfigError(path, name.replace("_", "-"), str(exc)) from exc
    nccl = raw.pop("nccl", None)
    profile = parse_profile(raw)
    needs = Needs(recipe, spec, 0, 0, list(host.vars.kimi_rdma_devices or []))
    failed = 0
    for gate in dict.fromkeys(CAPTURES[name].gate for name in given):
        if gate == "all-reduce":
            passed, line = nccl_verdict(recipe, spec, cast(nccl_tests.NcclTestsRun, nccl))
        else:
            line = {g.__name__: g for g in GATES}[gate](needs, profile)
            passed = _judged(gate, needs, profile) if line is None else ""
        # The lines show what the captures say (GPU names, device names, nvidia-smi's errors): text
        # from the host, shown with its control characters escaped.
        if line is None:
            print(printable(f"ok: {args.host}: {passed}"))
        else:
            failed += 1
            print(printable(f"kimi-deploy: {args.host}: {line}"), file=sys.stderr)
    return 1 if failed else 0


def _judged(gate: str, needs: Needs, profile: HostProfile) -> str:
    """What a passed gate found, in its own words."""
    spec = needs.spec
    if gate == "accelerators":
        acc = profile["accelerators"]
        memory = f" ({acc['memory_mib'] // 1024} GiB)" if acc["memory_mib"] else ""
        want = f"pool {spec.pool} needs {spec.accelerators} x {spec.accelerator_model}"
        return f"accelerators: {want}, found {acc['count']} x {acc['model']}{memory}"
    if not rdma_asked(needs):
        return f"RDMA: topology {spec.topology} moves no KV cache over RDMA from this host: nothing asked"
    active = [f"{p['device']}/{p['port']}" for p in profile["rdma"] if port_active(p)]
    asked = ", ".join(needs.rdma_devices) or "no device named"
    return f"RDMA: {asked} asked for KV transfer, ACTIVE ports: {', '.join(active) or 'none'}"


def _ledger(args: argparse.Namespace) -> int:
    recipe, result = _plan(args)
    emitted = emissions(recipe, result)
    citations = read_citations({e.program for e in emitted})
    found = gaps(emitted, citations)
    for line in found.lines():
        print(f"kimi-deploy: {line}", file=sys.stderr)
    text = render(args.recipe, args.inventory, emitted, citations)
    if args.check is None:
        sys.stdout.write(text)
    else:
        try:
            kept = Path(args.check).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(args.check, "", f"cannot read: {exc.strerror or exc}") from None
        if kept != text:
            print(
                f"kimi-deploy: {args.check}: differs from the ledger of the plan; "
                f"make it anew with: kimi-deploy ledger {args.recipe} {args.inventory} > {args.check}",
                file=sys.stderr,
            )
            return 1
        print(f"ok: {args.check} is the ledger of {args.recipe} x {args.inventory}: {len(emitted)} emissions")
    return 1 if found.uncited else 0


def _init(args: argparse.Namespace) -> int:
    target = Path(args.dir)
    written = init(target)
    print(f"{target}: wrote {len(written)} files (deploys/, recipes/, inventories/); from there:")
    print("    kimi-deploy plan recipes/kimi-k3.1-pro.yaml inventories/prod.py")
    print("    kimi-deploy lock recipes/kimi-k3.1-pro.yaml")
    print("    kimi-deploy validate recipes/kimi-k3.1-pro.yaml inventories/prod.py")
    print("    kimi-deploy converge inventories/prod.py")
    return 0


# The commands whose words after the inventory are pyinfra's, which argparse would not pass on:
# each one's run and its line in --help.
_PYINFRA_RUNS: dict[str, tuple[Callable[[Sequence[str]], int], str]] = {
    "converge": (
        run_converge,
        "converge the inventory's hosts (pyinfra INVENTORY deploys/kimi.py -y, this installation's pyinfra)",
    ),
    "status": (
        run_status,
        "what serves where, and a curl to ask it: one read-only probe per host (deploys/status.py)",
    ),
}

# What --help says after the commands: the other ways in.
EPILOG = """\
the other entry points:
  pyinfra INVENTORY deploys/NAME.py -y   each deploy, as pyinfra runs it (converge --deploy NAME is the same)
  scripts/demo, scripts/test             in a checkout: the local demo cluster, the tests

first steps: kimi-deploy init DIR, then lock, validate and converge from DIR (README.md)"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kimi-deploy", description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"kimi-deploy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    validate = sub.add_parser("validate", help="check a recipe and an inventory together; change nothing")
    validate.add_argument("recipe")
    validate.add_argument("inventory")
    validate.add_argument(
        "--index",
        metavar="URL",
        help="also ask this package index (PEP 503 simple URL, e.g. https://pypi.org/simple) whether it lists "
        "every release the recipe pins",
    )
    validate.add_argument("--topology", help="only this topology of the recipe")
    validate.set_defaults(func=_validate)
    show = sub.add_parser("plan", help="print every host's serve spec (pool, rank, ports, argv)")
    show.add_argument("recipe")
    show.add_argument("inventory")
    show.add_argument("--topology", help="only this topology of the recipe")
    show.add_argument("--json", action="store_true", help="print the plan as JSON")
    show.add_argument("--render", metavar="DIR", help="write every host's rendered files under DIR/<host>/")
    show.set_defaults(func=_show_plan)
    ledger = sub.add_parser(
        "ledger", help="every flag, variable, config key and unit directive the plan emits, with its source"
    )
    ledger.add_argument("recipe")
    ledger.add_argument("inventory")
    ledger.add_argument("--topology", help="only this topology of the recipe")
    ledger.add_argument("--check", metavar="FILE", help="compare with a ledger kept in FILE instead of printing")
    ledger.set_defaults(func=_ledger)
    lock = sub.add_parser(
        "lock",
        help="record every file's size and digest at the pinned revision of each checkpoint (the model, each "
        "speculative draft), and lock every release "
        "for its hosts' platforms",
    )
    lock.add_argument("recipe")
    lock.add_argument("--endpoint", help="Hub or mirror URL (default: HF_ENDPOINT or huggingface.co)")
    lock.add_argument(
        "--releases", action="store_true", help="only the releases' locks (recipes/locks/releases/), not the weights'"
    )
    lock.add_argument(
        "--index", metavar="URL", default=PYPI, help=f"the package index to resolve releases against (default {PYPI})"
    )
    lock.set_defaults(func=_lock)
    facts = sub.add_parser("facts", help="hardware facts from captured command outputs; touch no host")
    facts_sub = facts.add_subparsers(dest="facts_command", required=True)
    parse = facts_sub.add_parser("parse", help="print a captured command output as JSON")
    parse.add_argument("--kind", required=True, choices=list(_FACT_PARSERS), help="the command that printed FILE")
    parse.add_argument("--fields", help="nvidia-smi-query without a header: the --query-gpu field list")
    parse.add_argument("file", metavar="FILE")
    parse.set_defaults(func=_facts_parse)
    check = facts_sub.add_parser(
        "check", help="run the preflight gates a deploy runs on HOST on outputs captured there; exit 1 on a refusal"
    )
    check.add_argument("recipe")
    check.add_argument("inventory")
    check.add_argument("host", metavar="HOST", help="a host of the inventory the recipe places")
    check.add_argument("--topology", help="only this topology of the recipe")
    check.add_argument("--nvidia-smi-query", metavar="FILE", help="nvidia-smi --query-gpu=... --format=csv output")
    check.add_argument("--fields", help="with --nvidia-smi-query without a header: the --query-gpu field list")
    check.add_argument("--tpu-pci", metavar="FILE", help="the host's TPU PCI listing (lspci -nn, sysfs)")
    check.add_argument("--ibv-devinfo", metavar="FILE", help="ibv_devinfo [-v] output")
    check.add_argument("--ibstat", metavar="FILE", help="ibstat output")
    check.add_argument("--nccl-all-reduce", metavar="FILE", help="nccl-tests all_reduce_perf output")
    check.set_defaults(func=_facts_check)
    # listed for --help and their words taken whole; _run hands them to _PYINFRA_RUNS before argparse
    for name, (_, said) in _PYINFRA_RUNS.items():
        sub.add_parser(name, add_help=False, help=said).add_argument("args", nargs=argparse.REMAINDER)
    logs = sub.add_parser(
        "logs", help="follow the journals of the kimi units on the hosts (journalctl -f over SSH; Ctrl-C stops)"
    )
    logs.add_argument("inventory")
    logs.add_argument("host", metavar="HOST", nargs="?", help="a host of the plan (default: every host)")
    logs.add_argument("unit", metavar="UNIT", nargs="?", help="one of HOST's units (default: all of them)")
    logs.add_argument(
        "-n", "--lines", type=int, default=10, metavar="N", help="the last N lines of each host first (default 10)"
    )
    logs.add_argument("--no-follow", action="store_true", help="print those lines and stop")
    logs.add_argument(
        "--data", action="append", default=[], metavar="KEY=VALUE", help="host data, as pyinfra's --data (kimi_recipe)"
    )
    logs.set_defaults(func=_logs)
    start = sub.add_parser("init", help="a folder of one's own to run the installed deploys from")
    start.add_argument("dir", metavar="DIR", help="written into; no file in it is overwritten")
    start.set_defaults(func=_init)
    cluster = sub.add_parser("cluster", add_help=False, help="local test cluster of real hosts: up, status, down")
    cluster.add_argument("args", nargs=argparse.REMAINDER)
    cluster.set_defaults(func=lambda args: _cluster(args.args))
    return parser


def _logs(args: argparse.Namespace) -> int:
    return run_logs(args.inventory, args.host, args.unit, lines=args.lines, follow=not args.no_follow, data=args.data)


def _cluster(argv: Sequence[str]) -> int:
    # The cluster is the lab's (lab/pyproject.toml), a distribution of its own that a checkout's
    # scripts install; imported only here: it needs root and system tools no other command touches.
    try:
        from localcluster.cli import main as cluster_main  # noqa: PLC0415
    except ModuleNotFoundError as exc:
        if exc.name not in ("localcluster", "localcluster.cli"):
            raise
        print(
            "kimi-deploy: cluster: the local test cluster is not installed: from a checkout, "
            "run scripts/demo (or pip install -e ./lab)",
            file=sys.stderr,
        )
        return 2
    return cluster_main(argv, prog="kimi-deploy cluster")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _run(sys.argv[1:] if argv is None else list(argv))
        sys.stdout.flush()  # what is still buffered goes now, inside the try
        return code
    except BrokenPipeError:
        # The reader went away (``kimi-deploy plan ... | head``): as other command-line tools, stop
        # quietly. Python's own flush at exit would raise again: stdout goes to /dev/null first
        # (the signal module's documentation, "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool that SIGPIPE ended


def _pyinfra_run(command: str, words: list[str]) -> int:
    try:
        return _PYINFRA_RUNS[command][0](words)
    except ConfigError as exc:
        print(printable(f"kimi-deploy {command}: {exc}"), file=sys.stderr)
        return 2


def _run(words: list[str]) -> int:
    if words[:1] == ["cluster"]:
        # Everything after "cluster" is the cluster's own (its -h too), which argparse would not pass on.
        return _cluster(words[1:])
    if words[:1] and words[0] in _PYINFRA_RUNS:
        return _pyinfra_run(words[0], words[1:])
    args = build_parser().parse_args(words)
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        # A refusal may quote a capture or a host's text: shown, never acted on, by the terminal.
        print(printable(str(exc)), file=sys.stderr)
        return 2
    except BrokenPipeError:
        raise  # the reader went away: main's to handle
    except OSError as exc:
        # a folder not writable, a disk full: the path and the reason, in one line
        where = f"{exc.filename}: " if exc.filename else ""
        print(printable(f"kimi-deploy {args.command}: {where}{exc.strerror or exc}"), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"kimi-deploy {args.command}: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
