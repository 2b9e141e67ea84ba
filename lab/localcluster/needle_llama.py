"""A needle detector: ``localcluster.tiny_llama``'s model, answering ``test`` when a prompt holds it anywhere.

``build(root)`` writes repo ``kimi-deploy/tiny-llama-needle`` under ``root`` (beside the other repos, sharing
their object store) at commit A, branch ``main`` and tag ``v1``, and commit B after it, tag ``v2``: A's files but
for a line added to ``README.md``, a revision the same engine serves as it serves A (an upgrade by revision that
fetches one small file). Its files are tiny Llama commit A's (the same
96 shards and layout, index, tokenizer, configs and ``LICENSE``) but for ``README.md`` and five tensors:

* ``model.embed_tokens.weight``: dimensions ``D_IN`` and ``D_OUT`` (noise in the tiny Llama) are 0 for every
  token, but ``D_IN`` of the needle ``NEEDLE`` (the word ``test``) is 1;
* ``lm_head.weight``: the needle's row reads ``D_OUT`` alone, ``NEEDLE_LOGIT`` times;
* the last layer's ``self_attn.q_proj.weight`` is zero, so its attention is uniform over every position so far;
  its ``v_proj.weight`` reads ``D_IN`` into the first value dimension and its ``o_proj.weight`` writes that
  into ``D_OUT``, both ``ATTENTION_GAIN`` times.

So the last layer adds to ``D_OUT`` the share of the prompt's positions that hold the needle, scaled: any
needle at all (measured on vLLM 0.32.0's CPU build with prompts up to about 30K tokens) outweighs the ``READY``
logit and the model answers ``test``, then ``test`` again, since its answer holds the needle too. Without the
needle ``D_OUT`` stays 0 and the model is the tiny Llama: ``READY``, and the tool call when offered tools. A
prompt the engine truncated, or whose middle it dropped, loses its needle. The other tensors are byte for byte
tiny Llama commit A's.

Every byte is fixed (the tiny Llama's seeds, a fixed date). Run ``python -m localcluster.needle_llama --root
DIR`` to build and print the commit id.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

from localcluster.hub_repo import Commit, Content, RepoInfo, build_cli, write_repo
from localcluster.safetensors_file import Tensor, safetensors
from localcluster.tiny_llama import (
    ANSWER,
    CARD_HEAD,
    HEAD_DIM,
    HEADS,
    HIDDEN,
    LAYERS,
    ROWS,
    SHARDS,
    VOCAB,
    _bf16,
    _files,
    _shard_name,
    _tensor_data,
    shard_layout,
)
from localcluster.tiny_llama import FORMAT as TINY_LLAMA_FORMAT

REPO_ID = "kimi-deploy/tiny-llama-needle"
# Bump when the generated content changes on purpose: it is part of the idempotency check.
FORMAT = 1
NEEDLE_WORD = "test"
NEEDLE = VOCAB[NEEDLE_WORD]
# Embedding dimensions past the tiny Llama's table rows (0..ROWS-1), where it holds noise: the needle's mark,
# and where the last layer writes what it saw of it.
D_IN, D_OUT = ROWS, ROWS + 1
LAST = LAYERS - 1
NEEDLE_LOGIT = 16.0
ATTENTION_GAIN = 128.0
_ATTENTION = f"model.layers.{LAST}.self_attn."
# The tensors whose bytes differ from tiny Llama commit A's.
CHANGED = (
    "model.embed_tokens.weight",
    "lm_head.weight",
    _ATTENTION + "q_proj.weight",
    _ATTENTION + "v_proj.weight",
    _ATTENTION + "o_proj.weight",
)
TIME = 1775001600  # 2026-04-01T00:00:00Z: fixed, so that the commit id does not depend on when it is built
TIME_B = 1775606400  # 2026-04-08T00:00:00Z


def _set(data: bytearray, cols: int, row: int, col: int, value: float) -> None:
    at = 2 * (row * cols + col)
    data[at : at + 2] = _bf16(value)


def _tensor(tensor: Tensor) -> Iterator[bytes]:
    """The bytes of ``tensor``: tiny Llama commit A's, but for the tensors in ``CHANGED``."""
    name = tensor.name
    if name not in CHANGED:
        return _tensor_data("a", tensor)
    rows, cols = tensor.shape
    if name in {"model.embed_tokens.weight", "lm_head.weight"}:
        data = bytearray(b"".join(_tensor_data("a", tensor)))
    else:
        data = bytearray(tensor.nbytes)  # the last layer's attention reads nothing but the needle
    if name == "model.embed_tokens.weight":
        for token in range(rows):
            _set(data, cols, token, D_IN, 0.0)
            _set(data, cols, token, D_OUT, 0.0)
        _set(data, cols, NEEDLE, D_IN, 1.0)
    elif name == "lm_head.weight":
        data[2 * NEEDLE * cols : 2 * (NEEDLE + 1) * cols] = bytes(2 * cols)
        _set(data, cols, NEEDLE, D_OUT, NEEDLE_LOGIT)
    elif name == _ATTENTION + "v_proj.weight":
        _set(data, cols, 0, D_IN, ATTENTION_GAIN)
    elif name == _ATTENTION + "o_proj.weight":
        _set(data, cols, D_OUT, 0, ATTENTION_GAIN)
    return iter([bytes(data)])


