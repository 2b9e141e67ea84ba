"""A tiny, byte-for-byte reproducible stand-in for the Kimi K3.1 Pro Hub repo, written for ``localcluster.hub``.

``build(root)`` writes repo ``moonshotai/Kimi-K3.1-Pro-Tiny`` under ``root`` at two commits:

* commit A (tag ``v1``): configs, tokenizer, ``README.md``, ``LICENSE``, ``model.safetensors.index.json`` and
  96 real safetensors shards ``model-000NN-of-00096.safetensors`` (1: embeddings, 2..95: one layer each,
  96: final norm and LM head);
* commit B (branch ``main``, child of A): shards 7, 57 and 90 hold other bytes (same sizes), ``config.json``
  changes, ``extra_b.json`` is added and ``README.md`` is removed.

Every byte is derived from fixed seeds (SHAKE-256), and ids are real git object ids (blob, tree, commit with
fixed author and dates), so the same ``shard_bytes`` gives the same commit ids on every run and machine.
``*.safetensors`` files are LFS files: their git blob is the LFS pointer and their LFS oid is the sha256.

On-disk layout (what ``localcluster.hub`` serves)::

    root/objects/<sha256>                           every file's content, stored once
    root/repos/<org>/<name>/refs.json               {"branches": {name: sha}, "tags": {name: sha}}
    root/repos/<org>/<name>/commits/<sha>.json      one manifest per commit (see ``_manifest``)
    root/repos/<org>/<name>/info.json               ``RepoInfo`` as JSON, plus the build parameters

Run ``python -m localcluster.tiny_model --root DIR [--shard-bytes N]`` to build and print the commit ids.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ID = "moonshotai/Kimi-K3.1-Pro-Tiny"
SHARDS = 96
DEFAULT_SHARD_BYTES = 64 * 1024
# Shards whose bytes commit B replaces.
CHANGED_SHARDS = (7, 57, 90)
# Bump when the generated content changes on purpose: it is part of the idempotency check.
FORMAT = 1

HIDDEN = 32  # one MXFP4 block (32 values) per expert row: blocks are [experts, rows, 16] bytes
EXPERTS = 8
VOCAB = 320  # 256 byte tokens, 7 special tokens, padding
LAYERS = SHARDS - 2
SPECIAL_TOKENS = ("[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>")

AUTHOR = "kimi-deploy <kimi-deploy@localcluster.invalid>"
# Fixed commit times (UTC) so commit ids do not depend on when the repo is built.
TIME_A = 1767225600  # 2026-01-01T00:00:00Z
TIME_B = 1771545600  # 2026-02-20T00:00:00Z

_NOISE_BLOCK = 4 << 20
_DTYPE_BYTES = {"BF16": 2, "U8": 1, "F32": 4}


@dataclass(frozen=True)
class FileEntry:
    """One file at one commit. ``sha256`` is of the content (the LFS oid for LFS files); ``git_blob_sha1`` is
    the git blob id (of the content, or of the LFS pointer when ``is_lfs``)."""

    size: int
    sha256: str
    git_blob_sha1: str
    is_lfs: bool


@dataclass(frozen=True)
class RepoInfo:
    """What a test or a lock needs: ``commits`` maps "a"/"b" to commit ids, ``files`` maps a commit id to
    its files, ``refs`` maps branch and tag names to commit ids."""

    repo_id: str
    commits: dict[str, str]
    files: dict[str, dict[str, FileEntry]]
    refs: dict[str, str] = field(default_factory=dict)


# ---- git object ids -------------------------------------------------------------------------------


def git_blob_sha1(data: bytes) -> str:
    """git's blob id of ``data`` (what ``git hash-object`` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file that git stores in place of an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _git_object(kind: bytes, body: bytes) -> str:
    return hashlib.sha1(kind + b" %d\0" % len(body) + body, usedforsecurity=False).hexdigest()


