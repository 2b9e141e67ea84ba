"""Rendering a host's serve spec into files: systemd units, environment files, engine configs.

Pure: returns contents; writing them to a host is an operation's job. Secret files are rendered
only when the secrets are given: a deploy's, or ``kimi-deploy plan``'s stand-ins, which it never
writes (``kimi_deploy.converge.plan.plan_converge``).

Every value a template writes goes through :func:`environment`'s checks: ``ExecStart=`` words are
quoted and escaped by systemd's rules (``exec_start``, ``systemd_word`` filters), environment
file values by its environment file rules (:func:`env_value`), JSON by ``tojson``; any other value
holding a control character is refused (``ConfigError`` naming the file), whatever validation let
through, since it would start a line of its own.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from kimi_deploy.errors import ConfigError
from kimi_deploy.hostside.boundary_text import control_char, shown
from kimi_deploy.hostside.host_dirs import STATE_DIR
from kimi_deploy.plan.servespec import HostPlan, Unit
from kimi_deploy.recipe import Recipe
from kimi_deploy.releases.host_paths import unit_cache_dir
from kimi_deploy.render.credentials import CredentialPath
from kimi_deploy.render.nginx_quote import nginx_string
from kimi_deploy.render.template_cache import bytecode_cache

# templates/ of a checkout; an installed package carries them as kimi_deploy/templates
_HERE = Path(__file__).resolve().parent.parent
TEMPLATES = _HERE / "templates" if (_HERE / "templates").is_dir() else _HERE.parent / "templates"
UNIT_DIR = "/etc/systemd/system"

_SAFE = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")
_UNIT_TEMPLATE = {
    "engine": "engine.service.j2",
    "router": "cpu.service.j2",
    "mooncake-master": "cpu.service.j2",
    "gateway": "cpu.service.j2",
}


@dataclass(frozen=True)
class RenderedFile:
    """One file for a host. Its repr leaves the content out: pyinfra prints operation arguments
    (``--json``, verbose output), and a file may hold a secret."""

    path: str
    content: str = field(repr=False)
    mode: int
    owner: str
    secret: bool = False
    # why its content is a stand-in (``kimi-deploy plan`` found no lock for the request it holds);
    # empty in a converge, which refuses to run without what it would hold
    withheld: str = ""

    @functools.cached_property
    def sha256(self) -> str:
        """The content's digest, as the host probe reports a file it read (once per file: a
        converge compares it in several places)."""
        return hashlib.sha256(self.content.encode()).hexdigest()

    def group(self, readers: str) -> str:
        """The file's group on the host: ``readers`` (the engine user's group) for a secret its
        group may read (the weights transfer key, read by the peer service), else root."""
        return readers if self.secret and self.mode & 0o040 else "root"

    def owner_mode(self, readers: str) -> str:
        """``owner:group:octal mode`` as the host probe reports a file (``hostside/state_probe.py``)."""
        return f"{self.owner}:{self.group(readers)}:{self.mode:o}"


def systemd_word(arg: str) -> str:
    """One ExecStart word, which systemd reads back as ``arg``: specifiers (``%``) and variables
    (``$``) doubled, quoted when it is not plain, ``\\`` and ``"`` escaped inside double quotes.
    A control character has no quoting that keeps it on its line: the template filters refuse it."""
    if isinstance(arg, CredentialPath):
        return arg  # systemd's %d (the unit's credentials directory), made only by code
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if _SAFE.fullmatch(arg):
        return escaped
    if "'" not in arg and "\\" not in arg:
        # JSON values read best in single quotes, where double quotes need no escape.
        return "'" + escaped + "'"
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_start(argv: tuple[str, ...]) -> str:
    """``ExecStart=`` value: the command, then one flag (with its values) per continued line."""
    lines: list[list[str]] = [[]]
    for word in argv:
        if word.startswith("-") and lines[-1]:
            lines.append([])
        lines[-1].append(systemd_word(word))
    return " \\\n    ".join(" ".join(line) for line in lines)


def env_value(value: str) -> str:
    """An EnvironmentFile value, double-quoted when it is not plain, ``\\`` and ``"`` escaped in the
    quotes (systemd expands neither ``$`` nor ``%`` in such a file). A control character stays in
    the result, for the templates' check to refuse with the file's name."""
    if _SAFE.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _Escaped(str):
    """A filter's output, escaped for the line it is written on (an ExecStart= value continues over
    lines of its own making): written as it is."""


def _where(context: jinja2.runtime.Context) -> str:
    path = context.get("path")
    return str(path) if path else f"templates/{context.name}"


def _words_fit(context: jinja2.runtime.Context, words: Sequence[str]) -> None:
    for number, word in enumerate(words):
        char = control_char(str(word))
        if char:
            raise ConfigError(
                _where(context),
                "ExecStart",
                f"argument {number} holds control character {char}, which no quoting keeps on its line, "
                f"found {shown(word)}",
            )


@jinja2.pass_context
def _exec_start_filter(context: jinja2.runtime.Context, argv: Sequence[str]) -> str:
    # systemd reads the first word's prefixes (+, !, -, @, :) after unquoting, expands no variable
    # in it and refuses quotes and backslashes in it: an absolute path without those reads back.
    if not argv or not str(argv[0]).startswith("/") or set(str(argv[0])) & set("$\"'\\"):
        rule = "the command must be an absolute path without '$', quotes or backslashes"
        raise ConfigError(_where(context), "ExecStart", f"{rule}, found {shown(argv)}")
    _words_fit(context, argv)
    return _Escaped(exec_start(tuple(argv)))


@jinja2.pass_context
def _word_filter(context: jinja2.runtime.Context, word: str) -> str:
    _words_fit(context, [word])
    return _Escaped(systemd_word(word))


@jinja2.pass_context
def _nginx_filter(context: jinja2.runtime.Context, value: object) -> str:
    try:
        return _Escaped(nginx_string(str(value)))
    except ValueError as exc:
        raise ConfigError(_where(context), "", str(exc)) from None


@jinja2.pass_context
def _checked(context: jinja2.runtime.Context, value: Any) -> Any:
    """Every ``{{ value }}`` a template writes: escaped output as it is, anything else refused when
    it holds a control character. The value itself stays out of the message (it may be a secret)."""
    if isinstance(value, (_Escaped, Markup)):  # the filters above; tojson
        return value
    char = control_char(str(value))
    if char:
        raise ConfigError(
            _where(context), "", f"a value holds control character {char}, which would start a line of its own"
        )
    return value


@functools.cache
def environment() -> jinja2.Environment:
    """The templates' environment: ``exec_start``, ``systemd_word`` and ``nginx`` filters, every
    value checked. One per process: it compiles each template once, not once per host (and, after
    ``keep_compiled``, keeps what it compiled for the next run)."""
    jinja = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - unit and config files, not HTML
        finalize=_checked,
    )
    jinja.filters["exec_start"] = _exec_start_filter
    jinja.filters["systemd_word"] = _word_filter
    jinja.filters["nginx"] = _nginx_filter
    jinja.filters["sha256"] = lambda text: hashlib.sha256(str(text).encode()).hexdigest()
    return jinja


def keep_compiled(environ: Mapping[str, str]) -> None:
    """From now on in this process, templates are compiled once and kept in the controller's cache
    folder for the runs after it (``template_cache``; ``environ``: the controller's environment)."""
    jinja = environment()
    if jinja.bytecode_cache is None:
        jinja.bytecode_cache = bytecode_cache(environ)


def _unit_env(unit: Unit) -> list[tuple[str, str]]:
    state = f"{STATE_DIR}/{unit.name}"
    env = {"HOME": state, "XDG_CACHE_HOME": unit_cache_dir(unit.name), **unit.env}
    return [(k, env_value(v)) for k, v in sorted(env.items())]


def render_host(recipe: Recipe, plan: HostPlan, secrets: Mapping[str, str] | None = None) -> list[RenderedFile]:
    """Every file ``plan``'s host needs. ``secrets`` maps a secret's name (``VLLM_API_KEY``,
    ``api-key``) to its value; without it, secret files are left out."""
    jinja = environment()
    user = recipe.paths.user
    config = recipe.paths.config
    out: list[RenderedFile] = []
    local = {u.name for u in plan.units}
    for unit in plan.units:
        env_file = f"{config}/{unit.name}.env"
        secret_env_file = f"{config}/secrets/{unit.name}.env"
        unit_path = f"{UNIT_DIR}/{unit.name}.service"
        # Units on the same host start after the ones of an earlier stage (Mooncake master first).
        after = [u.name for u in plan.units if u.stage < unit.stage and u.name in local]
        common = {"plan": plan, "unit": unit, "user": user}
        out.append(
            RenderedFile(
                unit_path,
                jinja.get_template(_UNIT_TEMPLATE[unit.kind]).render(
                    path=unit_path,
                    env_file=env_file,
                    secret_env_file=secret_env_file,
                    argv=unit.argv,
                    after=after,
                    **common,
                ),
                0o644,
                "root",
            )
        )
        out.append(
            RenderedFile(
                env_file,
                jinja.get_template("unit.env.j2").render(path=env_file, env=_unit_env(unit), **common),
                0o644,
                "root",
            )
        )
        for path, cfg in sorted(unit.files.items()):
            out.append(RenderedFile(path, jinja.get_template(cfg.template).render(**cfg.data), 0o644, "root"))
        if secrets is None:
            continue
        if unit.secret_env:
            values = [(k, env_value(secrets[k])) for k in unit.secret_env]
            out.append(
                RenderedFile(
                    secret_env_file,
                    jinja.get_template("secrets.env.j2").render(path=secret_env_file, secrets=values, **common),
                    0o600,
                    "root",
                    secret=True,
                )
            )
        for path, template in sorted(unit.secret_files.items()):
            out.append(
                RenderedFile(
                    path,
                    jinja.get_template(template).render(path=path, secrets_map=secrets, **common),
                    0o600,
                    "root",
                    secret=True,
                )
            )
    return out
