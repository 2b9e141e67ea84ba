"""The shell command that runs one of ``hostside/`` with a host's Python, in one round-trip.

A host program travels alone, but may import the ``hostside.boundary_*`` modules: the checks of
everything that comes from outside the controller's own recipe (names from the Hub, texts and JSON
from peer hosts, requests to the weights peer), the same code the controller runs. ``bundle`` makes one Python
source of a program and the boundary modules it imports; that source is what a host runs, from
argv (``hostside_command``) or from a file a converge writes (the scrub).
"""

from __future__ import annotations

import ast
import base64
import functools
import hashlib
import json
import re
import shlex
import zlib
from pathlib import Path
from typing import Any

HOSTSIDE = Path(__file__).resolve().parent.parent / "hostside"
# The most the controller decodes of a host program's JSON answer (a host is outside the recipe:
# its answer goes through ``hostside.boundary_json`` like any other, on the controller's one event
# loop). The largest a real host sends is the state probe's: with 200 release records, 200 ladder
# proofs, three venvs' locks and every file of a 2,000-file model listed three times it is some
# 1.2 MB, and a run with ``--diff`` adds the text of the files that differ, 1 MiB at most
# (hostside/changed_files.py); the hardware and drivers probes' are a few KB. 8 MiB leaves that
# several times over.
ANSWER_MAX_BYTES = 8 << 20


# Runs a shipped bundle with the host's python3 under __name__ == "__main__" (hostside/boot.py:
# it keeps the compiled code on the host, so that each version of a program is compiled once);
# the bundle travels compressed and base64-encoded in argv (paths and digests only: never a
# secret): a quarter of its size, which the controller sends to every host of a run, encrypted,
# on every probe.
def _without_docstrings(source: str) -> str:
    """``source`` as it runs, less its docstrings and comments: what travels in argv is code only."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list) or len(body) < 2:  # a body of its docstring alone keeps it
            continue
        first = body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            del body[0]
    return ast.unparse(tree) + "\n"


_BOOT = _without_docstrings((HOSTSIDE / "boot.py").read_text(encoding="utf-8"))

# Registers the bundled modules as ``kimi_deploy.hostside.<name>``, then runs the program as ``__main__``.
# Every module is compiled first, through the boot's cache when run from argv (hostside/boot.py).
_LOADER = """\
import sys, types
compiled = globals().get("KIMI_COMPILE") or (lambda source, name: compile(source, name, "exec"))
codes = {"hostside/" + name + ".py": compiled(source, "hostside/" + name + ".py") for name, source in MODULES.items()}
program = compiled(PROGRAM, PATH)
globals().get("KIMI_KEEP", lambda: None)()
top = sys.modules.setdefault("kimi_deploy", types.ModuleType("kimi_deploy"))
top.__path__ = []
package = sys.modules.setdefault("kimi_deploy.hostside", types.ModuleType("kimi_deploy.hostside"))
package.__path__ = []
top.hostside = package
for name in MODULES:
    module = types.ModuleType("kimi_deploy.hostside." + name)
    module.__file__ = "hostside/" + name + ".py"
    sys.modules["kimi_deploy.hostside." + name] = module
    exec(codes[module.__file__], module.__dict__)
    setattr(package, name, module)
exec(program, {"__name__": "__main__", "__file__": PATH})
"""


# ``from kimi_deploy.hostside.X import ...`` (any indentation), ``from kimi_deploy.hostside import X, Y``
# and ``import kimi_deploy.hostside.X``: the forms a host program imports its modules by. Read line by line rather than
# parsed: the probe's command is built for every host of a run, and parsing every program's
# modules each time cost the controller 7 ms per host.
_FROM_MODULE = re.compile(r"^[ \t]*from[ \t]+kimi_deploy\.hostside\.(\w+)[ \t]+import\b", re.MULTILINE)
# (names in brackets may span lines; without, the line ends the list)
_FROM_PACKAGE = re.compile(
    r"^[ \t]*from[ \t]+kimi_deploy\.hostside[ \t]+import[ \t]+(?:\(([\w \t,\n]+)\)|([\w \t,]+))", re.MULTILINE
)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+kimi_deploy\.hostside\.(\w+)", re.MULTILINE)
# A module-level ``if TYPE_CHECKING:`` block and the indented (or blank) lines under it: what it
# imports is for type checkers (the host programs set ``TYPE_CHECKING = False``), not the bundle.
_TYPING_ONLY = re.compile(r"^if TYPE_CHECKING:[^\n]*\n(?:(?:[ \t][^\n]*)?\n)*", re.MULTILINE)


def _imported(source: str) -> list[str]:
    """The ``hostside.<name>`` modules a program's source imports when it runs."""
    source = _TYPING_ONLY.sub("", source)
    names = _FROM_MODULE.findall(source) + _IMPORT.findall(source)
    for bracketed, plain in _FROM_PACKAGE.findall(source):
        group = bracketed or plain
        names += [n.split()[0] for n in group.replace("\n", ",").split(",") if n.strip()]
    return names


