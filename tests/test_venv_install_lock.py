"""A lock text is another host's word: only hashed ``name==version`` pins of the recipe's versions
are installed, and anything else is refused in one line before uv ever runs (an install runs as
root: a direct reference to an sdist, an editable path or another index would run its code).

The rule (``hostside/boundary_lock.py``) is tested on locks uv wrote (``fixtures/locks``, see
SOURCES.md there) and on the attacks; the host program (``hostside/venv_install.py``, bundled as
hosts run it) with a stand-in ``uv`` that records every call it gets.
"""

from __future__ import annotations

import base64
import hashlib
import json
import platform
import re
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.hostside.boundary_lock import check_lock, freeze_pins, lock_pins
from kimi_deploy.hostside.boundary_text import shown
from tests.bundled import bundled_program

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

LOCKS = Path(__file__).resolve().parent / "fixtures" / "locks"
ENGINE_LOCK = (LOCKS / "vllm-0.34.0+fastsafetensors-0.5.0.txt").read_text(encoding="utf-8")
TOOLS_LOCK = (LOCKS / "huggingface_hub-2.4.0.txt").read_text(encoding="utf-8")
REQS = ["vllm==0.34.0", "fastsafetensors==0.5.0"]
HASH = "--hash=sha256:" + "0" * 64
RULE = "a lock holds only name==version lines, each with --hash=sha256:<64 hex>"
EVIL_SDIST = "evil @ file:///tmp/evil-1.0.tar.gz"
EVIL_URL = f"evil @ https://files.example/evil-1.0-py3-none-any.whl {HASH}"


def test_locks_as_uv_writes_them_give_their_pins() -> None:
    assert check_lock(ENGINE_LOCK, REQS) == {"fastsafetensors": "0.5.0", "vllm": "0.34.0"}
    tools = check_lock(TOOLS_LOCK, ["huggingface_hub==2.4.0"])
    assert len(tools) == 15
    assert (tools["huggingface-hub"], tools["idna"], tools["pyyaml"]) == ("2.4.0", "3.20", "6.0.4")
    # A release pinned as 2.4 is the 2.4.0 the index serves; torch==2.13.0 is its CPU build too.
    assert check_lock(TOOLS_LOCK, ["huggingface_hub==2.4"])["huggingface-hub"] == "2.4.0"
    cpu = f"# platform: cp311-x86_64\ntorch==2.13.0+cpu \\\n    {HASH}\n"
    assert check_lock(cpu, ["torch==2.13.0"]) == {"torch": "2.13.0+cpu"}
    with pytest.raises(ValueError, match=r"^the lock pins torch==2\.13\.0\+cpu, the recipe torch==2\.13\.0\+cu128$"):
        check_lock(cpu, ["torch==2.13.0+cu128"])
    with pytest.raises(ValueError, match=r"^the lock pins torch==2\.13\.0\+cpu, the recipe torch==2\.13\.1$"):
        check_lock(cpu, ["torch==2.13.1"])


def _with(*lines: str) -> str:
    """The engine lock with ``lines`` in place of its first pin (after the two header lines)."""
    head = ENGINE_LOCK.splitlines(keepends=True)
    return "".join(head[:2]) + "".join(f"{line}\n" for line in lines) + "".join(head[4:])