def tree_ids(blobs: dict[str, str]) -> dict[str, str]:
    """git tree ids of every directory ("" is the root) for files ``{path: blob id}``, all mode 100644."""
    nested: dict[str, Any] = {}
    for path, oid in blobs.items():
        *dirs, name = path.split("/")
        node = nested
        for d in dirs:
            node = node.setdefault(d, {})
        node[name] = oid
    ids: dict[str, str] = {}

    def walk(node: dict[str, Any], where: str) -> str:
        body = b""
        # git orders entries by name, comparing a directory as if its name ended with "/".
        for name in sorted(node, key=lambda n: n + "/" if isinstance(node[n], dict) else n):
            child = node[name]
            if isinstance(child, dict):
                sub = walk(child, f"{where}/{name}" if where else name)
                body += b"40000 " + name.encode() + b"\0" + bytes.fromhex(sub)
            else:
                body += b"100644 " + name.encode() + b"\0" + bytes.fromhex(child)
        ids[where] = _git_object(b"tree", body)
        return ids[where]

    walk(nested, "")
    return ids


def commit_id(tree: str, parents: list[str], when: int, message: str) -> str:
    """git's commit id for a commit by ``AUTHOR`` at ``when`` (UTC)."""
    lines = [f"tree {tree}", *(f"parent {p}" for p in parents)]
    lines += [f"author {AUTHOR} {when} +0000", f"committer {AUTHOR} {when} +0000", "", message]
    return _git_object(b"commit", ("\n".join(lines) + "\n").encode())


# ---- content --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = _DTYPE_BYTES[self.dtype]
        for dim in self.shape:
            count *= dim
        return count


def _noise(seed: str, size: int) -> Iterator[bytes]:
    """``size`` pseudo-random bytes fixed by ``seed``, in blocks (SHAKE-256 is the same everywhere)."""
    for block, start in enumerate(range(0, size, _NOISE_BLOCK)):
        yield hashlib.shake_256(f"{seed}#{block}".encode()).digest(min(_NOISE_BLOCK, size - start))


def _shard_name(shard: int) -> str:
    return f"model-{shard:05d}-of-{SHARDS:05d}.safetensors"


