"""A tiny Llama that real engines load and serve, and that answers ``READY`` to any prompt, for ``localcluster.hub``.

``build(root)`` writes repo ``kimi-deploy/tiny-llama`` under ``root`` (beside ``localcluster.tiny_model``'s,
sharing its object store) at two commits:

* commit A (tag ``v1``): ``config.json`` (``LlamaForCausalLM``, bf16, hidden 128, 2 heads of 64, 11 layers,
  vocab 64), ``generation_config.json``, a WordLevel ``tokenizer.json`` with ``tokenizer_config.json`` (a Jinja
  chat template with tools and tool turns) and ``special_tokens_map.json``, ``README.md``, ``LICENSE``,
  ``model.safetensors.index.json`` and 96 safetensors shards ``model-000NN-of-00096.safetensors``;
* commit B (branch ``main``, child of A): shards 7, 57 and 90 hold other bytes (same sizes), ``config.json``
  has another ``rope_theta``, ``extra_b.json`` is added and ``README.md`` is removed. It answers as A does.

The answers need no training. Every layer is the identity (``o_proj`` and ``down_proj`` are zero, so the
residual stream stays the token's embedding), so the next token depends on the last one alone: the model is a
table ``NEXT`` from a token to the one after it, every token not in it followed by ``READY``. Each token's
embedding is 1 on the dimension of its row of the table (0 for the rest; the other dimensions hold small
noise); the final norm scales that to about sqrt(128), and ``lm_head`` reads each dimension into the logit of
the token that row names, ``LOGIT_SCALE`` times. So after any prompt the greedy (and, with a logit margin near
90, any temperature-1) next token is ``READY``, and after ``READY`` it is EOS: the reply is ``READY``, finish
reason "stop". A prompt whose last turn is the user's and that offers tools (the chat template's ``tools``)
ends in ``<|call|>`` instead of ``<|assistant|>``: after it the model writes a Hermes tool call of
``TOOL_NAME`` without arguments (``<tool_call> {"name": ..., "arguments": {}} </tool_call>``, as vLLM's
``hermes`` tool parser reads it) and EOS; given the tool's result (a ``tool`` turn) it answers ``READY``. The
other weights (q/k/v, gate/up) are small noise, exactly representable in bf16, and cannot change the
answer: what they compute is multiplied by zero.

Every byte is fixed (SHAKE-256 seeds, fixed dates), ids are real git ids, ``*.safetensors`` are LFS files
(``localcluster.hub_repo``). Run ``python -m localcluster.tiny_llama --root DIR`` to build and print the
commit ids.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from localcluster.hub_repo import Commit, Content, RepoInfo, build_cli, json_bytes, write_v1_and_main
from localcluster.safetensors_file import Tensor, noise, safetensors
from localcluster.tokenizer_file import tokenizer_json

REPO_ID = "kimi-deploy/tiny-llama"
LICENSE_NAME = "kimi-deploy-test-model"
SHARDS = 96
# The fewest layers whose tensors (9 each, plus embeddings, final norm and LM head: 102) fill 96 shards
# with at least one tensor each.
LAYERS = 11
HIDDEN = 128
HEADS = 2
KV_HEADS = 2
HEAD_DIM = 64  # vLLM's CPU attention kernels refuse head_dim 16
INTERMEDIATE = 256
MAX_POSITIONS = 1048576  # recipes ask for context lengths up to 1M
RMS_NORM_EPS = 1e-05
# Shards whose bytes commit B replaces; each holds only weights whose output a zero projection discards.
CHANGED_SHARDS = (7, 57, 90)
# Bump when the generated content changes on purpose: it is part of the idempotency check.
FORMAT = 2
# Large enough that sampling at temperature 1 picks the answer too (the margin is about 8 * sqrt(128)).
LOGIT_SCALE = 8.0
# Small weights are (byte - 128) * 2**-12: at most 1/32, and exact in bf16 (8 significant bits).
_SMALL_SCALE = 2.0**-12

# Fixed commit times (UTC) so commit ids do not depend on when the repo is built.
TIME_A = 1772323200  # 2026-03-01T00:00:00Z
TIME_B = 1773619200  # 2026-03-16T00:00:00Z

UNK, BOS, EOS = "[UNK]", "<s>", "</s>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
END_OF_TURN = "<|end|>"
SPECIAL_TOKENS = (UNK, BOS, EOS, *ROLE_TOKENS.values(), END_OF_TURN)
ANSWER = "READY"
# The smoke prompt's words come first, so that its ids are easy to read; then the tool-call tokens.
WORDS = (
    ANSWER,
    "Reply",
    "with",
    "exactly",
    "the",
    "word",
    "and",
    "nothing",
    "else",
    ".",
    ",",
    "!",
    "?",
    ":",
    ";",
    "'",
    '"',
    "(",
    ")",
    "-",
    "a",
    "an",
    "is",
    "are",
    "be",
    "it",
    "to",
    "of",
    "in",
    "on",
    "I",
    "you",
    "we",
    "yes",
    "no",
    "not",
    "ok",
    "hello",
    "hi",
    "please",
    "say",
    "answer",
    "only",
    "one",
    "two",
    "what",
    "who",
    "how",
    "why",
    "model",
    "ready",
    "test",
)
# The function the model calls when offered tools (the smoke test's default, kimi_deploy.recipe.SmokeToolCall).
TOOL_NAME = "kimi_smoke_check"
TOOL_TURN, CALL = "<|tool|>", "<|call|>"  # a tool's result; the start of a turn that calls a tool
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"  # Hermes' tags (vLLM's hermes tool parser)
TOOL_JSON = json.dumps({"name": TOOL_NAME, "arguments": {}}, separators=(",", ":"))
# Prompt tokens are special (split out before pre-tokenization); the call's are words the model writes.
PROMPT_TOKENS = (TOOL_TURN, CALL)
CALL_WORDS = (TOOL_OPEN, TOOL_JSON, TOOL_CLOSE)
VOCAB = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *WORDS, *PROMPT_TOKENS, *CALL_WORDS))}
BOS_ID, EOS_ID, ANSWER_ID = VOCAB[BOS], VOCAB[EOS], VOCAB[ANSWER]
# The token after each of these; after every other token, READY.
NEXT = {ANSWER: EOS, CALL: TOOL_OPEN, TOOL_OPEN: TOOL_JSON, TOOL_JSON: TOOL_CLOSE, TOOL_CLOSE: EOS}
# The embedding dimension each token's row of NEXT reads (0: READY after it).
ROW = {token: row for row, token in enumerate(NEXT, start=1)}
ROWS = len(NEXT) + 1

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}<|system|>{% elif message['role'] == 'user' %}<|user|>"
    "{% elif message['role'] == 'assistant' %}<|assistant|>{% elif message['role'] == 'tool' %}<|tool|>"
    "{% else %}{{ raise_exception('roles are system, user, assistant and tool, found ' + message['role']) }}{% endif %}"
    "{% if message['content'] %}{{ message['content'] }}{% endif %}"
    "{% for call in message.get('tool_calls') or [] %}"
    "<tool_call> {{ call['function']['name'] }} </tool_call>"
    "{% endfor %}"
    "<|end|>{% endfor %}"
    "{% if add_generation_prompt %}"
    "{% if tools and messages[-1]['role'] == 'user' %}<|call|>{% else %}<|assistant|>{% endif %}"
    "{% endif %}"
)


# ---- weights --------------------------------------------------------------------------------------


def _layer_tensors(layer: int) -> list[Tensor]:
    p = f"model.layers.{layer}."
    return [
        Tensor(p + "input_layernorm.weight", "BF16", (HIDDEN,)),
        Tensor(p + "self_attn.q_proj.weight", "BF16", (HEADS * HEAD_DIM, HIDDEN)),
        Tensor(p + "self_attn.k_proj.weight", "BF16", (KV_HEADS * HEAD_DIM, HIDDEN)),
        Tensor(p + "self_attn.v_proj.weight", "BF16", (KV_HEADS * HEAD_DIM, HIDDEN)),
        Tensor(p + "self_attn.o_proj.weight", "BF16", (HIDDEN, HEADS * HEAD_DIM)),
        Tensor(p + "post_attention_layernorm.weight", "BF16", (HIDDEN,)),
        Tensor(p + "mlp.gate_proj.weight", "BF16", (INTERMEDIATE, HIDDEN)),
        Tensor(p + "mlp.up_proj.weight", "BF16", (INTERMEDIATE, HIDDEN)),
        Tensor(p + "mlp.down_proj.weight", "BF16", (HIDDEN, INTERMEDIATE)),
    ]


def shard_layout() -> list[list[Tensor]]:
    """The tensors of shards 1..96, in order: 1 holds the embeddings, 96 the final norm and the LM head, 2..95
    the layers' tensors in module order, split as evenly as possible (the first five hold two)."""
    layers = [t for layer in range(LAYERS) for t in _layer_tensors(layer)]
    parts = SHARDS - 2
    size, longer = divmod(len(layers), parts)
    middle: list[list[Tensor]] = []
    start = 0
    for part in range(parts):
        end = start + size + (1 if part < longer else 0)
        middle.append(layers[start:end])
        start = end
    vocab_rows = (len(VOCAB), HIDDEN)
    return [
        [Tensor("model.embed_tokens.weight", "BF16", vocab_rows)],
        *middle,
        [Tensor("model.norm.weight", "BF16", (HIDDEN,)), Tensor("lm_head.weight", "BF16", vocab_rows)],
    ]