# (the lock text, the one line it is refused with)
ATTACKS = {
    "direct reference to an sdist": (
        _with(EVIL_SDIST),
        f"line 3: '{EVIL_SDIST}': a direct reference (URL or path): {RULE}",
    ),
    "direct reference with a hash": (
        _with(EVIL_URL),
        f"line 3: {shown(EVIL_URL)}: a direct reference (URL or path): {RULE}",
    ),
    "git URL": (
        _with("git+https://git.example/evil.git@main"),
        f"line 3: 'git+https://git.example/evil.git@main': a direct reference (URL or path): {RULE}",
    ),
    "editable path": (_with("-e /tmp/evil"), f"line 3: '-e /tmp/evil': an option: {RULE}"),
    "another index": (
        _with("--index-url http://evil.example/simple", f"fastsafetensors==0.5.0 {HASH}"),
        f"line 3: '--index-url http://evil.example/simple': an option: {RULE}",
    ),
    "an extra index": (
        _with("--extra-index-url=http://evil.example/simple", f"fastsafetensors==0.5.0 {HASH}"),
        f"line 3: '--extra-index-url=http://evil.example/simple': an option: {RULE}",
    ),
    "find links": (
        _with("-f /tmp/wheels", f"fastsafetensors==0.5.0 {HASH}"),
        f"line 3: '-f /tmp/wheels': an option: {RULE}",
    ),
    "another requirements file": (_with("-r /tmp/more.txt"), f"line 3: '-r /tmp/more.txt': an option: {RULE}"),
    "no hash": (_with("fastsafetensors==0.5.0"), f"line 3: fastsafetensors==0.5.0 carries no --hash=sha256: {RULE}"),
    "an option after the hashes": (
        _with("fastsafetensors==0.5.0 \\", f"    {HASH} \\", "    --trusted-host evil.example"),
        f"line 3: '--trusted-host' after fastsafetensors==0.5.0: an option: {RULE}",
    ),
    "a weaker hash": (
        _with(f"fastsafetensors==0.5.0 --hash=md5:{'0' * 32}"),
        f"line 3: '--hash=md5:{'0' * 32}' after fastsafetensors==0.5.0: not a --hash=sha256:<64 hex> of a pin: {RULE}",
    ),
    "a marker": (
        _with(f'fastsafetensors==0.5.0 ; python_version >= "3" {HASH}'),
        f"line 3: ';' after fastsafetensors==0.5.0: an environment marker: {RULE}",
    ),
    "extras": (
        _with(f"fastsafetensors[evil]==0.5.0 {HASH}"),
        f"line 3: {shown(f'fastsafetensors[evil]==0.5.0 {HASH}')}: extras: {RULE}",
    ),
    "a carriage return hiding a line": (
        _with(f"fastsafetensors==0.5.0 {HASH}\r-e /tmp/evil"),
        "line 3: character 0x0d: a lock holds printable ASCII only",
    ),
    "a comment continued onto a requirement": (
        _with("# header \\", "-e /tmp/evil"),
        f"line 3: a comment continued on the next line: {RULE}",
    ),
    "a pin continued past the end": (
        ENGINE_LOCK + "evil==1.0 \\\n",
        f"line 7: 'evil==1.0' continues past the end of the lock: {RULE}",
    ),
    "a package pinned twice": (
        ENGINE_LOCK + f"VLLM==0.34.1 {HASH}\n",
        f"line 7: VLLM==0.34.1: vllm is pinned twice: {RULE}",
    ),
    "nothing pinned": ("# platform: cp311-x86_64\n", f"line 1: the lock pins no package: {RULE}"),
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_lock_with_anything_but_hashed_pins_is_refused_in_one_line(attack: str) -> None:
    text, line = ATTACKS[attack]
    with pytest.raises(ValueError, match=re.escape(line)) as refused:
        lock_pins(text)
    assert str(refused.value) == line
    assert "\n" not in line


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (ENGINE_LOCK.replace("vllm==0.34.0", "vllm==0.34.1"), "the lock pins vllm==0.34.1, the recipe vllm==0.34.0"),
        (
            TOOLS_LOCK,
            "the lock does not pin vllm==0.34.0 (it pins anyio, click, filelock, fsspec, h11, hf-xet, httpcore2, "
            "httpx2, huggingface-hub, idna, packaging, pyyaml, tqdm, truststore, typing-extensions)",
        ),
    ],
)
def test_a_lock_of_other_versions_than_the_recipe_is_refused(text: str, line: str) -> None:
    with pytest.raises(ValueError, match=re.escape(line)) as refused:
        check_lock(text, REQS)
    assert str(refused.value) == line


def test_what_uv_installed_is_read_as_pins_only() -> None:
    assert freeze_pins("fastsafetensors==0.5.0\nVLLM==0.34.0\n") == {"fastsafetensors": "0.5.0", "vllm": "0.34.0"}
    with pytest.raises(ValueError, match=r"^line 2: 'evil @ file:///tmp/evil-1\.0\.tar\.gz': a direct reference"):
        freeze_pins(f"vllm==0.34.0\n{EVIL_SDIST}\n")


SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
# The stand-in uv: every call recorded; ``venv`` makes the folder, ``pip sync`` writes the files
# of installed.json into the venv's site-packages.
FAKE_UV = f"""\
import json, os, sys
here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(here, "calls.jsonl"), "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1] == "venv":
    os.makedirs(os.path.join(sys.argv[-1], "bin"))
    os.makedirs(os.path.join(sys.argv[-1], "{SITE}"))
elif sys.argv[1:3] == ["pip", "sync"]:
    venv = os.path.dirname(os.path.dirname(sys.argv[sys.argv.index("--python") + 1]))
    with open(os.path.join(here, "installed.json")) as listed:
        for name, text in json.load(listed).items():
            os.makedirs(os.path.dirname(os.path.join(venv, "{SITE}", name)), exist_ok=True)
            with open(os.path.join(venv, "{SITE}", name), "w") as out:
                out.write(text)
"""


