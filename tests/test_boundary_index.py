"""What a package index's project page lists (hostside/boundary_index.py): the versions of its
files, read in time linear in the page, whatever the page holds.

A page comes from outside the recipe (a mirror, a proxy in front of PyPI): ``validate --index`` and
the host's release installer read up to 16 MiB of it, so a page built to make the reader slow must
not stall either.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from kimi_deploy.hostside.boundary_index import listed_versions
from tests.conftest import ROOT

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

SHA = "0" * 64
# PyPI's simple page as it is served: absolute and relative links, digests in the fragment,
# wheels with build and platform tags, sdists in both spellings.
PAGE = f"""<!DOCTYPE html>
<html><head><meta name="pypi:repository-version" content="1.1"></head><body>
<a href="https://files.example/packages/ab/cd/nvidia_cutlass_dsl-4.1.0-cp312-cp312-manylinux_2_28_x86_64.whl#sha256={SHA}" data-requires-python="&gt;=3.10">nvidia_cutlass_dsl-4.1.0-cp312-cp312-manylinux_2_28_x86_64.whl</a><br />
<a href="../../packages/nvidia-cutlass-dsl-4.0.0.tar.gz#sha256={SHA}">nvidia-cutlass-dsl-4.0.0.tar.gz</a><br />
<a href="/packages/nvidia_cutlass_dsl-4.2.0.dev1-1-py3-none-any.whl">nvidia_cutlass_dsl-4.2.0.dev1-1-py3-none-any.whl</a><br />
<a href="nvidia_cutlass_dsl-4.1.0-cp311-cp311-manylinux_2_28_aarch64.whl#sha256={SHA}">again 4.1.0</a><br />
<a href="nvidia.cutlass_dsl-3.9.zip">an old zip</a><br />
<a href="https://files.example/nvidia_cutlass_dsl-4.1.0.whl.metadata">metadata, not a file</a><br />
</body></html>
"""


def test_a_project_page_lists_its_versions_in_order_each_once() -> None:
    assert listed_versions(PAGE, "nvidia-cutlass-dsl") == ["4.1.0", "4.0.0", "4.2.0.dev1", "3.9"]
    assert listed_versions(PAGE, "nvidia_cutlass_dsl") == ["4.1.0", "4.0.0", "4.2.0.dev1", "3.9"]
    docs = '<a href="https://files.example/nvidia-cutlass-dsl-docs-1.0.tar.gz">'
    assert listed_versions(docs, "nvidia-cutlass-dsl-docs") == ["1.0"]
    assert listed_versions("<html><body></body></html>", "vllm") == []


N = 1 << 20  # 1 MiB pages: the former reader took minutes on each
# Pages built to make the reader slow: its verdict, in time linear in the page.
HOSTILE = {
    "one-href-of-dashes": ("""'<a href="' + 'x-' * (N // 2) + '1.0.tar.gz">'""", "[]"),
    "one-href-of-empty-parts": ("""'<a href="vllm-' + '-' * N + '1.0.tar.gz">'""", "[]"),
    "hrefs-without-ends": ("""'<a href="' * (N // 8)""", "[]"),
    "href-of-slashes": ("""'<a href="' + 'x-1/' * (N // 4) + 'vllm-1.0.whl">'""", "['1.0']"),
    "href-of-hashes": ("""'<a href="vllm-1.0.whl' + '#' * N + '">'""", "['1.0']"),
    "dashes-then-a-normal-page": ("""'<a href="' + 'x-' * (N // 2) + '1.0.tar.gz">' + PAGE""", "['2.0']"),
}


@pytest.mark.parametrize(("expression", "expected"), list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_mebibyte_page_is_read_in_time(expression: str, expected: str) -> None:
    program = textwrap.dedent(f"""
        from kimi_deploy.hostside.boundary_index import listed_versions
        N = {N}
        PAGE = '<a href="../vllm-2.0-py3-none-any.whl#sha256=00">vllm-2.0</a>'
        print(listed_versions({expression}, "vllm"))
    """)
    run = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=20, check=False
    )
    assert (run.returncode, run.stderr) == (0, "")
    assert run.stdout.strip() == expected