def _modules(source: str, folder: Path | None = None) -> dict[str, str]:
    """Every ``hostside`` module ``source`` needs, its own imports included, dependencies first
    (from ``folder``, ``HOSTSIDE`` unless told)."""
    where = folder or HOSTSIDE
    found: dict[str, str] = {}
    seen: set[str] = set()

    def visit(text: str) -> None:
        for name in _imported(text):
            if name not in seen:
                seen.add(name)
                module = (where / f"{name}.py").read_text(encoding="utf-8")
                visit(module)
                found[name] = module

    visit(source)
    return found


def bundle(script: str) -> str:
    """``hostside/<script>`` as one self-contained Python source, with the modules it imports."""
    return _bundled(script, HOSTSIDE)


@functools.cache
def _bundled(script: str, folder: Path) -> str:
    """``bundle``, made once per run (``folder`` is ``HOSTSIDE``, here to key the cache): the
    scrub's program is rendered for every host of a run."""
    source = (folder / script).read_text(encoding="utf-8")
    modules = _modules(source, folder)
    if not modules:
        return source
    head = f"# hostside/{script} with the hostside modules it imports ({', '.join(modules)}), in one file\n"
    return f"{head}MODULES = {modules!r}\nPROGRAM = {source!r}\nPATH = {f'hostside/{script}'!r}\n{_LOADER}"


def pack(data: Any) -> str:
    """JSON, compressed and base64-encoded: one argv word, no quoting surprises."""
    return base64.b64encode(zlib.compress(json.dumps(data, sort_keys=True).encode(), 9)).decode()


# What the boot prints, alone on its first line, when it was sent a program's digest without the
# program and keeps no compiled copy of that digest (hostside/boot.py ``NOT_KEPT``).
NOT_KEPT = "kimi-boot: not kept"


class NotKept(Exception):
    """A host asked to run its kept copy of a program keeps none: send it the program."""


@functools.cache
def _shipped(python: str, script: str, folder: Path, kept: bool, isolated: bool) -> str:
    """The part of ``folder/<script>``'s command that is the same for every host (``folder`` is
    ``HOSTSIDE``, here to key the cache): made once per run, not once per host. The digest names
    the host's compiled copy (hostside/boot.py); ``kept``: the program itself stays here (``-``)."""
    source = bundle(script).encode()
    code = "-" if kept else base64.b64encode(zlib.compress(source, 6)).decode()
    digest = hashlib.sha256(source).hexdigest()[:32]
    flags = ["-I", "-S"] if isolated else []
    return " ".join([shlex.quote(python), *flags, "-c", shlex.quote(_BOOT), shlex.quote(script), digest, code])


def hostside_command(python: str, script: str, request: Any, kept: bool = False, isolated: bool = False) -> str:
    """The shell command running ``hostside/<script>`` with ``python`` on the host. ``kept``: the
    command names the program by its digest only and the host runs the compiled copy it keeps
    (some 40 KB less to send to every host, on every run), or prints ``NOT_KEPT`` and runs
    nothing; the caller then sends it whole (``NotKept``). ``isolated``: Python starts with ``-I
    -S``, without the ``PYTHON*`` environment, the user's site folder or the site module (a program
    of the standard library alone, on the host's own Python: 2 ms less of its start)."""
    return f"{_shipped(python, script, HOSTSIDE, kept, isolated)} {pack(request)}"