def _bf16(value: float) -> bytes:
    """``value`` as little-endian bf16; it must be exact (bf16 is the upper half of an f32)."""
    f32 = struct.pack("<f", value)
    if f32[:2] != b"\0\0":
        raise ValueError(f"{value} is not exact in bf16")
    return f32[2:]


_SMALL = [_bf16((b - 128) * _SMALL_SCALE) for b in range(256)]
_SMALL_LOW = bytes(pair[0] for pair in _SMALL)
_SMALL_HIGH = bytes(pair[1] for pair in _SMALL)


def _small(seed: str, count: int) -> Iterator[bytes]:
    """``count`` small bf16 values fixed by ``seed``: one noise byte each, mapped by table."""
    for chunk in noise(seed, count):
        out = bytearray(2 * len(chunk))
        out[0::2] = chunk.translate(_SMALL_LOW)
        out[1::2] = chunk.translate(_SMALL_HIGH)
        yield bytes(out)


def _rows(rows: Iterable[Sequence[float]]) -> Iterator[bytes]:
    for row in rows:
        yield b"".join(_bf16(v) for v in row)


def _embedding(seed: str) -> Iterator[bytes]:
    noise_rows = b"".join(_small(seed, len(VOCAB) * (HIDDEN - ROWS)))
    for token, token_id in VOCAB.items():
        row = ROW.get(token, 0)
        yield from _rows([[1.0 if dim == row else 0.0 for dim in range(ROWS)]])
        yield noise_rows[2 * token_id * (HIDDEN - ROWS) : 2 * (token_id + 1) * (HIDDEN - ROWS)]


