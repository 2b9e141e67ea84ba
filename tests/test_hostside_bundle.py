"""A host program travels alone, with the ``hostside`` modules it imports bundled into one source:
run from argv (``hostside_command``) or from a file, it sees them as ``kimi_deploy.hostside.<name>``."""

from __future__ import annotations

import marshal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kimi_deploy.host import command as hc

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes


@pytest.fixture
def programs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "boundary_a.py").write_text(
        "from __future__ import annotations\nfrom kimi_deploy.hostside.boundary_b import twice\n\n\n"
        "def shout(text: str) -> str:\n    return twice(text.upper())\n"
    )
    (tmp_path / "boundary_b.py").write_text('def twice(text: str) -> str:\n    """Doc."""\n    return text * 2\n')
    (tmp_path / "prog.py").write_text(
        '"""A program."""\n\nfrom __future__ import annotations\n\nimport sys\n\n'
        "from kimi_deploy.hostside.boundary_a import shout\n\n"
        'if __name__ == "__main__":\n    print(shout(sys.argv[1]), __name__)\n'
    )
    (tmp_path / "alone.py").write_text('import sys\nprint("alone", sys.argv[1:])\n')
    monkeypatch.setattr(hc, "HOSTSIDE", tmp_path)
    return tmp_path


def test_bundle_carries_imports_transitively_dependencies_first(programs: Path) -> None:
    source = hc.bundle("prog.py")
    assert list(hc._modules((programs / "prog.py").read_text())) == ["boundary_b", "boundary_a"]
    script = programs / "bundled.py"
    script.write_text(source)
    run = subprocess.run([sys.executable, str(script), "ab"], capture_output=True, text=True, check=True, cwd="/")
    assert run.stdout == "ABAB __main__\n"


