"""The command lines README.md and docs/*.md show, as a reader would type them.

A command line is a line of a fenced ``sh`` (or ``bash``, ``shell``, ``console``) block, or a line
indented four spaces outside any block that starts with a command of the project. In a block
where some lines start with ``$ ``, only those are commands (the others are output). A line
ending in ``\\`` goes on on the next; ``#`` starts a comment. A line is cut into commands at
``&&``, ``||``, ``;`` and ``|``; redirections and their targets are left out, and so are leading
``NAME=value`` assignments. Within one block, the commands after ``cd DIR``, where ``kimi-deploy
init DIR`` made DIR earlier in the block, run in DIR (``site``), and those after a line that
runs ``$EDITOR``, or ``kimi-deploy lock`` (which writes locks from the Hub and the package index),
run on files the reader's own steps changed (``changed``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SHELL_BLOCKS = {"sh", "bash", "shell", "console"}
# what starts a command line indented four spaces outside a block
PROGRAMS = ("kimi-deploy", "pyinfra", ".venv/bin/", "scripts/", "python", "pip")
_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
_SEPARATORS = {"&&", "||", ";", "|", "&"}
_REDIRECTS = {">", ">>", "<", ">&", "<<", "2>", "&>"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Command:
    """One command of a doc: its words, where it is, and where it runs."""

    doc: str  # the file, relative to the repository root
    line: int  # its line in the file (the first, for a line continued)
    words: tuple[str, ...]
    block: int  # which block of the file (-1: an indented line outside any block)
    site: str | None  # the folder ``kimi-deploy init`` made that it runs in, None: where the reader is
    changed: bool  # after the reader's own steps changed files ($EDITOR, kimi-deploy lock)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def program(self) -> str:
        """The program's name, whatever folder it is run from (``.venv/bin/kimi-deploy``: kimi-deploy)."""
        return self.words[0].rsplit("/", 1)[-1] if self.words else ""


def shell_lines(text: str) -> Iterator[tuple[int, int, str]]:
    """(line number, block, text) of every command line of a Markdown text."""
    lines = text.splitlines()
    block, i = -1, 0
    blocks = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence:
            end = i + 1
            while end < len(lines) and not lines[end].strip().startswith(fence.group(1)):
                end += 1
            if fence.group(2) in SHELL_BLOCKS:
                body = list(enumerate(lines[i + 1 : end], start=i + 2))
                prompted = any(t.lstrip().startswith("$ ") for _, t in body)
                if prompted:
                    body = [(n, t.lstrip()[2:]) for n, t in body if t.lstrip().startswith("$ ")]
                yield from ((n, blocks, t) for n, t in _joined(body))
            blocks += 1
            i = end + 1
            continue
        if lines[i].startswith("    ") and lines[i].strip().startswith(PROGRAMS):
            yield from ((n, block, t) for n, t in _joined([(i + 1, lines[i])]))
        i += 1


def _joined(body: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """Lines continued with a trailing backslash joined, blank and comment lines left out."""
    start, held = 0, ""
    for number, text in body:
        if not held:
            start = number
        if text.rstrip().endswith("\\"):
            held += text.rstrip()[:-1] + " "
            continue
        whole = (held + text).strip()
        held = ""
        if whole and not whole.startswith("#"):
            yield start, whole


def segments(text: str) -> list[list[str]]:
    """A shell line's simple commands, each as its words (no redirections, no assignments)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words = list(lexer)
    out: list[list[str]] = [[]]
    i = 0
    while i < len(words):
        word = words[i]
        if word in _SEPARATORS:
            out.append([])
        elif word in _REDIRECTS:
            i += 1  # and its target
        elif not (word.isdigit() and i + 1 < len(words) and words[i + 1] in _REDIRECTS):  # 2> FILE
            out[-1].append(word)
        i += 1
    return [kept for kept in (_unassigned(w) for w in out) if kept]


def _unassigned(words: list[str]) -> list[str]:
    i = 0
    while i < len(words) and _ASSIGNMENT.match(words[i]):
        i += 1
    return words[i:]


def commands(root: Path, doc: Path) -> list[Command]:
    """Every command of ``doc`` (a Markdown file under ``root``), in order."""
    text = doc.read_text(encoding="utf-8")
    rel = str(doc.relative_to(root))
    out: list[Command] = []
    state: dict[int, tuple[str | None, str | None, bool]] = {}  # block -> (made, site, changed)
    for number, block, line in shell_lines(text):
        made, site, changed = state.get(block, (None, None, False))
        try:
            cut = segments(line)
        except ValueError as exc:  # an unclosed quote: no shell would run the line either
            raise ValueError(f"{rel}:{number}: {exc}: {line}") from None
        for words in cut:
            program = words[0].rsplit("/", 1)[-1]
            out.append(Command(rel, number, tuple(words), block, site, changed))
            if program == "kimi-deploy" and words[1:2] == ["init"] and len(words) > 2:
                made = words[2]
            elif program == "cd" and block >= 0:
                site = words[1] if len(words) > 1 and words[1] == made else f"elsewhere: {' '.join(words[1:])}"
            elif program == "$EDITOR" or (program == "kimi-deploy" and words[1:2] == ["lock"]):
                changed = True
        state[block] = (made, site, changed)
    return out