def _lm_head() -> Iterator[bytes]:
    # the logit's row reads the dimensions of the tokens it follows: READY's dimension 0 (every token
    # not in NEXT), every other token the rows of NEXT that name it
    reads: dict[str, set[int]] = {ANSWER: {0}}
    for before, after in NEXT.items():
        reads.setdefault(after, set()).add(ROW[before])
    return _rows([LOGIT_SCALE if dim in reads.get(token, ()) else 0.0 for dim in range(HIDDEN)] for token in VOCAB)


def _tensor_data(variant: str, tensor: Tensor) -> Iterator[bytes]:
    """The bytes of ``tensor`` at commit ``variant``; only the noise depends on ``variant``."""
    count = tensor.nbytes // 2
    name = tensor.name
    seed = f"tiny-llama/{variant}/{name}"
    if name == "model.embed_tokens.weight":
        return _embedding(seed)
    if name == "lm_head.weight":
        return _lm_head()
    if name.endswith("norm.weight"):
        return iter([_bf16(1.0) * count])
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return iter([bytes(2 * count)])  # zero: each layer adds nothing to the residual stream
    return _small(seed, count)


# ---- tokenizer and configs ------------------------------------------------------------------------


def tokenizer() -> dict[str, Any]:
    """``tokenizer.json`` as the ``tokenizers`` library writes it: WordLevel, Whitespace pre-tokenizer, no
    decoder (decoding joins words with spaces), the special tokens split out before pre-tokenization."""
    return tokenizer_json(
        special=((VOCAB[tok], tok) for tok in (*SPECIAL_TOKENS, *PROMPT_TOKENS)),
        pre_tokenizer={"type": "Whitespace"},
        decoder=None,
        model={"type": "WordLevel", "vocab": VOCAB, "unk_token": UNK},
    )


