"""Writing safetensors files whose every byte is fixed by their description, for the fake Hub's model repos.

``safetensors(tensors, data)`` streams a valid file (the format ``safetensors``, transformers and vLLM read);
``noise(seed, size)`` is pseudo-random content that is the same on every machine (SHAKE-256).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {"BF16": 2, "U8": 1, "F32": 4}
_NOISE_BLOCK = 4 << 20


@dataclass(frozen=True)
class Tensor:
    """One tensor's name, safetensors dtype (a key of ``DTYPE_BYTES``) and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = DTYPE_BYTES[self.dtype]
        for dim in self.shape:
            count *= dim
        return count


def noise(seed: str, size: int) -> Iterator[bytes]:
    """``size`` pseudo-random bytes fixed by ``seed``, in blocks (SHAKE-256 is the same everywhere)."""
    for block, start in enumerate(range(0, size, _NOISE_BLOCK)):
        yield hashlib.shake_256(f"{seed}#{block}".encode()).digest(min(_NOISE_BLOCK, size - start))


def safetensors(tensors: list[Tensor], data: Callable[[Tensor], Iterable[bytes]]) -> Iterator[bytes]:
    """A valid safetensors file: u64 LE header length, JSON header (space-padded to 8 bytes), tensor data.

    Tensors are stored in name order; ``data(tensor)`` gives each one's bytes (exactly ``tensor.nbytes``,
    little-endian, row-major). Raises ValueError when it gives another count, before the file is complete.
    """
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
        given = 0
        for chunk in data(t):
            given += len(chunk)
            yield chunk
        if given != t.nbytes:
            raise ValueError(f"tensor {t.name}: {given} bytes of data for {t.dtype} {list(t.shape)} ({t.nbytes} bytes)")
