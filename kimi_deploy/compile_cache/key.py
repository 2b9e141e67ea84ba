"""What a compile cache is keyed by, and where a host keeps the one of a key.

An engine compiles kernels for one engine release, one model, one launch (its flags and
environment: the parallel layout, the context length, the dtype), one rank of that layout and one
kind of device with its driver; a cache made for another of any of these is not the right code.
The key is the digest of all of it, computed by the controller from the plan alone, so every host
of a topology that would compile the same code has the same key, whatever its address: the host's
own address, its leader's and its store's are the only words of a launch that differ between such
hosts, and they are taken out before the digest. The engine's own hash (vLLM's subfolder of its
``torch_compile_cache``) is kept inside the artifact, a second check by the engine itself.

The artifact of a key lives at ``/var/lib/kimi/compile-caches/<unit>-<key>``: written by root only,
files 0644 and folders 0755, verified against a manifest whose every digest the controller holds.
Before the engine starts, its files are copied into the engine's own cache folder, which the engine
may write: vLLM 0.32.0 writes its cache again at a start that found it (its AOT load fails on CPU and
it saves what it compiled anew), and refuses to start over a read-only one. The engine changes its
copy, never the artifact, which is what the host serves to others.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from kimi_deploy.plan.placement import Placement

# Where a host keeps the compile caches it made or received (root's; the engines read them).
CACHES_ROOT = "/var/lib/kimi/compile-caches"
# The key's digest in a folder's name: 128 bits of sha256.
KEY_HEX = 32
# What a host-specific word of a launch becomes in the key.
_SELF, _LEADER, _STORE = "<self>", "<leader>", "<store>"


@dataclass(frozen=True)
class CacheKey:
    """Everything a compiled kernel depends on that the plan knows."""

    engine: str
    release: str  # the release folder's name: the version and every pinned package
    checkpoints: Mapping[str, str]  # role -> repo@revision
    argv: tuple[str, ...]  # the launch, host addresses taken out
    env: Mapping[str, str]  # the unit's environment, host addresses taken out
    node_rank: int
    dp_start_rank: int
    device: str  # accelerator vendor, model and count per host
    driver: str  # the pinned drivers

    def digest(self) -> str:
        """The key's digest: sha256 of its fields as canonical JSON, the first ``KEY_HEX`` hex digits."""
        fields = asdict(self)
        fields["checkpoints"] = dict(sorted(self.checkpoints.items()))
        fields["env"] = dict(sorted(self.env.items()))
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:KEY_HEX]


def host_neutral(word: str, placement: Placement) -> str:
    """``word`` with this host's address, its leader's and its store's replaced by placeholders:
    the same launch on another host of the same rank reads the same."""
    found = {
        placement.host.address: _SELF,
        placement.leader.address: _SELF if placement.leader.address == placement.host.address else _LEADER,
    }
    if placement.store_address:
        found[placement.store_address] = _STORE
    for address, placeholder in sorted(found.items(), key=lambda kv: -len(kv[0])):
        if address:
            word = word.replace(address, placeholder)
    return word


def cache_key(
    *,
    engine: str,
    release: str,
    checkpoints: Mapping[str, str],
    argv: tuple[str, ...],
    env: Mapping[str, str],
    placement: Placement,
    device: str,
    driver: str,
) -> CacheKey:
    """The key of the cache ``placement``'s engine compiles with this launch."""
    return CacheKey(
        engine=engine,
        release=release,
        checkpoints=dict(checkpoints),
        argv=tuple(host_neutral(w, placement) for w in argv),
        env={k: host_neutral(v, placement) for k, v in env.items()},
        node_rank=placement.node_rank,
        dp_start_rank=placement.dp_start_rank,
        device=device,
        driver=driver,
    )


def artifact_dir(unit: str, key: CacheKey) -> str:
    """The folder a host keeps the cache of ``key`` in, for the unit named ``unit``."""
    return f"{CACHES_ROOT}/{unit}-{key.digest()}"
