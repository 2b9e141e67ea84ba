"""The kernel limits ``cluster up`` raises: only where the new hosts would pass them, never lowered,
and a limit that cannot be raised stops it with one line naming the limit."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster import kernel_limits

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


def _proc(folder: Path, instances: int, watches: int) -> Path:
    sysctl = folder / "sys" / "fs" / "inotify"
    sysctl.mkdir(parents=True)
    (sysctl / "max_user_instances").write_text(f"{instances}\n")
    (sysctl / "max_user_watches").write_text(f"{watches}\n")
    return folder


def _value(proc: Path, name: str) -> int:
    return int(proc.joinpath("sys", *name.split(".")).read_text())


def test_a_limit_the_new_hosts_would_pass_is_raised_with_a_line_and_one_that_suffices_is_left(tmp_path: Path) -> None:
    proc = _proc(tmp_path, instances=128, watches=10**7)
    said = kernel_limits.ensure(64, proc=proc)
    want = 16 * 64 + 128
    assert _value(proc, "fs.inotify.max_user_instances") == want
    assert said == [f"fs.inotify.max_user_instances: raised 128 -> {want} for 64 more hosts (never lowered again)"]
    assert _value(proc, "fs.inotify.max_user_watches") == 10**7


def test_nothing_is_lowered_and_no_new_host_changes_nothing(tmp_path: Path) -> None:
    proc = _proc(tmp_path, instances=100_000, watches=100)
    assert kernel_limits.ensure(0, proc=proc) == []
    assert _value(proc, "fs.inotify.max_user_watches") == 100
    kernel_limits.ensure(4, proc=proc)
    assert _value(proc, "fs.inotify.max_user_instances") == 100_000
    assert _value(proc, "fs.inotify.max_user_watches") == 4 * 1024 + 65536


def test_instances_in_use_are_counted_per_file_descriptor_of_the_users_processes(tmp_path: Path) -> None:
    # a /proc of its own: two processes of this user holding 2 and 1 inotify objects among other files
    for pid, links in {
        "101": ["anon_inode:inotify", "anon_inode:inotify", "/dev/null"],
        "202": ["anon_inode:[eventfd]", "anon_inode:inotify"],
        "303": [],
    }.items():
        (tmp_path / pid / "fd").mkdir(parents=True)
        (tmp_path / pid / "status").write_text("Name: x\n")
        for n, target in enumerate(links):
            (tmp_path / pid / "fd" / str(n)).symlink_to(target)
    (tmp_path / "self").mkdir()  # not a process
    assert kernel_limits.inotify_instances(uid=os.geteuid(), proc=tmp_path) == 3
    assert kernel_limits.inotify_instances(uid=os.geteuid() + 1, proc=tmp_path) == 0


def test_this_process_inotify_objects_are_seen_on_the_machine() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fds = [libc.inotify_init() for _ in range(3)]
    try:
        assert all(fd >= 0 for fd in fds)
        mine = [str(os.readlink(f"/proc/self/fd/{fd}")) for fd in fds]
        assert mine == ["anon_inode:inotify"] * 3  # the link the count looks for
        assert kernel_limits.inotify_instances(uid=os.geteuid()) >= 3
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_limit_that_cannot_be_raised_stops_with_one_line_naming_it(tmp_path: Path) -> None:
    # a /proc/sys that refuses writes, as in a container: a read-only mount of a private namespace
    script = f"""
import sys
from localcluster import kernel_limits
from localcluster.state import ClusterError
try:
    kernel_limits.ensure(64, proc=__import__("pathlib").Path({str(tmp_path)!r}))
except ClusterError as exc:
    print(exc); sys.exit(2)
"""
    shell = (
        f"mount -t tmpfs none {tmp_path} && mkdir -p {tmp_path}/sys/fs/inotify && "
        f"echo 128 > {tmp_path}/sys/fs/inotify/max_user_instances && "
        f"echo 100000000 > {tmp_path}/sys/fs/inotify/max_user_watches && "
        f'mount -o remount,ro {tmp_path} && exec {sys.executable} -c "$SCRIPT"'
    )
    run = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", shell],
        env={**os.environ, "SCRIPT": script},
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("fs.inotify.max_user_instances is 128, 64 more hosts need 1152")
    assert "sysctl -w fs.inotify.max_user_instances=1152" in lines[0]
