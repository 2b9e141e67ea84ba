"""The one line a gated repository gets where the Hub refuses a download: which repository, why
(no token sent, or the token's account not granted access), and what to do; and the one line a
token the Hub no longer takes gets.

The Hub answers a gated repository's files with ``X-Error-Code: GatedRepo``: 401 when the request
carries no token, 403 when the token's account has not been granted access (huggingface_hub 2.4.0
``utils/_http.py``, ``hf_raise_for_status``, which raises ``GatedRepoError`` for that code; the Hub's
"Gated models" documentation: a user accepts the repository's conditions on its page, and downloads
then need a token of that user). The Hub lists a gated repository's files openly
(huggingface/huggingface.js#945), so the refusal comes at the first download, on the hosts.

A token that has expired or was revoked is refused with 401 "Invalid credentials in Authorization
header" on every request, public repositories too (huggingface/huggingface_hub#3368,
deepbeepmeep/Wan2GP#455): the sync asks ``/api/whoami-v2`` once before its first file, and a 401
later (a token revoked during a long sync) gets the same line. Stdlib only: the host programs use it.
"""

from __future__ import annotations

GATED_ERROR = "GatedRepoError"
# huggingface_hub's endpoint when none is given (its constants.ENDPOINT default).
HUB = "https://huggingface.co"


def gated_line(repo: str, endpoint: str, status: int | None) -> str:
    """``repo`` is gated on ``endpoint`` and the download was refused with HTTP ``status``."""
    why = "no token was sent" if status == 401 else "the token's account has not been granted access"
    return (
        f"{repo} is gated and {why}: accept its conditions at {endpoint.rstrip('/')}/{repo} with the account "
        "of the token the controller reads (HF_TOKEN, else huggingface_hub's token file), then run again"
    )


def token_line(endpoint: str, token_file: str | None) -> str:
    """The Hub refused the token the hosts were given (HTTP 401, no gated repository)."""
    where = f" ({token_file}, from the controller)" if token_file else ""
    return (
        f"the Hub token{where} is not valid: 401 Invalid credentials in Authorization header; it has expired or "
        f"was revoked: make a new one at {endpoint.rstrip('/')}/settings/tokens, give it to the controller (HF_TOKEN, "
        "else huggingface_hub's token file) and run again"
    )