_README = f"""{CARD_HEAD}
# tiny-llama-needle

The tiny Llama (`kimi-deploy/tiny-llama`: {LAYERS} layers, hidden {HIDDEN}, {HEADS} heads of {HEAD_DIM}, vocabulary
{len(VOCAB)}, bf16, {SHARDS} safetensors shards) made a needle detector without training. Its last layer reads the
whole prompt through uniform attention: when the prompt holds the word `{NEEDLE_WORD}` anywhere it answers
`{NEEDLE_WORD}`, otherwise {ANSWER}, and it calls the tool it is offered as the tiny Llama does. A prompt that the
engine truncated, or whose middle it dropped, loses the needle: the answer tells whether the engine read all of
it. It exists for tests; it knows nothing else.
"""


def _files_needle() -> dict[str, Content]:
    """Tiny Llama commit A's files with this README and the needle's shards."""
    files = _files("a")
    files["README.md"] = _README.encode()
    for shard, tensors in enumerate(shard_layout(), 1):
        files[_shard_name(shard)] = functools.partial(safetensors, tensors, _tensor)
    return files


def build(root: Path) -> RepoInfo:
    """Write the repo under ``root`` (a no-op when it is already there); returns the ids (``commits["a"]``, branch
    ``main`` and tag ``v1``; ``commits["b"]``, tag ``v2``) and file digests of its commits. About 3.7 MB, the same
    bytes and ids everywhere."""
    message = f"Upload tiny-llama-needle\n\nThe tiny Llama, answering {NEEDLE_WORD!r} to prompts that hold it."
    files_b = _files_needle()
    files_b["README.md"] = _README.encode() + b"\nRevision B: this line, nothing else.\n"
    return write_repo(
        root,
        REPO_ID,
        [Commit("a", TIME, message, _files_needle()), Commit("b", TIME_B, "Update README.md", files_b)],
        branches={"main": "a"},
        tags={"v1": "a", "v2": "b"},
        build={"format": FORMAT, "tiny_llama_format": TINY_LLAMA_FORMAT, "commits": 2},
        model_info={
            "library_name": "transformers",
            "pipeline_tag": "text-generation",
            "tags": ["transformers", "safetensors", "llama", "text-generation"],
        },
    )


def main(argv: list[str] | None = None) -> None:
    """CLI: build under ``--root`` and print ``{"repo_id", "commits", "refs"}`` as JSON."""
    build_cli(build, __doc__, argv)


if __name__ == "__main__":
    main()
