"""The tiny Llama (localcluster.tiny_llama) that real engines serve from the fake Hub: reproducible, shaped as
vLLM loads it, tokenized as the smoke test's prompt needs, answering READY by construction, locked."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
import pytest
from huggingface_hub import HfApi

from kimi_deploy.recipe import Recipe
from kimi_deploy.weights.hub_lock import make_lock
from kimi_deploy.weights.lockfile import LOCK_DIR
from localcluster import hub_content, needle_llama, tiny_llama, tiny_model
from localcluster.hub import HubServer, serve
from localcluster.hub_repo import RepoInfo, load_info, materialize
from localcluster.tiny_llama import ANSWER, CHANGED_SHARDS, REPO_ID, build
from tests.conftest import ROOT

# What the build produces, on every machine: recipes and locks pin these.
COMMIT_A = "65a1458ff9caddb3a300eddbbce9e9ad0a06677c"
COMMIT_B = "9ceabef5a58ba3ebb7e1bc7009e011f99fd9d3ac"
SHARDS = [f"model-{i:05d}-of-00096.safetensors" for i in range(1, 97)]
SMOKE_PROMPT = "Reply with exactly the word READY and nothing else."
SMOKE_IDS = [8, 9, 10, 11, 12, 7, 13, 14, 15, 16]
LAYER_TENSORS = [
    "input_layernorm",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "post_attention_layernorm",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
]
# Weights whose every contribution a zero o_proj or down_proj discards.
DISCARDED = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, RepoInfo]:
    root = tmp_path_factory.mktemp("tiny-llama")
    return root, build(root)


def _object(root: Path, info: RepoInfo, commit: str, path: str) -> bytes:
    return (root / "objects" / info.files[commit][path].sha256).read_bytes()


def _json(root: Path, info: RepoInfo, commit: str, path: str) -> Any:
    return json.loads(_object(root, info, commit, path))


def _safetensors(raw: bytes) -> dict[str, tuple[str, list[int], bytes]]:
    """``{name: (dtype, shape, data)}``, checking that the header's offsets tile the data exactly."""
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    assert header.pop("__metadata__") == {"format": "pt"}
    spans = sorted(v["data_offsets"] for v in header.values())
    assert spans[0][0] == 0
    assert all(x[1] == y[0] for x, y in itertools.pairwise(spans))
    assert 8 + n + spans[-1][1] == len(raw)
    data = raw[8 + n :]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0] : v["data_offsets"][1]]) for k, v in header.items()}


def _weights(root: Path, info: RepoInfo, commit: str) -> dict[str, tuple[str, list[int], bytes]]:
    weights: dict[str, tuple[str, list[int], bytes]] = {}
    for shard in SHARDS:
        weights |= _safetensors(_object(root, info, commit, shard))
    return weights


def _bf16(data: bytes) -> list[float]:
    halves = struct.unpack(f"<{len(data) // 2}H", data)
    return list(struct.unpack(f"<{len(halves)}f", struct.pack(f"<{len(halves)}I", *(h << 16 for h in halves))))


def _matrix(weight: tuple[str, list[int], bytes]) -> list[list[float]]:
    dtype, (rows, cols), data = weight
    assert dtype == "BF16"
    values = _bf16(data)
    return [values[r * cols : (r + 1) * cols] for r in range(rows)]


# ---- the repo on disk ---------------------------------------------------------------------------------


def _tree_digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_build_is_reproducible_and_pinned(repo: tuple[Path, RepoInfo], tmp_path: Path) -> None:
    root, info = repo
    assert info.repo_id == REPO_ID == "kimi-deploy/tiny-llama"
    assert info.commits == {"a": COMMIT_A, "b": COMMIT_B}
    assert info.refs == {"main": COMMIT_B, "v1": COMMIT_A}
    again = build(tmp_path / "again")
    assert again == info
    assert _tree_digests(tmp_path / "again") == _tree_digests(root)  # every byte, manifests included
    manifest = tmp_path / "again" / "repos" / REPO_ID / "commits" / f"{COMMIT_A}.json"
    before = manifest.stat().st_mtime_ns
    assert build(tmp_path / "again") == info  # idempotent: nothing regenerated
    assert manifest.stat().st_mtime_ns == before
    assert load_info(tmp_path / "again", REPO_ID) == info
    assert all(e.is_lfs == p.endswith(".safetensors") for p, e in info.files[COMMIT_A].items())


