"""The one line a gated repository gets, where the Hub refuses a download: which repository, why
(no token sent, or the token's account not granted access), and what to do.

The Hub answers a gated repository's files with ``X-Error-Code: GatedRepo``: 401 when the request
carries no token, 403 when the token's account has not been granted access (huggingface_hub 2.4.0
``utils/_http.py``, ``hf_raise_for_status``, which raises ``GatedRepoError`` for that code; the Hub's
"Gated models" documentation: a user accepts the repository's conditions on its page, and downloads
then need a token of that user). The Hub lists a gated repository's files openly
(huggingface/huggingface.js#945), so the refusal comes at the first download, on the hosts. Stdlib
only: the host programs use it.
"""

from __future__ import annotations

GATED_ERROR = "GatedRepoError"


def gated_line(repo: str, endpoint: str, status: int | None) -> str:
    """``repo`` is gated on ``endpoint`` and the download was refused with HTTP ``status``."""
    why = "no token was sent" if status == 401 else "the token's account has not been granted access"
    return (
        f"{repo} is gated and {why}: accept its conditions at {endpoint.rstrip('/')}/{repo} with the account "
        "of the token the controller reads (HF_TOKEN, else huggingface_hub's token file), then run again"
    )
