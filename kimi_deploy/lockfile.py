"""Lock files: every file of a pinned model revision with its size and digest.

``recipes/locks/<org>--<name>@<revision>.json``::

    {"repo": "org/name", "revision": "<40-hex>", "total_bytes": N,
     "files": {"model-00001-of-00096.safetensors": {"size": N, "digest": "sha256:<hex>"},
               "config.json": {"size": N, "digest": "gitblob:<hex>"}}}

LFS files carry their sha256 (the Hub's LFS object id); small files carry git's blob id, which is
what the Hub publishes for them. Both are checked on the host after every download.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from kimi_deploy.errors import ConfigError
from kimi_deploy.recipe import Recipe

LOCK_DIR = "recipes/locks"
_DIGEST = re.compile(r"^(sha256:[0-9a-f]{64}|gitblob:[0-9a-f]{40})$")


@dataclass(frozen=True)
class LockedFile:
    size: int
    digest: str


@dataclass(frozen=True)
class Lock:
    repo: str
    revision: str
    files: dict[str, LockedFile]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def to_json(self) -> str:
        data = {
            "repo": self.repo,
            "revision": self.revision,
            "total_bytes": self.total_bytes,
            "files": {p: {"size": f.size, "digest": f.digest} for p, f in sorted(self.files.items())},
        }
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    def compact(self) -> dict[str, list[object]]:
        """``{path: [size, digest]}``: what the host-side programs read."""
        return {p: [f.size, f.digest] for p, f in sorted(self.files.items())}


def lock_path(recipe: Recipe, base: Path | None = None) -> Path:
    name = f"{recipe.model.dir_name}@{recipe.model.revision}.json"
    return (base or Path(".")) / LOCK_DIR / name


def read_lock(recipe: Recipe, base: Path | None = None) -> Lock:
    """The lock of the recipe's pinned revision; ``ConfigError`` when absent or malformed."""
    path = lock_path(recipe, base)
    shown = str(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            shown,
            "",
            f"no lock for {recipe.model.repo}@{recipe.model.revision}: run `kimi-deploy lock RECIPE`",
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(shown, "", f"unreadable lock: {exc}") from None
    if data.get("repo") != recipe.model.repo or data.get("revision") != recipe.model.revision:
        raise ConfigError(shown, "repo", f"lock is for {data.get('repo')}@{data.get('revision')}")
    files: dict[str, LockedFile] = {}
    for rel, entry in (data.get("files") or {}).items():
        size, digest = entry.get("size"), entry.get("digest")
        if not isinstance(size, int) or size < 0 or not isinstance(digest, str) or not _DIGEST.match(digest):
            raise ConfigError(shown, f"files.{rel}", f"expected size and sha256:/gitblob: digest, found {entry}")
        files[rel] = LockedFile(size, digest)
    if not files:
        raise ConfigError(shown, "files", "lock names no file")
    return Lock(repo=data["repo"], revision=data["revision"], files=files)