def test_a_commit_materializes_as_a_plain_model_folder(repo: tuple[Path, RepoInfo], tmp_path: Path) -> None:
    root, info = repo
    for commit in (COMMIT_A, COMMIT_B):
        dest = tmp_path / commit
        written = materialize(root, REPO_ID, commit, dest)
        assert written == sorted(info.files[commit])
        # the content, not LFS pointers, and nothing else: what vLLM is given as --model
        assert _tree_digests(dest) == {p: e.sha256 for p, e in info.files[commit].items()}
    assert (tmp_path / COMMIT_A / "README.md").is_file()
    assert not (tmp_path / COMMIT_B / "README.md").exists()
    with pytest.raises(FileNotFoundError):
        materialize(root, REPO_ID, "0" * 40, tmp_path / "none")


def test_96_shards_and_an_index_naming_every_tensor_once(repo: tuple[Path, RepoInfo]) -> None:
    root, info = repo
    files = info.files[COMMIT_A]
    assert sorted(p for p in files if p.endswith(".safetensors")) == SHARDS
    assert set(files) - set(SHARDS) == {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "model.safetensors.index.json",
        "README.md",
        "LICENSE",
    }
    where: dict[str, str] = {}
    total = 0
    for shard in SHARDS:
        tensors = _safetensors(_object(root, info, COMMIT_A, shard))
        assert tensors, f"{shard} holds no tensor"
        for name, (_, _, data) in tensors.items():
            assert name not in where, f"{name} in {where.get(name)} and {shard}"
            where[name] = shard
            total += len(data)
    layers = {f"model.layers.{i}.{t}.weight" for i in range(tiny_llama.LAYERS) for t in LAYER_TENSORS}
    assert set(where) == layers | {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    assert len(where) == 102
    index = _json(root, info, COMMIT_A, "model.safetensors.index.json")
    assert index == {"metadata": {"total_size": total}, "weight_map": dict(sorted(where.items()))}


def test_config_is_a_bf16_llama_vllm_can_run(repo: tuple[Path, RepoInfo]) -> None:
    root, info = repo
    config = _json(root, info, COMMIT_A, "config.json")
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    assert config["dtype"] == config["torch_dtype"] == "bfloat16"
    assert (config["hidden_size"], config["intermediate_size"], config["vocab_size"]) == (128, 256, 64)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (2, 2, 64)
    assert config["head_dim"] * config["num_attention_heads"] == config["hidden_size"]
    assert config["num_hidden_layers"] == 11
    assert config["max_position_embeddings"] >= 131072  # recipes ask for 32768 and 131072
    assert config["tie_word_embeddings"] is False
    assert config["rms_norm_eps"] == 1e-5
    tokenizer = _json(root, info, COMMIT_A, "tokenizer.json")["model"]["vocab"]
    assert (config["bos_token_id"], config["eos_token_id"]) == (tokenizer["<s>"], tokenizer["</s>"])
    generation = _json(root, info, COMMIT_A, "generation_config.json")
    assert generation["eos_token_id"] == config["eos_token_id"]
    assert not {"temperature", "top_p", "top_k"} & set(generation)  # nothing for vLLM to override requests with
    readme = _object(root, info, COMMIT_A, "README.md").decode()
    assert readme.startswith("---\nlicense: other\nlicense_name: kimi-deploy-test-model\n")


def test_commit_b_changes_three_discarded_shards_and_the_files(repo: tuple[Path, RepoInfo]) -> None:
    root, info = repo
    a, b = info.files[COMMIT_A], info.files[COMMIT_B]
    assert set(b) == set(a) - {"README.md"} | {"extra_b.json"}
    changed = {p for p in set(a) & set(b) if a[p] != b[p]}
    assert changed == {"config.json", *(SHARDS[i - 1] for i in CHANGED_SHARDS)}
    assert all(a[p].size == b[p].size for p in changed if p.endswith(".safetensors"))
    for shard in CHANGED_SHARDS:
        names = _safetensors(_object(root, info, COMMIT_B, SHARDS[shard - 1]))
        assert all(n.endswith(tuple(f"{d}.weight" for d in DISCARDED)) for n in names), names
    config_a, config_b = _json(root, info, COMMIT_A, "config.json"), _json(root, info, COMMIT_B, "config.json")
    assert {k for k in config_a | config_b if config_a.get(k) != config_b.get(k)} == {"rope_theta"}


# ---- the tokenizer --------------------------------------------------------------------------------------


def _encode(tokenizer: dict[str, Any], text: str) -> list[int]:
    """What ``tokenizers`` does with this tokenizer.json: split out the added tokens, then the Whitespace
    pre-tokenizer's ``\\w+|[^\\w\\s]+`` pieces, each looked up in the WordLevel vocabulary (else [UNK])."""
    added = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    vocab = tokenizer["model"]["vocab"]
    unk = vocab[tokenizer["model"]["unk_token"]]
    ids: list[int] = []
    for piece in re.split("(" + "|".join(re.escape(t) for t in added) + ")", text):
        if piece in added:
            ids.append(added[piece])
        else:
            ids += [vocab.get(word, unk) for word in re.findall(r"\w+|[^\w\s]+", piece)]
    return ids


def _chat(
    tokenizer_config: dict[str, Any], messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> str:
    """The chat template rendered as transformers renders it (``raise_exception`` included)."""

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(tokenizer_config["chat_template"])
    return template.render(
        messages=messages, tools=tools, add_generation_prompt=True, bos_token=tokenizer_config["bos_token"]
    )


def test_tokenizer_encodes_the_smoke_prompt(repo: tuple[Path, RepoInfo]) -> None:
    root, info = repo
    tokenizer = _json(root, info, COMMIT_A, "tokenizer.json")
    assert tokenizer["model"]["type"] == "WordLevel"
    assert tokenizer["model"]["unk_token"] == "[UNK]"
    assert tokenizer["pre_tokenizer"] == {"type": "Whitespace"}
    vocab = tokenizer["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(64))
    assert vocab[ANSWER] == 7
    assert all(t["special"] and vocab[t["content"]] == t["id"] for t in tokenizer["added_tokens"])
    assert _encode(tokenizer, SMOKE_PROMPT) == SMOKE_IDS

    config = _json(root, info, COMMIT_A, "tokenizer_config.json")
    assert (config["bos_token"], config["eos_token"], config["unk_token"]) == ("<s>", "</s>", "[UNK]")
    assert _json(root, info, COMMIT_A, "special_tokens_map.json") == {
        k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")
    }
    text = _chat(config, [{"role": "user", "content": SMOKE_PROMPT}])
    assert text == f"<s><|user|>{SMOKE_PROMPT}<|end|><|assistant|>"
    assert _encode(tokenizer, text) == [1, 4, *SMOKE_IDS, 6, 5]
    system = _chat(config, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    assert system == "<s><|system|>Be brief.<|end|><|user|>hi<|end|><|assistant|>"
    with pytest.raises(jinja2.TemplateError, match="roles are system, user, assistant and tool, found ipython"):
        _chat(config, [{"role": "ipython", "content": "{}"}])


def test_the_chat_template_calls_a_tool_when_offered_and_answers_its_result(repo: tuple[Path, RepoInfo]) -> None:
    root, info = repo
    tokenizer = _json(root, info, COMMIT_A, "tokenizer.json")
    config = _json(root, info, COMMIT_A, "tokenizer_config.json")
    tools = [{"type": "function", "function": {"name": tiny_llama.TOOL_NAME}}]
    asked = [{"role": "user", "content": "hi"}]
    # Offered tools, the user's turn ends in <|call|>: the model calls the tool after it.
    assert _chat(config, asked, tools) == "<s><|user|>hi<|end|><|call|>"
    assert _encode(tokenizer, _chat(config, asked, tools))[-1] == tokenizer["model"]["vocab"]["<|call|>"]
    # The call sent back (as vLLM renders an assistant's tool_calls), then the tool's result: the
    # assistant's turn, after which the model answers.
    call = {"id": "c1", "type": "function", "function": {"name": tiny_llama.TOOL_NAME, "arguments": {}}}
    turns: list[dict[str, Any]] = [
        *asked,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "READY"},
    ]
    text = _chat(config, turns, tools)
    assert text == (
        "<s><|user|>hi<|end|><|assistant|><tool_call> kimi_smoke_check </tool_call><|end|><|tool|>READY<|end|>"
        "<|assistant|>"
    )
    assert _encode(tokenizer, text)[-1] == tokenizer["model"]["vocab"]["<|assistant|>"]
    # The words of the call are the model's to write, never special (a skip_special_tokens
    # decode keeps them); the prompt's own markers are special, split out before pre-tokenization.
    special = {t["content"] for t in tokenizer["added_tokens"]}
    assert {"<|tool|>", "<|call|>"} <= special
    assert not special & {tiny_llama.TOOL_OPEN, tiny_llama.TOOL_JSON, tiny_llama.TOOL_CLOSE}
    assert json.loads(tiny_llama.TOOL_JSON) == {"name": "kimi_smoke_check", "arguments": {}}


def test_tokenizers_library_loads_it(repo: tuple[Path, RepoInfo]) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    root, info = repo
    raw = _object(root, info, COMMIT_A, "tokenizer.json").decode()
    loaded = tokenizers.Tokenizer.from_str(raw)
    assert json.loads(loaded.to_str()) == json.loads(raw)  # the library's own format, nothing it drops
    assert loaded.encode(SMOKE_PROMPT).ids == SMOKE_IDS


# ---- the answer, computed from the shards' bytes ----------------------------------------------------------


def _next_token(weights: dict[str, tuple[str, list[int], bytes]], token: int) -> tuple[int, float]:
    """Greedy next token after a prompt ending in ``token``, and its logit's margin over the runner-up.

    The residual stream after every layer is the last token's embedding (the test checks that the layers
    add nothing); then the final RMSNorm and the LM head.
    """
    hidden = _matrix(weights["model.embed_tokens.weight"])[token]
    norm = _bf16(weights["model.norm.weight"][2])
    scale = 1 / math.sqrt(sum(x * x for x in hidden) / len(hidden) + tiny_llama.RMS_NORM_EPS)
    normed = [x * scale * w for x, w in zip(hidden, norm, strict=True)]
    logits = [sum(w * x for w, x in zip(row, normed, strict=True)) for row in _matrix(weights["lm_head.weight"])]
    best, second = sorted(range(len(logits)), key=lambda i: -logits[i])[:2]
    return best, logits[best] - logits[second]


@pytest.mark.parametrize("commit", [COMMIT_A, COMMIT_B])
def test_every_prompt_is_answered_ready_then_eos_and_a_tool_offered_is_called(
    repo: tuple[Path, RepoInfo], commit: str
) -> None:
    root, info = repo
    weights = _weights(root, info, commit)
    for name, (dtype, _, data) in weights.items():
        assert dtype == "BF16"
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            assert data == bytes(len(data)), f"{name} is not zero: its layer would change the residual stream"
        elif name.endswith("layernorm.weight") or name == "model.norm.weight":
            assert set(_bf16(data)) == {1.0}, name
        elif name.startswith("model.layers."):  # finite, so that a zero projection of what they compute is zero
            assert all(math.isfinite(v) for v in set(_bf16(data))), name
    vocab = _json(root, info, commit, "tokenizer.json")["model"]["vocab"]
    word = {i: w for w, i in vocab.items()}
    # Written out here, not read from tiny_llama.NEXT: READY then EOS; after <|call|> a Hermes call, then EOS.
    after = {
        "READY": "</s>",
        "<|call|>": "<tool_call>",
        "<tool_call>": '{"name":"kimi_smoke_check","arguments":{}}',
        '{"name":"kimi_smoke_check","arguments":{}}': "</tool_call>",
        "</tool_call>": "</s>",
    }
    for token in range(len(vocab)):
        best, margin = _next_token(weights, token)
        assert word[best] == after.get(word[token], "READY"), word[token]
        assert margin > 50  # so that even sampling at temperature 1 picks it (e**-50 per other token)


# ---- served, and locked -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    """The cluster's Hub content (``hub_content.build``: every repo under one root) on loopback."""
    root = tmp_path_factory.mktemp("hub")
    assert [i.repo_id for i in hub_content.build(root)] == [tiny_model.REPO_ID, REPO_ID, needle_llama.REPO_ID]
    server = serve(root, "127.0.0.1", 0, log_stream=None)
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("commit", [COMMIT_A, COMMIT_B])
def test_lock_files_match_a_fresh_build(hub: HubServer, recipe: Recipe, commit: str) -> None:
    # Only the model part of a recipe makes a lock: the production recipe's, pointed at this repo.
    model = recipe.model.model_copy(update={"repo": REPO_ID, "revision": commit, "shards": 96})
    lock = make_lock(model, "recipe", hub.url)
    path = ROOT / LOCK_DIR / f"{REPO_ID.replace('/', '--')}@{commit}.json"
    assert lock.to_json() == path.read_text(encoding="utf-8")
    assert len(lock.files) == 104


def test_the_hub_serves_both_repos(hub: HubServer) -> None:
    api = HfApi(endpoint=hub.url)
    assert api.model_info(REPO_ID, revision="v1").sha == COMMIT_A
    assert api.model_info(REPO_ID).sha == COMMIT_B
    assert api.model_info(tiny_model.REPO_ID, revision="v1").sha == "23eb01d77aab1f1b9ff6dda80033b783970fe79c"
