"""What a compile cache is keyed by, and where a host keeps the one of a key.

An engine compiles kernels for one engine release, one model, one launch (its flags and
environment: the parallel layout, the context length, the dtype), one rank of that layout and one
kind of device with its driver; a cache made for another of any of these is not the right code.
The key is the digest of all of it, computed by the controller from the plan alone, so every host
of a topology that would compile the same code has the same key, whatever its address: the host's
own address, its leader's and its store's are the only words of a launch that differ between such
hosts, and they are taken out before the digest. The engine's own hash (vLLM's subfolder of its
``torch_compile_cache``) is kept inside the artifact, a second check by the engine itself.

Where an engine's ranks share one cache (``Engine.compile_cache_ranks`` ``"shared"``: JAX's
persistent compilation cache, which every process of a multi-host job reads and process 0 alone
writes), the rank is not in the key: the node and data-parallel rank are left out, the words of the
launch that name the rank (``--node-rank N``, ``kimi_deploy.engines.common.dist_init_flags``) read
``<rank>``, and the addresses of the instance's hosts, its own and its leader's, one placeholder,
so every rank of an instance, and every instance of the same launch, has one key.

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
from typing import Literal

from kimi_deploy.plan.placement import Placement

# Whether each rank of an instance compiles and keeps a cache of its own ("each": a key per node and
# data-parallel rank), or every rank reads the one cache that rank 0 writes ("shared": one key for
# every rank of the launch).
CacheRanks = Literal["each", "shared"]

# Where a host keeps the compile caches it made or received (root's; the engines read them).
CACHES_ROOT = "/var/lib/kimi/compile-caches"
# The key's digest in a folder's name: 128 bits of sha256.
KEY_HEX = 32
# What a host-specific word of a launch becomes in the key.
_SELF, _LEADER, _STORE = "<self>", "<leader>", "<store>"
# ... and, where the ranks share a cache, an address of the instance's hosts and the rank.
_HOST, _RANK = "<host>", "<rank>"
# The flags whose value is the host's rank in its instance (``kimi_deploy.engines.common.dist_init_flags``).
_RANK_FLAGS = ("--node-rank",)


@dataclass(frozen=True)
class CacheKey:
    """Everything a compiled kernel depends on that the plan knows."""

    engine: str
    release: str  # the release folder's name: the version and every pinned package
    checkpoints: Mapping[str, str]  # role -> repo@revision
    argv: tuple[str, ...]  # the launch, host addresses taken out
    env: Mapping[str, str]  # the unit's environment, host addresses taken out
    node_rank: int | None  # None: the ranks share one cache
    dp_start_rank: int | None
    device: str  # accelerator vendor, model and count per host
    driver: str  # the pinned drivers

    def digest(self) -> str:
        """The key's digest: sha256 of its fields as canonical JSON, the first ``KEY_HEX`` hex digits."""
        fields = asdict(self)
        fields["checkpoints"] = dict(sorted(self.checkpoints.items()))
        fields["env"] = dict(sorted(self.env.items()))
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:KEY_HEX]


def host_neutral(word: str, placement: Placement, ranks: CacheRanks = "each") -> str:
    """``word`` with this host's address, its leader's and its store's replaced by placeholders:
    the same launch on another host of the same rank reads the same. Where the ranks share a cache
    (``ranks`` ``"shared"``), this host's address and its leader's are one placeholder: the same
    launch on any host of any instance reads the same."""
    if ranks == "shared":
        found = {placement.host.address: _HOST, placement.leader.address: _HOST}
    else:
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


def rank_neutral(argv: tuple[str, ...], placement: Placement) -> tuple[str, ...]:
    """``argv`` with the value of each flag that names this host's rank in its instance
    (``--node-rank N`` or ``--node-rank=N``) replaced by a placeholder."""
    rank = str(placement.node_rank)
    out = list(argv)
    for i, word in enumerate(out):
        if word in _RANK_FLAGS and i + 1 < len(out) and out[i + 1] == rank:
            out[i + 1] = _RANK
        elif any(word == f"{flag}={rank}" for flag in _RANK_FLAGS):
            out[i] = f"{word.split('=', 1)[0]}={_RANK}"
    return tuple(out)


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
    ranks: CacheRanks = "each",
) -> CacheKey:
    """The key of the cache ``placement``'s engine compiles with this launch (``ranks``: whether
    its ranks each keep a cache of their own or share one, ``Engine.compile_cache_ranks``)."""
    shared = ranks == "shared"
    words = rank_neutral(argv, placement) if shared else argv
    return CacheKey(
        engine=engine,
        release=release,
        checkpoints=dict(checkpoints),
        argv=tuple(host_neutral(w, placement, ranks) for w in words),
        env={k: host_neutral(v, placement, ranks) for k, v in env.items()},
        node_rank=None if shared else placement.node_rank,
        dp_start_rank=None if shared else placement.dp_start_rank,
        device=device,
        driver=driver,
    )


def artifact_dir(unit: str, key: CacheKey) -> str:
    """The folder a host keeps the cache of ``key`` in, for the unit named ``unit``."""
    return f"{CACHES_ROOT}/{unit}-{key.digest()}"
