"""Rendering a host's serve spec into files: systemd units, environment files, engine configs.

Pure: returns contents; writing them to a host is an operation's job. Secret files are rendered
only when the secrets are given (by a deploy), never by ``kimi-deploy plan --render``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from kimi_deploy.recipe import Recipe
from kimi_deploy.servespec import HostPlan, Unit

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
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

    @property
    def sha256(self) -> str:
        """The content's digest, as the host probe reports a file it read."""
        return hashlib.sha256(self.content.encode()).hexdigest()


def systemd_word(arg: str) -> str:
    """One ExecStart word: specifiers and variables escaped, quoted when it is not plain."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if _SAFE.match(arg):
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
    """An EnvironmentFile value, double-quoted when it is not plain."""
    if _SAFE.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - unit and config files, not HTML
    )


def _unit_env(unit: Unit) -> list[tuple[str, str]]:
    state = f"/var/lib/kimi/{unit.name}"
    env = {"HOME": state, "XDG_CACHE_HOME": f"/var/cache/kimi/{unit.name}", **unit.env}
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
                    exec_start=exec_start(unit.argv),
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
                    user,
                    secret=True,
                )
            )
        for path, template in sorted(unit.secret_files.items()):
            out.append(
                RenderedFile(
                    path,
                    jinja.get_template(template).render(path=path, secrets_map=secrets, **common),
                    0o600,
                    user,
                    secret=True,
                )
            )
    return out