def _dist(name: str, version: str, **more: str) -> dict[str, str]:
    """The files a wheel of ``name`` ``version`` installs, as {path in site-packages: text}."""
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nName: not a header here\n"
    return {f"{name.replace('-', '_')}-{version}.dist-info/METADATA": meta, f"{name}/__init__.py": "", **more}


class Host:
    """A host's folders for one install: the stand-in uv, the release path, the staged locks."""

    def __init__(self, tmp_path: Path) -> None:
        self.uv = tmp_path / "uv-0.13.9"
        (self.uv / "bin").mkdir(parents=True)
        (self.uv / "bin/uv").write_text(f"#!{sys.executable}\n{FAKE_UV}", encoding="utf-8")
        (self.uv / "bin/uv").chmod(0o755)
        (self.uv / ".kimi-release.json").write_text('{"package": "uv"}', encoding="utf-8")
        self.installs({**_dist("fastsafetensors", "0.5.0"), **_dist("vLLM", "0.34.0")})
        self.path = tmp_path / "engines/vllm-0.34.0+fastsafetensors-0.5.0"
        self.program = bundled_program("venv_install.py", tmp_path)

    def install(self, lock: dict[str, str] | None, **more: Any) -> tuple[int, dict[str, Any], str]:
        request = {
            "path": str(self.path),
            "requirements": REQS,
            "index_url": "http://127.0.0.1:9/simple",
            "marker": {"package": "vllm", "version": "0.34.0", "requirements": REQS},
            "uv": {"version": "0.13.9", "dir": str(self.uv)},
            "lock": lock,
            **more,
        }
        packed = base64.b64encode(zlib.compress(json.dumps(request).encode())).decode()
        done = subprocess.run(
            [sys.executable, str(self.program), packed], capture_output=True, text=True, check=False, timeout=60
        )
        return done.returncode, json.loads(done.stdout.splitlines()[-1]), done.stderr

    def installs(self, files: dict[str, str]) -> None:
        """What ``uv pip sync`` puts in site-packages: {path: text}."""
        (self.uv / "installed.json").write_text(json.dumps(files), encoding="utf-8")

    def calls(self) -> list[list[str]]:
        log = self.uv / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _platform_lock(text: str) -> str:
    """``text`` as a lock resolved for the platform the tests run on."""
    here = f"cp{sys.version_info.major}{sys.version_info.minor}-{platform.machine()}"
    return text.replace("# platform: cp311-x86_64", f"# platform: {here}")


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_bad_lock_given_is_refused_before_uv_runs(tmp_path: Path, attack: str) -> None:
    host = Host(tmp_path)
    text, line = ATTACKS[attack]
    code, answer, stderr = host.install({"text": _platform_lock(text)})
    assert code == 1
    assert answer == {"ok": False, "error": f"{host.path}: the lock given is refused: {line}"}
    assert stderr == f"kimi-deploy: {answer['error']}\n"
    assert host.calls() == []
    assert not host.path.parent.exists()


def test_a_lock_given_with_other_versions_than_the_recipe_is_refused_before_uv_runs(tmp_path: Path) -> None:
    host = Host(tmp_path)
    text = ENGINE_LOCK.replace("vllm==0.34.0", "vllm==0.34.1")
    code, answer, _ = host.install({"text": _platform_lock(text)})
    assert (code, answer["error"]) == (
        1,
        f"{host.path}: the lock given is refused: the lock pins vllm==0.34.1, the recipe vllm==0.34.0",
    )
    assert host.calls() == []


def test_a_good_lock_is_installed_with_hashes_required_and_wheels_only(tmp_path: Path) -> None:
    host = Host(tmp_path)
    text = _platform_lock(ENGINE_LOCK)
    code, answer, stderr = host.install({"text": text})
    assert (code, answer["lock"], answer["packages"]) == (0, "given", 2), stderr
    assert (host.path / ".kimi-lock.txt").read_text() == text
    (sync,) = [call for call in host.calls() if call[:2] == ["pip", "sync"]]
    assert {"--require-hashes", "--no-build"} <= set(sync)
    assert sync[-1] == f"{host.path}.kimi-new/.kimi-lock.txt"
    # What is installed, read from the distributions' metadata, and their bytecode.
    assert (host.path / ".kimi-freeze.txt").read_text() == "fastsafetensors==0.5.0\nvllm==0.34.0\n"
    assert list((host.path / SITE / "vLLM/__pycache__").glob("__init__.*.pyc"))


