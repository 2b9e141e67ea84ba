"""A tiny, byte-for-byte reproducible stand-in for the Kimi K3.1 Pro Hub repo, written for ``localcluster.hub``.

``build(root)`` writes repo ``moonshotai/Kimi-K3.1-Pro-Tiny`` under ``root`` at two commits:

* commit A (tag ``v1``): configs, tokenizer, ``README.md``, ``LICENSE``, ``model.safetensors.index.json`` and
  96 real safetensors shards ``model-000NN-of-00096.safetensors`` (1: embeddings, 2..95: one layer each,
  96: final norm and LM head);
* commit B (branch ``main``, child of A): shards 7, 57 and 90 hold other bytes (same sizes), ``config.json``
  changes, ``extra_b.json`` is added and ``README.md`` is removed.

Every byte is derived from fixed seeds (SHAKE-256), and ids are real git object ids (blob, tree, commit with
fixed author and dates), so the same ``shard_bytes`` gives the same commit ids on every run and machine.
``*.safetensors`` files are LFS files. The layout on disk is ``localcluster.hub_repo``'s; no engine can run
this model (``localcluster.tiny_llama`` is the one real engines serve).

Run ``python -m localcluster.tiny_model --root DIR [--shard-bytes N]`` to build and print the commit ids.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localcluster import hub_repo
from localcluster.git_objects import AUTHOR, commit_id, git_blob_sha1, lfs_pointer, tree_ids
from localcluster.hub_repo import Commit, Content, FileEntry, RepoInfo, json_bytes, write_v1_and_main
from localcluster.safetensors_file import Tensor, noise, safetensors
from localcluster.tokenizer_file import tokenizer_json

# Importers use these names from here, as they did before the repo writing became its own module.
__all__ = [
    "AUTHOR",
    "CHANGED_SHARDS",
    "DEFAULT_SHARD_BYTES",
    "REPO_ID",
    "SHARDS",
    "FileEntry",
    "RepoInfo",
    "build",
    "commit_id",
    "git_blob_sha1",
    "lfs_pointer",
    "load_info",
    "repo_dir",
    "tree_ids",
]

REPO_ID = "moonshotai/Kimi-K3.1-Pro-Tiny"
SHARDS = 96
DEFAULT_SHARD_BYTES = 64 * 1024
# Shards whose bytes commit B replaces.
CHANGED_SHARDS = (7, 57, 90)
# Bump when the generated content changes on purpose: it is part of the idempotency check.
FORMAT = 2

HIDDEN = 32  # one MXFP4 block (32 values) per expert row: blocks are [experts, rows, 16] bytes
EXPERTS = 8
VOCAB = 320  # 256 byte tokens, 7 special tokens, padding
LAYERS = SHARDS - 2
SPECIAL_TOKENS = ("[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>")

# Fixed commit times (UTC) so commit ids do not depend on when the repo is built.
TIME_A = 1767225600  # 2026-01-01T00:00:00Z
TIME_B = 1771545600  # 2026-02-20T00:00:00Z


# ---- content --------------------------------------------------------------------------------------


def _shard_name(shard: int) -> str:
    return f"model-{shard:05d}-of-{SHARDS:05d}.safetensors"


def _shard_tensors(shard: int, shard_bytes: int) -> list[Tensor]:
    if shard == 1:
        return [Tensor("model.embed_tokens.weight", "BF16", (VOCAB, HIDDEN))]
    if shard == SHARDS:
        return [Tensor("lm_head.weight", "BF16", (VOCAB, HIDDEN)), Tensor("model.norm.weight", "BF16", (HIDDEN,))]
    p = f"model.layers.{shard - 2}."
    fixed = [
        Tensor(p + "input_layernorm.weight", "BF16", (HIDDEN,)),
        Tensor(p + "post_attention_layernorm.weight", "BF16", (HIDDEN,)),
        Tensor(p + "self_attn.q_proj.weight", "BF16", (HIDDEN, HIDDEN)),
        Tensor(p + "self_attn.o_proj.weight", "BF16", (HIDDEN, HIDDEN)),
        Tensor(p + "mlp.gate.weight", "BF16", (EXPERTS, HIDDEN)),
    ]
    # The MXFP4 expert weights fill the shard up to about ``shard_bytes`` (1 KiB is left for the header).
    used = sum(t.nbytes for t in fixed) + 1024
    rows = max(1, (shard_bytes - used) // (EXPERTS * 17))
    return [
        *fixed,
        Tensor(p + "mlp.experts.weight_blocks", "U8", (EXPERTS, rows, 16)),
        Tensor(p + "mlp.experts.weight_scales", "U8", (EXPERTS, rows)),
    ]


def _seeded(seed: str, tensor: Tensor) -> Iterator[bytes]:
    # Random bytes, not values: no engine runs this model, only its bytes and digests matter.
    return noise(f"{seed}/{tensor.name}", tensor.nbytes)


def _byte_level_alphabet() -> list[str]:
    """GPT-2 byte-level BPE: the printable character standing for each byte value 0..255."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _tokenizer() -> dict[str, Any]:
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return tokenizer_json(
        special=((256 + i, tok) for i, tok in enumerate(SPECIAL_TOKENS)),
        pre_tokenizer=byte_level,
        decoder=byte_level,
        model={
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
    )


def _config(variant: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["KimiK3ForConditionalGeneration"],
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


def _files(variant: str, shard_bytes: int) -> dict[str, Content]:
    """Every file of commit ``variant`` ("a" or "b")."""
    small: dict[str, bytes] = {
        "config.json": json_bytes(_config(variant)),
        "generation_config.json": json_bytes(
            {"bos_token_id": 256, "eos_token_id": [257, 258], "do_sample": True, "temperature": 0.6, "top_p": 0.95}
        ),
        "tokenizer_config.json": json_bytes(
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
        "tokenizer.json": json_bytes(_tokenizer()),
        "LICENSE": _LICENSE.encode(),
    }
    weight_map: dict[str, str] = {}
    total = 0
    for shard in range(1, SHARDS + 1):
        for t in _shard_tensors(shard, shard_bytes):
            weight_map[t.name] = _shard_name(shard)
            total += t.nbytes
    small["model.safetensors.index.json"] = json_bytes(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    )
    if variant == "a":
        small["README.md"] = _README.encode()
    else:
        small["extra_b.json"] = json_bytes({"note": "added by commit B", "changed_shards": list(CHANGED_SHARDS)})

    files: dict[str, Content] = dict(small)
    for shard in range(1, SHARDS + 1):
        seed = f"kimi-tiny/{'b' if variant == 'b' and shard in CHANGED_SHARDS else 'a'}/{shard}"
        tensors = _shard_tensors(shard, shard_bytes)
        files[_shard_name(shard)] = functools.partial(safetensors, tensors, functools.partial(_seeded, seed))
    return dict(sorted(files.items()))


# ---- the repo -------------------------------------------------------------------------------------


def repo_dir(root: Path, repo_id: str = REPO_ID) -> Path:
    """Where repo ``repo_id`` (by default this one) lives under ``root``."""
    return hub_repo.repo_dir(root, repo_id)


def load_info(root: Path, repo_id: str = REPO_ID) -> RepoInfo:
    """Read ``info.json`` written by ``build`` (no generation); ``repo_id`` may name another repo of ``root``."""
    return hub_repo.load_info(root, repo_id)


def build(root: Path, shard_bytes: int = DEFAULT_SHARD_BYTES) -> RepoInfo:
    """Write the tiny repo under ``root`` (a no-op when it is already there with the same ``shard_bytes``).

    ``shard_bytes`` is the approximate size of shards 2..95 (at least about 6 KiB; shards 1 and 96 are
    always about 20 KiB); the default makes the repo about 6 MB per commit. Commit ids depend on it.
    Returns ids and file digests of both commits.
    """
    a = Commit(
        "a",
        TIME_A,
        f"Upload {REPO_ID.split('/')[1]}\n\n{SHARDS} safetensors shards, configs and tokenizer.",
        _files("a", shard_bytes),
    )
    message_b = "Refresh shards 7, 57 and 90\n\nUpdate config.json, add extra_b.json, remove README.md."
    b = Commit("b", TIME_B, message_b, _files("b", shard_bytes))
    tags = ["transformers", "safetensors", "kimi_k3", "text-generation", "mxfp4"]
    params = {"format": FORMAT, "shard_bytes": shard_bytes}
    return write_v1_and_main(root, REPO_ID, a, b, build=params, hub_tags=tags)


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
