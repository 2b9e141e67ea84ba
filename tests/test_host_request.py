"""Every host program reads its request in one place (``hostside/request.py``), bounded and
checked: the controller's packed JSON object, or one ``BadRequest`` naming what came instead."""

from __future__ import annotations

import base64
import zlib

import pytest

from kimi_deploy.host.command import pack
from kimi_deploy.host.programs import PROGRAMS
from kimi_deploy.hostside.request import MAX_BYTES, BadRequest, read_request
from tests.conftest import ROOT


def test_a_packed_request_reads_back_as_the_controllers_object() -> None:
    sent = {"units": ["kimi-vllm"], "timeout_s": 30, "nested": {"a": [1, 2]}}
    assert read_request(["prog", pack(sent)]) == sent


@pytest.mark.parametrize(
    ("word", "said"),
    [
        (None, "no request"),
        ("not base64!", "cannot decode the request"),
        (base64.b64encode(b"not zlib").decode(), "cannot decode the request"),
        (base64.b64encode(zlib.compress(b"{not json")).decode(), "cannot decode the request"),
        (base64.b64encode(zlib.compress(b"[1, 2]")).decode(), "a JSON list, not an object"),
    ],
)
def test_anything_else_is_one_bad_request(word: str | None, said: str) -> None:
    with pytest.raises(BadRequest, match=said):
        read_request(["prog"] if word is None else ["prog", word])


def test_a_request_that_inflates_past_the_bound_is_refused_before_it_is_read() -> None:
    bomb = base64.b64encode(zlib.compress(b"[" + b" " * (MAX_BYTES + 1) + b"]", 9)).decode()
    with pytest.raises(BadRequest, match=f"larger than {MAX_BYTES} bytes"):
        read_request(["prog", bomb])


def test_no_host_program_decodes_its_argv_by_itself() -> None:
    decoding = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "kimi_deploy" / "hostside").glob("*.py"))
        if p.name != "request.py" and "b64decode(sys.argv" in p.read_text(encoding="utf-8")
    ]
    assert not decoding, f"{decoding} read argv themselves: use hostside.request.read_request"


def test_every_host_program_is_named_once_in_the_registry() -> None:
    """boot.py is the loader a bundle runs through, not a program of its own."""
    programs = {
        p.name
        for p in (ROOT / "kimi_deploy" / "hostside").glob("*.py")
        if "\ndef main(" in p.read_text(encoding="utf-8")
    }
    assert programs - {"boot.py"} == {p.script for p in PROGRAMS}
    assert len({p.script for p in PROGRAMS}) == len(PROGRAMS)
