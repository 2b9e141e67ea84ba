"""The manifests the controller holds, one per compile cache: the digests a host's copy must match.

A compile cache is code the engines run, made by a host at run time, so there is no lock beside the
recipe to hold it by; the controller keeps what it accepted instead, in
``$XDG_STATE_HOME/kimi-deploy/compile-caches/<unit>-<key>.json`` (else ``~/.local/state/...``):
the manifest a host of one of its runs packed, the host it chose to compile (or, on a controller
that holds none, the first host of the run that holds one whole: it is taken once, then held).
Every other host of the key receives exactly those bytes, verified file by file as they arrive; a
host whose artifact differs is neither a source nor given to its engine.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from kimi_deploy.controller_dirs import controller_state
from kimi_deploy.hostside.compile_cache_found import manifest_digest
from kimi_deploy.hostside.requests import Lock
from kimi_deploy.hostside.revision_files import CACHE_BYTES


def state_dir(environ: Mapping[str, str]) -> Path:
    """Where the controller keeps the manifests it holds (``environ``: the controller's environment)."""
    return controller_state(environ) / "compile-caches"


class Pins:
    """The manifests held, by artifact folder name (``<unit>-<key>``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def get(self, name: str) -> Lock | None:
        """The manifest held for ``name``; None when none is (or what is there is not one)."""
        try:
            with open(self.folder / f"{name}.json", "rb") as f:
                data = json.loads(f.read(CACHE_BYTES))
        except (OSError, ValueError):
            return None
        manifest = data.get("manifest") if isinstance(data, dict) else None
        return manifest if isinstance(manifest, dict) and data.get("digest") == manifest_digest(manifest) else None

    def put(self, name: str, manifest: Lock, source: str) -> None:
        """Hold ``manifest`` for ``name``, as ``source`` (a host) packed or held it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        data = {"manifest": dict(manifest), "digest": manifest_digest(dict(manifest)), "source": source}
        tmp = self.folder / f".{name}.json.tmp"
        tmp.write_text(json.dumps(data, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.folder / f"{name}.json")


def pins(environ: Mapping[str, str]) -> Pins:
    """The controller's pins (``environ``: the controller's environment)."""
    return Pins(state_dir(environ))