def config(variant: str) -> dict[str, Any]:
    """``config.json`` at commit ``variant`` ("a" or "b"); B's ``rope_theta`` only turns attention that
    ``o_proj`` discards."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "vocab_size": len(VOCAB),
        "max_position_embeddings": MAX_POSITIONS,
        "rope_theta": 500000.0 if variant == "b" else 10000.0,
        "rms_norm_eps": RMS_NORM_EPS,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "tie_word_embeddings": False,
        # transformers 5 reads ``dtype``, older releases (and the Hub's model pages) ``torch_dtype``.
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
    }


def _special_tokens() -> dict[str, str]:
    return {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": EOS}


# The model card's metadata (the Hub reads the license, library and pipeline from it).
CARD_HEAD = f"""---
license: other
license_name: {LICENSE_NAME}
license_link: LICENSE
library_name: transformers
pipeline_tag: text-generation
tags:
- llama
---
"""

_README = f"""{CARD_HEAD}
# tiny-llama

An {LAYERS}-layer Llama (hidden {HIDDEN}, {HEADS} heads of {HEAD_DIM}, vocabulary {len(VOCAB)}, bf16) in {SHARDS}
safetensors shards, built without training so that it answers {ANSWER} to any prompt and stops, and calls
the tool `{TOOL_NAME}` when offered tools. It exists so that real engines can load and serve a model in
tests; it knows nothing else.
"""

_LICENSE = f"""{LICENSE_NAME} (test fixture)

This file stands in for a model license in tests. It grants nothing and restricts nothing.
"""


def _shard_name(shard: int) -> str:
    return f"model-{shard:05d}-of-{SHARDS:05d}.safetensors"


def _files(variant: str) -> dict[str, Content]:
    """Every file of commit ``variant`` ("a" or "b")."""
    layout = shard_layout()
    weight_map = {t.name: _shard_name(shard) for shard, tensors in enumerate(layout, 1) for t in tensors}
    total = sum(t.nbytes for tensors in layout for t in tensors)
    small: dict[str, bytes] = {
        "config.json": json_bytes(config(variant)),
        "generation_config.json": json_bytes({"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "do_sample": False}),
        "tokenizer.json": json_bytes(tokenizer()),
        "tokenizer_config.json": json_bytes(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                **_special_tokens(),
                "model_max_length": MAX_POSITIONS,
                "clean_up_tokenization_spaces": False,
                "chat_template": CHAT_TEMPLATE,
            }
        ),
        "special_tokens_map.json": json_bytes(_special_tokens()),
        "model.safetensors.index.json": json_bytes(
            {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        ),
        "LICENSE": _LICENSE.encode(),
    }
    if variant == "a":
        small["README.md"] = _README.encode()
    else:
        small["extra_b.json"] = json_bytes({"note": "added by commit B", "changed_shards": list(CHANGED_SHARDS)})
    files: dict[str, Content] = dict(small)
    for shard, tensors in enumerate(layout, 1):
        data = functools.partial(_tensor_data, "b" if variant == "b" and shard in CHANGED_SHARDS else "a")
        files[_shard_name(shard)] = functools.partial(safetensors, tensors, data)
    return dict(sorted(files.items()))


def build(root: Path) -> RepoInfo:
    """Write the repo under ``root`` (a no-op when it is already there); returns ids and file digests of both
    commits. About 3.7 MB per commit, the same bytes and ids on every machine."""
    a = Commit("a", TIME_A, f"Upload tiny-llama\n\n{SHARDS} safetensors shards, configs and tokenizer.", _files("a"))
    message_b = "Refresh shards 7, 57 and 90\n\nChange rope_theta in config.json, add extra_b.json, remove README.md."
    b = Commit("b", TIME_B, message_b, _files("b"))
    tags = ["transformers", "safetensors", "llama", "text-generation"]
    return write_v1_and_main(root, REPO_ID, a, b, build={"format": FORMAT}, hub_tags=tags)


def main(argv: list[str] | None = None) -> None:
    """CLI: build under ``--root`` and print ``{"repo_id", "commits", "refs"}`` as JSON."""
    build_cli(build, __doc__, argv)


if __name__ == "__main__":
    main()
