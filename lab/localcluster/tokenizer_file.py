"""``tokenizer.json`` in the ``tokenizers`` library's own format, for the fake Hub's model repos.

``tokenizer_json(...)`` gives the document ``tokenizers.Tokenizer.to_str()`` writes for a tokenizer with no
normalizer, post-processor, truncation or padding, whose added tokens are all special: key for key, in the
library's order, so ``Tokenizer.from_str`` loads it and writes it back unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def tokenizer_json(
    *,
    special: Iterable[tuple[int, str]],
    pre_tokenizer: dict[str, Any] | None,
    decoder: dict[str, Any] | None,
    model: dict[str, Any],
) -> dict[str, Any]:
    """The document for ``model`` (its JSON: ``{"type": "BPE", ...}``) with ``special`` tokens (id, content)
    split out before pre-tokenization and never normalized."""
    added = [
        {
            "id": token_id,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for token_id, content in special
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": decoder,
        "model": model,
    }
