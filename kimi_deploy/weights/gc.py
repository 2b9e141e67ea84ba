"""Which revisions of a model a host may delete: all but the one it serves and its rollback copy.

Pure: decided from the host probe (revision folders present, the revisions of the releases the host
switched to, oldest first). Called only once the planned revision is verified and serving.
"""

from __future__ import annotations

from collections.abc import Sequence


def collectable(present: Sequence[str], history: Sequence[str], planned: str) -> list[str]:
    """Revision folders to remove: every one but ``planned`` and the rollback copy, which is the
    revision of the latest release that served another revision and is still on disk."""
    previous = next((r for r in reversed(history) if r != planned and r in present), None)
    return sorted(r for r in present if r not in (planned, previous))
