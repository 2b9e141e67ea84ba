"""Every command README.md and docs/*.md show is one this install accepts, and the offline ones run.

Each ``kimi-deploy`` line (``tests/doc_commands.py`` reads them out of the docs) is parsed by the
CLI's own parser: a subcommand or flag the CLI lacks fails here, naming the doc and its line
(``cluster`` lines by the lab's parser, whose command they are). Placeholders become real
things: ``RECIPE`` and ``INVENTORY`` the example recipe and inventory, ``HOST`` one of its hosts,
``NAME`` a topology, ``URL`` PyPI's index, ``DIR`` a new folder, ``FILE`` a real capture of the
kind its flag names (``tests/parsers/fixtures``). The lines that need nothing but files of the
repository (``plan``, ``validate`` without ``--index``, ``ledger``, ``facts parse``, ``facts
check``, ``init`` into a new folder) then run in-process and must exit 0: from the repository
root, or in the folder an ``init`` earlier in the same block wrote when they come after ``cd``
into it. Lines that need hosts or a network (``lock``, ``converge``, ``status``, ``cluster``,
``validate --index``) and lines after the reader's own steps changed files (``$EDITOR``, ``kimi-deploy
lock``) are parsed only.

Each ``pyinfra INVENTORY deploys/X.py`` line names an inventory and a deploy file that exist (in the
repository, or among what ``init`` writes when it runs in that folder), the deploy is one of the
package's own (``kimi_pyinfra.starter.DEPLOYS``), every flag is one of pyinfra's, and every
``--data kimi_*`` key is host data kimi-deploy reads. ``kimi-deploy converge INVENTORY [--deploy
NAME] [PYINFRA OPTIONS]`` is held to the same, its deploy ``deploys/NAME.py``. A ``python FILE.py``
line names a file of the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from pathlib import Path

import pytest
from pyinfra_cli.main import cli as pyinfra_command

from kimi_deploy import __version__
from kimi_deploy.inventory import HostVars
from kimi_pyinfra.cli import build_parser, main
from kimi_pyinfra.starter import DEPLOYS, starter_files
from tests.conftest import PROD, RECIPE, ROOT
from tests.doc_commands import Command, commands

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMANDS = [c for doc in DOCS for c in commands(ROOT, doc)]
KIMI = [c for c in COMMANDS if c.program == "kimi-deploy"]
PYINFRA = [c for c in COMMANDS if c.program == "pyinfra"]
CONVERGE = [c for c in KIMI if c.words[1:2] == ("converge",)]
PYTHON = [c for c in COMMANDS if re.fullmatch(r"python3?", c.program) and c.words[1:2] and c.words[1].endswith(".py")]

FIXTURES = ROOT / "tests" / "parsers" / "fixtures"
# a real capture of each kind, one the example inventory's hosts pass with
CAPTURES = {
    "nvidia-smi-query": "query_h200x8_header_units_distributedai.csv",
    "nvidia-smi-topo": "topo_h200x8_12nic_tabs_distributedai.txt",
    "nvidia-smi-fabric": "fabric_h100_completed_success_gpud.txt",
    "ibv-devinfo": "ibv_devinfo_h200_11hca_roce_spaces_deepep355.txt",
    "ibstat": "ibstat_a100_9ca_vf_ib_eth_gpud.txt",
    "tpu-pci": "tpu_v2_4chip_lspci_tinygrad.txt",
    # nvidia-smi-query without its header (--fields name,pci.device_id)
    "nvidia-smi-query --fields": "query_h100nvl_noheader_akash91.csv",
    "nccl-all-reduce": "nccl_allreduce_h100_2node_16rank_good_nvls_ompi_noise_nccltests309.txt",
}
# what a run needs no host and no network for
OFFLINE = {"plan", "validate", "ledger", "facts", "init"}
PYINFRA_FLAGS = {name for p in pyinfra_command.params for name in (*p.opts, *p.secondary_opts) if name.startswith("-")}


def _resolved(command: Command, tmp: Path) -> list[str]:
    """The command's words after ``kimi-deploy``, placeholders replaced by real things."""
    words = list(command.words[1:])
    out: list[str] = []
    for i, word in enumerate(words):
        before = words[i - 1] if i else ""
        if word == "FILE" and before == "--check":
            out.append("docs/fidelity-ledger.md")  # ledger --check: the kept ledger
        elif word == "FILE":
            kind = before.removeprefix("--") if before.startswith("--") else _kind(words)
            kind += " --fields" if "--fields" in words else ""
            assert kind in CAPTURES, f"{command.where}: no real file for FILE after {before!r}"
            out.append(str(FIXTURES / CAPTURES[kind]))
        elif word == "DIR":
            out.append(str(tmp / f"dir-{i}"))
        else:
            names = {"RECIPE": RECIPE, "INVENTORY": PROD, "HOST": "gb300-p01", "NAME": "gb300-pd"}
            out.append(names.get(word, "https://pypi.org/simple" if word == "URL" else word))
    return out


