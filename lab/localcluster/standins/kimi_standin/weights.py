"""A weights directory checked the way a real loader reads it: config, shard index, every shard's header."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"

# Bits per element of each safetensors dtype (sub-byte float formats included, as MXFP4 checkpoints use them).
_DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "E8M0": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U16": 16,
    "I16": 16,
    "F16": 16,
    "BF16": 16,
    "U32": 32,
    "I32": 32,
    "F32": 32,
    "U64": 64,
    "I64": 64,
    "F64": 64,
    "C64": 64,
}
# A header larger than this is corrupt, not a model (safetensors refuses above 100 MB too).
_MAX_HEADER = 100_000_000
# Keys transformers and vLLM read the context length from; the smallest one present counts.
_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


class WeightsError(Exception):
    """The weights cannot be loaded; the message names the file and what is wrong with it."""


@dataclass(frozen=True)
class Weights:
    path: Path
    config: dict[str, Any]
    shards: int
    tensors: int
    bytes: int

    def derived_max_len(self) -> int | None:
        """The longest context ``config.json`` allows (rope scaling applied as vLLM does), if it says."""
        config = self.config
        text = config.get("text_config")
        if not any(isinstance(config.get(k), int) for k in _LENGTH_KEYS) and isinstance(text, dict):
            config = text
        found = [v for k in _LENGTH_KEYS if isinstance(v := config.get(k), int) and not isinstance(v, bool)]
        if not found:
            return None
        derived = min(found)
        rope = config.get("rope_scaling")
        if isinstance(rope, dict):
            kind = rope.get("rope_type", rope.get("type"))
            factor = rope.get("factor")
            if kind not in ("su", "longrope", "llama3") and isinstance(factor, int | float):
                original = rope.get("original_max_position_embeddings")
                if kind == "yarn" and isinstance(original, int):
                    derived = original
                derived = int(derived * factor)
        return derived


def _json_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WeightsError(f"{path.name} is missing") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise WeightsError(f"{path.name} is not readable JSON: {exc}") from None


def read_header(path: Path) -> dict[str, Any]:
    """A shard's tensor table, after checking that its tensors exactly fill the file's data section."""
    name = path.name
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise WeightsError(f"shard {name} is truncated: {size} bytes, no header")
            (length,) = struct.unpack("<Q", head)
            if length > min(size - 8, _MAX_HEADER):
                raise WeightsError(f"shard {name} is truncated or corrupt: a {length}-byte header in {size} bytes")
            raw = f.read(length)
    except FileNotFoundError:
        raise WeightsError(f"shard {name} is missing") from None
    except OSError as exc:
        raise WeightsError(f"shard {name} cannot be read: {exc.strerror}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise WeightsError(f"shard {name} is corrupt: its header is not JSON") from None
    if not isinstance(header, dict):
        raise WeightsError(f"shard {name} is corrupt: its header is not a JSON object")
    data_bytes = size - 8 - length
    spans: list[tuple[int, int, str]] = []
    for tensor, info in header.items():
        if tensor == "__metadata__":
            continue
        spans.append(_span(name, tensor, info))
    covered = 0
    for start, end, tensor in sorted(spans):
        if start != covered:
            raise WeightsError(f"shard {name} is corrupt: tensor {tensor} starts at byte {start}, not {covered}")
        covered = end
    if covered != data_bytes:
        state = "truncated" if covered > data_bytes else "corrupt"
        raise WeightsError(f"shard {name} is {state}: its tensors need {covered} bytes of data, it holds {data_bytes}")
    return header


def _span(shard: str, tensor: str, info: Any) -> tuple[int, int, str]:
    try:
        dtype, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise TypeError(shape)
        count = 1
        for dim in shape:
            count *= dim
    except KeyError as exc:
        raise WeightsError(f"shard {shard} is corrupt: tensor {tensor} lacks {exc.args[0]!r}") from None
    except (TypeError, ValueError):
        raise WeightsError(f"shard {shard} is corrupt: tensor {tensor} has a malformed entry") from None
    bits = _DTYPE_BITS.get(dtype) if isinstance(dtype, str) else None
    if bits is None:
        raise WeightsError(f"shard {shard} is corrupt: tensor {tensor} has unknown dtype {dtype!r}")
    if not (isinstance(start, int) and isinstance(end, int)) or not 0 <= start <= end:
        raise WeightsError(f"shard {shard} is corrupt: tensor {tensor} has data_offsets {[start, end]}")
    if end - start != (count * bits + 7) // 8:
        raise WeightsError(f"shard {shard} is corrupt: tensor {tensor} ({dtype} {shape}) spans {end - start} bytes")
    return start, end, tensor


def check(path: Path) -> Weights:
    """Check everything a real engine reads at start; raise WeightsError on the first problem."""
    if not path.is_dir():
        raise WeightsError(f"{path} is not a directory")
    config = _json_file(path / CONFIG_FILE)
    if not isinstance(config, dict):
        raise WeightsError(f"{CONFIG_FILE} is not a JSON object")
    index = _json_file(path / INDEX_FILE)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise WeightsError(f"{INDEX_FILE} has no weight_map")
    by_shard: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or ".." in PurePosixPath(shard).parts or shard.startswith("/"):
            raise WeightsError(f"{INDEX_FILE} maps {tensor} to {shard!r}, not a file of the model directory")
        by_shard.setdefault(shard, []).append(tensor)
    total = 0
    for shard in sorted(by_shard):
        header = read_header(path / shard)
        absent = [t for t in by_shard[shard] if t not in header]
        if absent:
            raise WeightsError(f"shard {shard} lacks tensor {absent[0]} that {INDEX_FILE} places there")
        total += (path / shard).stat().st_size
    return Weights(path=path, config=config, shards=len(by_shard), tensors=len(weight_map), bytes=total)