def test_hostside_command_runs_the_bundle_from_argv(programs: Path) -> None:
    run = subprocess.run(
        hc.hostside_command(sys.executable, "prog.py", {"x": 1}),
        shell=True,
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(hc.pack({"x": 1}).upper() * 2)


def test_a_program_without_hostside_imports_travels_as_it_is(programs: Path) -> None:
    assert hc.bundle("alone.py") == (programs / "alone.py").read_text()


def test_imports_for_type_checkers_only_stay_out_of_the_bundle(programs: Path) -> None:
    (programs / "typed.py").write_text(
        "from __future__ import annotations\n\nfrom kimi_deploy.hostside import boundary_b\n\n"
        "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from typing import Any\n\n    from kimi_deploy.hostside.boundary_a import shout\n\n"
        "if __name__ == '__main__':\n    print(boundary_b.twice('x'), 'boundary_a' in __import__('sys').modules)\n"
    )
    assert list(hc._modules((programs / "typed.py").read_text())) == ["boundary_b"]
    run = subprocess.run(
        hc.hostside_command(sys.executable, "typed.py", {}),
        shell=True,
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    assert run.stdout == "xx False\n"


def test_the_host_probe_runs_without_importing_typing() -> None:
    """typing costs a converged host's probe several ms on every run: the probe's modules name
    their types for type checkers only."""
    command = hc.hostside_command(sys.executable, "host_probe.py", {"state": {"user": "root"}})
    run = subprocess.run(
        ["/bin/sh", "-c", command],
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "PYTHONPROFILEIMPORTTIME": "1"},
    )
    assert run.stdout.startswith("state "), run.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert "typing" not in imported
    assert "http.client" not in imported
    assert {"json", "subprocess"} <= imported


@pytest.fixture
def kept(programs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The boot's cache in a folder of the test's own (hostside/boot.py's CACHE)."""
    folder = tmp_path / "cache"
    monkeypatch.setattr(hc, "_BOOT", hc._BOOT.replace("'/var/cache/kimi-deploy'", repr(str(folder))))
    hc._shipped.cache_clear()
    hc._bundled.cache_clear()
    yield folder
    hc._shipped.cache_clear()
    hc._bundled.cache_clear()


def _run(script: str, request: object, kept: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        hc.hostside_command(sys.executable, script, request, kept),
        shell=True,
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
    )


def test_a_host_compiles_each_version_of_a_program_once(kept: Path, programs: Path) -> None:
    first = _run("prog.py", "ab")
    assert first.returncode == 0, first.stderr
    [entry] = kept.iterdir()
    assert entry.name.startswith("prog.py-")
    assert entry.stat().st_mode & 0o777 == 0o600
    assert kept.stat().st_mode & 0o777 == 0o700
    before = entry.stat().st_mtime_ns
    assert _run("prog.py", "ab").stdout == first.stdout  # from the kept code: not written again
    assert entry.stat().st_mtime_ns == before
    # a new version of the program replaces the old one's entry
    (programs / "boundary_b.py").write_text("def twice(text: str) -> str:\n    return text * 3\n")
    hc._shipped.cache_clear()
    hc._bundled.cache_clear()
    assert _run("prog.py", "ab").stdout.startswith(hc.pack("ab").upper() * 3)
    [newer] = kept.iterdir()
    assert newer.name != entry.name


def test_kept_code_that_is_damaged_or_writable_by_others_is_never_run(kept: Path) -> None:
    assert _run("alone.py", "x").returncode == 0
    [entry] = kept.iterdir()
    entry.write_bytes(b"\x00garbage")
    assert _run("alone.py", "x").stdout.startswith("alone")  # compiled again, and kept whole
    planted = compile("print('planted')", "planted", "exec")
    entry.write_bytes(marshal.dumps({"": planted}))
    entry.chmod(0o666)
    assert _run("alone.py", "x").stdout.startswith("alone")
    entry.unlink()
    entry.symlink_to(kept.parent / "elsewhere")
    (kept.parent / "elsewhere").write_bytes(marshal.dumps({"": planted}))
    (kept.parent / "elsewhere").chmod(0o600)
    assert _run("alone.py", "x").stdout.startswith("alone")
    # a folder others may write is not used at all
    kept.chmod(0o777)
    entry.unlink()
    assert _run("alone.py", "x").stdout.startswith("alone")
    assert list(kept.iterdir()) == []


def test_a_command_naming_the_kept_copy_runs_it_or_asks_for_the_program(kept: Path, programs: Path) -> None:
    short = hc.hostside_command(sys.executable, "prog.py", "ab", kept=True)
    assert len(short) < len(hc.hostside_command(sys.executable, "prog.py", "ab")) - 100
    # nothing kept yet: the host says so, alone on its line, and runs nothing
    first = _run("prog.py", "ab", kept=True)
    assert (first.returncode, first.stdout) == (0, hc.NOT_KEPT + "\n")
    assert not kept.exists() or list(kept.iterdir()) == []
    whole = _run("prog.py", "ab")
    assert _run("prog.py", "ab", kept=True).stdout == whole.stdout
    # a damaged or planted copy is never run: the host asks for the program again
    [entry] = kept.iterdir()
    entry.write_bytes(b"\x00garbage")
    assert _run("prog.py", "ab", kept=True).stdout == hc.NOT_KEPT + "\n"
    planted = compile("print('planted')", "planted", "exec")
    entry.write_bytes(marshal.dumps({"": planted}))
    entry.chmod(0o666)
    assert _run("prog.py", "ab", kept=True).stdout == hc.NOT_KEPT + "\n"
    # a new version of the program is not the kept one
    entry.unlink()
    assert _run("prog.py", "ab").returncode == 0
    (programs / "boundary_b.py").write_text("def twice(text: str) -> str:\n    return text * 3\n")
    hc._shipped.cache_clear()
    hc._bundled.cache_clear()
    assert _run("prog.py", "ab", kept=True).stdout == hc.NOT_KEPT + "\n"


def test_the_boot_and_the_controller_agree_on_the_not_kept_line() -> None:
    boot = (hc.HOSTSIDE / "boot.py").read_text()
    assert f"NOT_KEPT = {hc.NOT_KEPT!r}" in boot.replace('"', "'")


def test_an_isolated_program_runs_without_the_site_or_the_environment(programs: Path, tmp_path: Path) -> None:
    (tmp_path / "site_only.py").write_text("import sys\nprint('site' in sys.modules, sys.flags.isolated)\n")
    command = hc.hostside_command(sys.executable, "site_only.py", {}, isolated=True)
    run = subprocess.run(command, shell=True, capture_output=True, text=True, check=False, cwd="/")
    assert run.returncode == 0, run.stderr
    assert run.stdout == "False 1\n"
    plain = subprocess.run(
        hc.hostside_command(sys.executable, "site_only.py", {}),
        shell=True,
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
    )
    assert plain.stdout == "True 0\n"