def _kind(words: list[str]) -> str:
    return words[words.index("--kind") + 1] if "--kind" in words else ""


class Refused(Exception):
    """The parser refused a doc's command line: its own message."""


def _parsed(words: list[str]) -> argparse.Namespace | None:
    """What the CLI's parser makes of ``words``: None for ``--version`` and ``cluster`` (parsed by
    the lab's parser here); ``Refused`` with the parser's message when it refuses them."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            if words[:1] == ["cluster"]:
                from localcluster.cli import build_parser as cluster_parser  # noqa: PLC0415

                cluster_parser("kimi-deploy cluster").parse_args(words[1:])
                return None
            return build_parser().parse_args(words)
    except SystemExit as exc:
        if exc.code != 0:
            raise Refused(said.getvalue().strip().splitlines()[-1]) from None
        return None


def _runs(args: argparse.Namespace, command: Command) -> bool:
    """Whether the line needs only files of the repository (or the folder init wrote)."""
    return command.words[1] in OFFLINE and not command.changed and not getattr(args, "index", None)


@pytest.mark.parametrize("command", KIMI, ids=[c.where for c in KIMI])
def test_a_kimi_deploy_line_of_the_docs_parses_and_the_offline_ones_run(
    command: Command, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    words = _resolved(command, tmp_path)
    try:
        args = _parsed(words)
    except Refused as exc:
        pytest.fail(f"{command.where}: kimi-deploy refuses {' '.join(command.words[1:])!r}: {exc}")
    if args is None or not _runs(args, command):
        return
    if command.words[1] == "init":
        monkeypatch.chdir(tmp_path)  # ``init mysite`` writes into a new folder of its own
    elif command.site is not None:
        assert not command.site.startswith("elsewhere"), f"{command.where}: runs in {command.site}"
        site = tmp_path / command.site
        main(["init", str(site)])
        monkeypatch.chdir(site)
    else:
        monkeypatch.chdir(ROOT)
    capsys.readouterr()
    code = main(words)
    said = capsys.readouterr()
    assert code == 0, f"{command.where}: {' '.join(command.words)} exited {code}: {said.err[-2000:]}"


def _deploy_problems(command: Command, inventory: str, deploys: list[str], options: list[str]) -> list[str]:
    """What is wrong with running ``deploys`` on ``inventory`` with pyinfra's ``options``: files
    that do not exist, deploys not of the package, flags pyinfra lacks, host data nobody reads."""
    written = starter_files() if command.site is not None else {}
    inventory = PROD if inventory == "INVENTORY" else inventory
    problems = [] if deploys else ["names no deploy file"]
    for path in (inventory, *deploys):
        if not ((ROOT / path).is_file() or path in written):
            problems.append(f"{path}: no such file")
    for deploy in deploys:
        if not deploy.startswith("deploys/") or not (DEPLOYS / Path(deploy).name).is_file():
            problems.append(f"{deploy}: not a deploy of kimi_pyinfra")
    flags = [w.split("=", 1)[0] for w in options if w.startswith("-")]
    unknown = [f for f in flags if re.sub(r"^-v+$", "-v", f) not in PYINFRA_FLAGS]
    if unknown:
        problems.append(f"pyinfra has no {', '.join(unknown)}")
    data = [options[i + 1].split("=", 1)[0] for i, w in enumerate(options[:-1]) if w == "--data"]
    foreign = [key for key in data if key.startswith("kimi_") and key not in HostVars.model_fields]
    if foreign:
        problems.append(f"kimi-deploy reads no host data {', '.join(foreign)}")
    return problems


@pytest.mark.parametrize("command", PYINFRA, ids=[c.where for c in PYINFRA])
def test_a_pyinfra_line_of_the_docs_runs_a_deploy_of_the_package_on_an_inventory_that_exists(command: Command) -> None:
    inventory, *rest = command.words[1:]
    deploys = [w for w in rest if w.endswith(".py")]
    problems = _deploy_problems(command, inventory, deploys, [w for w in rest if w not in deploys])
    assert not problems, f"{command.where}: {'; '.join(problems)}"


@pytest.mark.parametrize("command", CONVERGE, ids=[c.where for c in CONVERGE])
def test_a_converge_line_of_the_docs_runs_a_deploy_of_the_package_with_pyinfras_options(command: Command) -> None:
    assert len(command.words) > 2, f"{command.where}: names no inventory"
    inventory, *rest = command.words[2:]
    name = rest[rest.index("--deploy") + 1] if "--deploy" in rest else "kimi"
    options = [w for i, w in enumerate(rest) if w != "--deploy" and (i == 0 or rest[i - 1] != "--deploy")]
    problems = _deploy_problems(command, inventory, [f"deploys/{name}.py"], options)
    assert not problems, f"{command.where}: {'; '.join(problems)}"


@pytest.mark.parametrize("command", PYTHON, ids=[c.where for c in PYTHON])
def test_a_python_line_of_the_docs_runs_a_file_of_the_repository(command: Command) -> None:
    assert (ROOT / command.words[1]).is_file(), f"{command.where}: {command.words[1]}: no such file"


def test_the_readme_quick_start_is_one_block_of_the_commands_an_operator_runs() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "<!-- quick-start -->\n```sh\n" in text
    block = text.split("<!-- quick-start -->\n```sh\n", 1)[1].split("\n```", 1)[0]
    firsts = [" ".join(line.split("#", 1)[0].split()[:2]) for line in block.splitlines()]
    assert firsts == [
        "python3 -m",
        "pip install",
        "kimi-deploy init",
        "$EDITOR inventories/prod.py",
        "kimi-deploy lock",
        "kimi-deploy validate",
        "kimi-deploy converge",
        "kimi-deploy converge",
        "kimi-deploy status",
    ]
    # the wheel it names is the one this version builds
    assert f"dist/kimi_deploy-{__version__}-py3-none-any.whl" in block


def test_the_readme_test_command_is_scripts_test() -> None:
    # .ci/run runs exactly the block after the marker
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.split("<!-- test-command -->\n", 1)[1].startswith("```sh\nscripts/test\n```\n")


def test_the_docs_show_commands_of_every_kind_the_checks_cover() -> None:
    # the extraction itself: an empty list would pass every test above
    subcommands = {c.words[1] for c in KIMI if len(c.words) > 1}
    assert {"plan", "validate", "ledger", "lock", "facts", "init", "cluster", "converge", "status"} <= subcommands
    assert {Path(w).stem for c in PYINFRA for w in c.words if w.startswith("deploys/")} == {
        p.stem for p in DEPLOYS.glob("*.py") if not p.name.startswith("_")
    }


def _one(line: str, tmp: Path) -> Command:
    """The one command of a page holding ``line`` in an sh block."""
    doc = tmp / "doc.md"
    doc.write_text(f"# a page\n\n```sh\n{line}\n```\n", encoding="utf-8")
    (command,) = commands(tmp, doc)
    return command


@pytest.mark.parametrize(
    ("line", "refusal"),
    [
        ("kimi-deploy plan RECIPE INVENTORY --no-such-flag", "unrecognized arguments: --no-such-flag"),
        ("kimi-deploy deploy INVENTORY", "invalid choice: 'deploy'"),
        ("kimi-deploy cluster up --hots 4", "unrecognized arguments: --hots 4"),
    ],
)
def test_a_doc_naming_a_subcommand_or_flag_kimi_deploy_lacks_fails(line: str, refusal: str, tmp_path: Path) -> None:
    command = _one(line, tmp_path)
    with pytest.raises(Refused, match=refusal):
        _parsed(_resolved(command, tmp_path))


@pytest.mark.parametrize(
    ("line", "refusal"),
    [
        ("pyinfra INVENTORY deploys/nope.py -y", "deploys/nope.py: no such file"),
        ("pyinfra inventories/nope.py deploys/kimi.py -y", "inventories/nope.py: no such file"),
        ("pyinfra INVENTORY deploys/kimi.py --yes-please", "pyinfra has no --yes-please"),
        ("pyinfra INVENTORY deploys/kimi.py --data kimi_verfy=full", "kimi-deploy reads no host data kimi_verfy"),
        ("kimi-deploy converge INVENTORY --deploy nope", "deploys/nope.py: no such file"),
        ("kimi-deploy converge INVENTORY --dryy", "pyinfra has no --dryy"),
    ],
)
def test_a_doc_naming_a_deploy_file_or_pyinfra_flag_that_does_not_exist_fails(
    line: str, refusal: str, tmp_path: Path
) -> None:
    command = _one(line, tmp_path)
    test = (
        test_a_converge_line_of_the_docs_runs_a_deploy_of_the_package_with_pyinfras_options
        if command.words[1:2] == ("converge",)
        else test_a_pyinfra_line_of_the_docs_runs_a_deploy_of_the_package_on_an_inventory_that_exists
    )
    with pytest.raises(AssertionError, match=refusal):
        test(command)


_LINK = re.compile(r"\]\(([^)#\s]+)(?:#([^)\s]*))?\)")


def _anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings, as GitHub makes them."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", page.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_link_of_a_doc_to_a_file_of_the_repository_resolves(doc: Path) -> None:
    broken = []
    for target, anchor in _LINK.findall(doc.read_text(encoding="utf-8")):
        if "://" in target or target.startswith("mailto:"):
            continue
        page = doc.parent / target
        if not page.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and page.suffix == ".md" and anchor not in _anchors(page):
            broken.append(f"{target}#{anchor} (no such heading)")
    assert not broken, f"{doc.relative_to(ROOT)}: links to {', '.join(broken)}"


def test_the_docs_index_lists_every_page() -> None:
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    listed = {target for target, _ in _LINK.findall(index)}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages <= listed, f"docs/index.md does not list {', '.join(sorted(pages - listed))}"
