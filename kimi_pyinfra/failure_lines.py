"""A host program's failure reads as its one line: the ``kimi-deploy:`` reason, said once.

A host program (``hostside/``) that fails prints its answer as JSON on stdout (``"ok": false``
and the details) and its reason on stderr as one ``kimi-deploy: <reason>`` line, at times followed
by lines indented four spaces (a unit's journal tail: ``hostside/smoke.py``). pyinfra prints the
failing command's whole output, then its own ``Error: executed N commands``: one failure said
three times per host, and at fleet size the reasons hide among the JSON. Unless pyinfra runs with
``-v`` (then everything it says stays), a host's failure instead reads as its ``kimi-deploy:``
line and the indented lines after it:

- a host's output line that is a JSON object with ``"ok": false`` goes: every host program that
  fails with one also prints its ``kimi-deploy:`` line (the comm check's probe phase answers
  ``"ok": false`` and exits 0: pyinfra shows no output of a command that succeeds). Any other
  output line stays, JSON or not.
- pyinfra's ``Error: executed N commands`` (with or without its retries) goes for a host whose
  failing operation printed a ``kimi-deploy:`` line. A failure without one (an ``apt-get`` error,
  a command that timed out) keeps it: it is then the line that says the host failed. (A host
  whose SSH connection closed under a step says so in a ``kimi-deploy:`` line of its own:
  ``kimi_pyinfra.dead_peers``.)

Lines are told apart by what pyinfra prints for a host (``[name] `` then the text, colours
aside) and the level it logs them at: a failed command's output and the Error line at ERROR, an
ignored error's line (``Error (ignored): ...``) at WARNING, which stays.
"""

from __future__ import annotations

import json
import logging
import re

# The longest output line read as JSON: a longer one stays as it is, unparsed.
JSON_MAX = 1 << 20
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# A host's line as pyinfra prints it: "[name]", padded to the fleet's longest name, then a space
# ("[name] nested" inside a nested operation); the text after it, its indentation included in
# the spaces matched.
_HOST_LINE = re.compile(r"\[(?P<host>[^\]\s]+)\](?: nested)? *(?P<text>.*)", re.DOTALL)
# pyinfra's line that ends a host's failed operation (pyinfra.api.util.log_error_or_warning).
_ERROR = re.compile(
    r"Error(?: \(ignored(?:, execution continued)?\))?: "
    r"executed \d+ commands(?: \(failed after \d+/\d+ retries\))?"
)
_REASON = "kimi-deploy:"


def failed_answer(text: str) -> bool:
    """Whether ``text`` is a host program's JSON answer that says it failed: an object whose
    ``ok`` is false."""
    text = text.strip()
    if len(text) >= JSON_MAX or not (text.startswith("{") and text.endswith("}")):
        return False
    try:
        answer = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(answer, dict) and answer.get("ok") is False


class FailureLines(logging.Filter):
    """Drops a failed host program's JSON answer, and pyinfra's Error line after its reason."""

    def __init__(self) -> None:
        super().__init__()
        # The hosts whose failing operation printed a ``kimi-deploy:`` line, until its Error line.
        self.reasoned: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        line = _HOST_LINE.match(_ANSI.sub("", record.getMessage()))
        if line is None:
            return True
        host, text = line["host"], line["text"]
        error = _ERROR.fullmatch(text.rstrip())
        if error is not None:
            reasoned = host in self.reasoned
            self.reasoned.discard(host)
            return not (reasoned and record.levelno == logging.ERROR)
        if record.levelno != logging.ERROR:
            return True
        if text.startswith(_REASON):
            self.reasoned.add(host)
            return True
        return not failed_answer(text)