def test_no_lock_given_is_resolved_on_the_host_but_refused(tmp_path: Path) -> None:
    host = Host(tmp_path)
    code, answer, _ = host.install(None)
    assert (code, answer["error"]) == (1, f"{host.path}: no lock given (the controller resolves every release's lock)")
    assert [call[:2] for call in host.calls() if call[0] == "pip"] == []
    assert not host.path.exists()


def test_a_lock_for_another_platform_is_refused_before_uv_installs(tmp_path: Path) -> None:
    host = Host(tmp_path)
    other = ENGINE_LOCK.replace("# platform: cp311-x86_64", "# platform: cp312-aarch64")
    code, answer, _ = host.install({"text": other})
    here = f"cp{sys.version_info.major}{sys.version_info.minor}-{platform.machine()}"
    assert (code, answer["error"]) == (
        1,
        f"{host.path}: the lock given is for another platform ('# platform: cp312-aarch64'), this host is {here}",
    )
    assert [call[:2] for call in host.calls() if call[:2] == ["pip", "sync"]] == []
    assert not host.path.exists()


def test_a_releases_own_lock_is_checked_before_a_rebuild(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.path.mkdir(parents=True)
    text = _platform_lock(_with(EVIL_SDIST))
    (host.path / ".kimi-lock.txt").write_text(text, encoding="utf-8")
    code, answer, _ = host.install({"own": hashlib.sha256(text.encode()).hexdigest()})
    assert code == 1
    assert answer["error"] == (
        f"{host.path}: the lock (own) is refused: line 3: '{EVIL_SDIST}': a direct reference (URL or path): {RULE}"
    )
    assert host.calls() == []
    assert (host.path / ".kimi-lock.txt").read_text() == text


GOOD = {**_dist("fastsafetensors", "0.5.0"), **_dist("vLLM", "0.34.0")}
META = "fastsafetensors-0.5.0.dist-info/METADATA"


@pytest.mark.parametrize(
    ("files", "error"),
    [
        (
            {**GOOD, **_dist("evil", "1.0")},
            "installed [('evil', '1.0'), ('fastsafetensors', '0.5.0'), ('vllm', '0.34.0')], "
            "the lock has [('fastsafetensors', '0.5.0'), ('vllm', '0.34.0')]",
        ),
        (
            {**GOOD, **_dist("vLLM", "0.34.1")},
            f"{SITE}/'vLLM-0.34.1.dist-info/METADATA': vllm is installed twice",
        ),
        (
            {**_dist("vLLM", "0.34.1"), **_dist("fastsafetensors", "0.5.0")},
            "installed [('fastsafetensors', '0.5.0'), ('vllm', '0.34.1')], "
            "the lock has [('fastsafetensors', '0.5.0'), ('vllm', '0.34.0')]",
        ),
        (
            {**GOOD, META: f"Name: {EVIL_SDIST}\nVersion: 0.5.0\n"},
            f"{SITE}/'{META}': Name: '{EVIL_SDIST}': not a package name",
        ),
        ({**GOOD, META: "Name: fastsafetensors\n"}, f"{SITE}/'{META}': no Version: header in its first 65536 bytes"),
        (
            {**GOOD, META: "Name: fastsafetensors\nVersion: 0.5.0\x1b[2J\n"},
            f"{SITE}/'{META}': Version: '0.5.0\\x1b[2J': not a PEP 440 version",
        ),
    ],
)
def test_an_install_that_is_not_the_locks_pins_fails_in_one_line(
    tmp_path: Path, files: dict[str, str], error: str
) -> None:
    host = Host(tmp_path)
    host.installs(files)
    code, answer, _ = host.install({"text": _platform_lock(ENGINE_LOCK)})
    assert (code, answer["error"]) == (1, f"{host.path}: {error}")
    assert not host.path.exists()
    assert not (tmp_path / f"{host.path}.kimi-new").exists()


def test_what_is_installed_compares_to_the_lock_in_normalized_spellings(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.installs({**_dist("FastSafeTensors", "v0.5.0"), **_dist("vllm", "0.34.0")})
    code, answer, stderr = host.install({"text": _platform_lock(ENGINE_LOCK)})
    assert (code, answer.get("packages")) == (0, 2), stderr
    assert (host.path / ".kimi-freeze.txt").read_text() == "fastsafetensors==0.5.0\nvllm==0.34.0\n"


def test_a_module_that_does_not_compile_is_left_to_python_as_uv_leaves_it(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.installs({**GOOD, "vLLM/py2_only.py": "print 'hello'\n"})
    code, answer, stderr = host.install({"text": _platform_lock(ENGINE_LOCK)})
    assert (code, answer.get("packages")) == (0, 2), stderr
    assert list((host.path / SITE / "vLLM/__pycache__").glob("__init__.*.pyc"))