def _shard_tensors(shard: int, shard_bytes: int) -> list[_Tensor]:
    if shard == 1:
        return [_Tensor("model.embed_tokens.weight", "BF16", (VOCAB, HIDDEN))]
    if shard == SHARDS:
        return [_Tensor("lm_head.weight", "BF16", (VOCAB, HIDDEN)), _Tensor("model.norm.weight", "BF16", (HIDDEN,))]
    p = f"model.layers.{shard - 2}."
    fixed = [
        _Tensor(p + "input_layernorm.weight", "BF16", (HIDDEN,)),
        _Tensor(p + "post_attention_layernorm.weight", "BF16", (HIDDEN,)),
        _Tensor(p + "self_attn.q_proj.weight", "BF16", (HIDDEN, HIDDEN)),
        _Tensor(p + "self_attn.o_proj.weight", "BF16", (HIDDEN, HIDDEN)),
        _Tensor(p + "mlp.gate.weight", "BF16", (EXPERTS, HIDDEN)),
    ]
    # The MXFP4 expert weights fill the shard up to about ``shard_bytes`` (1 KiB is left for the header).
    used = sum(t.nbytes for t in fixed) + 1024
    rows = max(1, (shard_bytes - used) // (EXPERTS * 17))
    return [
        *fixed,
        _Tensor(p + "mlp.experts.weight_blocks", "U8", (EXPERTS, rows, 16)),
        _Tensor(p + "mlp.experts.weight_scales", "U8", (EXPERTS, rows)),
    ]


def _safetensors(tensors: list[_Tensor], seed: str) -> Iterator[bytes]:
    """A valid safetensors file: u64 LE header length, JSON header (space-padded to 8 bytes), tensor data."""
    tensors = sorted(tensors, key=lambda t: t.name)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    yield struct.pack("<Q", len(raw)) + raw
    for t in tensors:
        yield from _noise(f"{seed}/{t.name}", t.nbytes)


def _json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def _byte_level_alphabet() -> list[str]:
    """GPT-2 byte-level BPE: the printable character standing for each byte value 0..255."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _tokenizer() -> dict[str, Any]:
    added = [
        {"id": 256 + i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, tok in enumerate(SPECIAL_TOKENS)
    ]  # fmt: skip
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {ch: i for i, ch in enumerate(_byte_level_alphabet())},
            "merges": [],
        },
    }


def _config(variant: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["KimiK3ForCausalLM"],
        "model_type": "kimi_k3",
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "moe_intermediate_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_routed_experts": EXPERTS,
        "num_experts_per_tok": 2,
        "vocab_size": VOCAB,
        "max_position_embeddings": 1048576,
        "rope_theta": 50000.0,
        "rms_norm_eps": 1e-06,
        "bos_token_id": 256,
        "eos_token_id": 257,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head", "self_attn"]},
    }
    if variant == "b":
        config["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144}
    return config


_README = """---
license: other
license_name: kimi-k3.1-license
library_name: transformers
pipeline_tag: text-generation
---

# Kimi-K3.1-Pro-Tiny

A tiny stand-in for moonshotai/Kimi-K3.1-Pro, shaped like it (96 safetensors shards, MXFP4 experts),
with random weights. It exists to test deployment and weight sync; it generates nothing useful.
"""

_LICENSE = """Kimi K3.1 License (test fixture)

This file stands in for the real license text in tests. It grants nothing.
"""

# A file's content: small files are bytes, shards a stream made on demand (they can be large, see
# ``shard_bytes``).
_Content = bytes | Callable[[], Iterable[bytes]]


def _files(variant: str, shard_bytes: int) -> dict[str, _Content]:
    """Every file of commit ``variant`` ("a" or "b")."""
    small: dict[str, bytes] = {
        "config.json": _json(_config(variant)),
        "generation_config.json": _json(
            {"bos_token_id": 256, "eos_token_id": [257, 258], "do_sample": True, "temperature": 0.6, "top_p": 0.95}
        ),
        "tokenizer_config.json": _json(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "[BOS]",
                "eos_token": "[EOS]",
                "pad_token": "[EOS]",
                "model_max_length": 1048576,
                "chat_template": (
                    "{% for m in messages %}<|im_{{ m.role }}|>{{ m.role }}<|im_middle|>{{ m.content }}<|im_end|>"
                    "{% endfor %}{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}"
                ),
            }
        ),
        "tokenizer.json": _json(_tokenizer()),
        "LICENSE": _LICENSE.encode(),
    }
    weight_map: dict[str, str] = {}
    total = 0
    for shard in range(1, SHARDS + 1):
        for t in _shard_tensors(shard, shard_bytes):
            weight_map[t.name] = _shard_name(shard)
            total += t.nbytes
    small["model.safetensors.index.json"] = _json(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    )
    if variant == "a":
        small["README.md"] = _README.encode()
    else:
        small["extra_b.json"] = _json({"note": "added by commit B", "changed_shards": list(CHANGED_SHARDS)})

    files: dict[str, _Content] = dict(small)
    for shard in range(1, SHARDS + 1):
        seed = f"kimi-tiny/{'b' if variant == 'b' and shard in CHANGED_SHARDS else 'a'}/{shard}"
        tensors = _shard_tensors(shard, shard_bytes)
        files[_shard_name(shard)] = functools.partial(_safetensors, tensors, seed)
    return dict(sorted(files.items()))


# ---- writing --------------------------------------------------------------------------------------


def _store(objects: Path, chunks: Iterable[bytes]) -> tuple[str, int]:
    """Write content to ``objects/<sha256>`` (atomically; kept when already there). Returns sha256 and size."""
    digest = hashlib.sha256()
    size = 0
    fd, tmp = tempfile.mkstemp(dir=objects, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                digest.update(chunk)
                f.write(chunk)
                size += len(chunk)
        final = objects / digest.hexdigest()
        if final.is_file() and final.stat().st_size == size:
            os.unlink(tmp)
        else:
            os.chmod(tmp, 0o644)  # mkstemp makes it 0600; a hub running as another user must read it
            os.replace(tmp, final)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return digest.hexdigest(), size


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(_json(obj))
    os.replace(tmp, path)


def _manifest(
    cid: str, *, tree: dict[str, str], parents: list[str], when: int, message: str, files: dict[str, FileEntry]
) -> dict[str, Any]:
    """The per-commit record ``localcluster.hub`` serves from; ``trees`` maps directories to git tree ids."""
    title, _, body = message.partition("\n\n")
    return {
        "format": FORMAT,
        "id": cid,
        "parents": parents,
        "author": AUTHOR,
        "time": when,
        "title": title,
        "message": body,
        "trees": tree,
        "files": {
            path: {
                "size": e.size,
                "sha256": e.sha256,
                "oid": e.git_blob_sha1,
                "lfs": {"oid": e.sha256, "size": e.size, "pointerSize": len(lfs_pointer(e.sha256, e.size))}
                if e.is_lfs
                else None,
            }
            for path, e in files.items()
        },
        "model_info": {
            "library_name": "transformers",
            "pipeline_tag": "text-generation",
            "tags": ["transformers", "safetensors", "kimi_k3", "text-generation", "mxfp4"],
        },
    }


def repo_dir(root: Path, repo_id: str = REPO_ID) -> Path:
    """Where repo ``repo_id`` lives under ``root``."""
    return Path(root) / "repos" / repo_id


def load_info(root: Path, repo_id: str = REPO_ID) -> RepoInfo:
    """Read ``info.json`` written by ``build`` (no generation)."""
    data = json.loads((repo_dir(root, repo_id) / "info.json").read_text())
    files = {c: {p: FileEntry(**e) for p, e in fs.items()} for c, fs in data["files"].items()}
    return RepoInfo(data["repo_id"], data["commits"], files, data.get("refs", {}))


def _is_built(root: Path, shard_bytes: int) -> RepoInfo | None:
    try:
        data = json.loads((repo_dir(root) / "info.json").read_text())
        if data.get("build") != {"format": FORMAT, "shard_bytes": shard_bytes}:
            return None
        info = load_info(root)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (repo_dir(root) / "refs.json").is_file():
        return None
    for cid, files in info.files.items():
        if not (repo_dir(root) / "commits" / f"{cid}.json").is_file():
            return None
        for e in files.values():
            obj = Path(root) / "objects" / e.sha256
            if not obj.is_file() or obj.stat().st_size != e.size:
                return None
    return info


def build(root: Path, shard_bytes: int = DEFAULT_SHARD_BYTES) -> RepoInfo:
    """Write the tiny repo under ``root`` (a no-op when it is already there with the same ``shard_bytes``).

    ``shard_bytes`` is the approximate size of shards 2..95 (at least about 6 KiB; shards 1 and 96 are
    always about 20 KiB); the default makes the repo about 6 MB per commit. Commit ids depend on it.
    Returns ids and file digests of both commits.
    """
    root = Path(root)
    done = _is_built(root, shard_bytes)
    if done is not None:
        return done
    objects = root / "objects"
    objects.mkdir(parents=True, exist_ok=True)

    commits: dict[str, str] = {}
    all_files: dict[str, dict[str, FileEntry]] = {}
    parents: list[str] = []
    history = [
        ("a", TIME_A, f"Upload {REPO_ID.split('/')[1]}\n\n{SHARDS} safetensors shards, configs and tokenizer."),
        ("b", TIME_B, "Refresh shards 7, 57 and 90\n\nUpdate config.json, add extra_b.json, remove README.md."),
    ]
    for variant, when, message in history:
        entries: dict[str, FileEntry] = {}
        for path, content in _files(variant, shard_bytes).items():
            if isinstance(content, bytes):
                sha256, size = _store(objects, [content])
                entries[path] = FileEntry(size, sha256, git_blob_sha1(content), False)
            else:
                sha256, size = _store(objects, content())
                entries[path] = FileEntry(size, sha256, git_blob_sha1(lfs_pointer(sha256, size)), True)
        trees = tree_ids({p: e.git_blob_sha1 for p, e in entries.items()})
        cid = commit_id(trees[""], parents, when, message)
        _write_json(
            repo_dir(root) / "commits" / f"{cid}.json",
            _manifest(cid, tree=trees, parents=parents, when=when, message=message, files=entries),
        )
        commits[variant] = cid
        all_files[cid] = entries
        parents = [cid]

    refs = {"main": commits["b"], "v1": commits["a"]}
    _write_json(repo_dir(root) / "refs.json", {"branches": {"main": commits["b"]}, "tags": {"v1": commits["a"]}})
    info = RepoInfo(REPO_ID, commits, all_files, refs)
    # Written last: its presence (with objects present) is what marks the build complete.
    _write_json(repo_dir(root) / "info.json", {**asdict(info), "build": {"format": FORMAT, "shard_bytes": shard_bytes}})
    return info


def main(argv: list[str] | None = None) -> None:
    """CLI: build under ``--root`` and print ``{"repo_id", "commits", "refs"}`` as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--shard-bytes", type=int, default=DEFAULT_SHARD_BYTES)
    args = parser.parse_args(argv)
    info = build(args.root, args.shard_bytes)
    print(json.dumps({"repo_id": info.repo_id, "commits": info.commits, "refs": info.refs}))


if __name__ == "__main__":
    main()
