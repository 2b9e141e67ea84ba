"""The same 21-operation workload with plain pyinfra and with Ansible, on N hosts: their no-op re-runs.

    python bench/tool_compare.py [--hosts 4 16 64] [--runs 3] [--keep]

Root only. For each N, the fleet's cluster (``harness.fleet``, no converge of kimi-deploy) and one
workload written both ways: 7 directories, 7 files with a given content, 7 symlinks (pyinfra's
``files.directory``, ``files.put``, ``files.link``; Ansible's ``file``, ``copy``, ``file
state=link``). Each is applied once, then its no-op re-run timed (median of ``--runs``), beside
the floor (connect to every host and read one fact: bench/floor.py). Ansible runs with every host
in parallel (``forks`` = N), pipelining on, no fact gathering and its SSH connections kept open
(ControlPersist), installed in a virtual environment of its own under /var/cache/kimi-bench.
Prints per N the three medians and the ratio of Ansible's no-op to pyinfra's.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness.fleet import FLEET, fleet_arguments, for_each_size, timed
from harness.own_cluster import OWN_INVENTORY

ANSIBLE = "ansible-core==2.19.14"
VENV = Path("/var/cache/kimi-bench/ansible")
COUNT = 7  # of each kind: 21 operations


def _ansible() -> Path:
    """ansible-playbook, installed once into a virtual environment of its own."""
    tool = VENV / "bin" / "ansible-playbook"
    if not tool.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin/pip"), "install", "-q", ANSIBLE], check=True)
    return tool


def _pyinfra_workload(folder: Path) -> Path:
    lines = ["import io", "from pyinfra.operations import files", ""]
    for i in range(COUNT):
        lines.append(f'files.directory(name="directory {i}", path="/srv/bench/d{i}")')
    for i in range(COUNT):
        lines.append(f'files.put(name="file {i}", src=io.StringIO("content {i}\\n"), dest="/srv/bench/f{i}")')
    for i in range(COUNT):
        lines.append(f'files.link(name="link {i}", path="/srv/bench/l{i}", target="/srv/bench/f{i}")')
    path = folder / "workload.py"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _ansible_workload(folder: Path) -> tuple[Path, Path, Path]:
    st = FLEET.state()
    hosts = "\n".join(f"{h['name']} ansible_host={h['address']}" for h in st["hosts"])
    inventory = folder / "hosts.ini"
    inventory.write_text(
        f"[fleet]\n{hosts}\n\n[fleet:vars]\nansible_user=root\nansible_ssh_private_key_file={st['ssh_key']}\n"
        f"ansible_ssh_common_args='-o UserKnownHostsFile={st['known_hosts']} -o StrictHostKeyChecking=yes'\n"
        "ansible_python_interpreter=/usr/bin/python3\n",
        encoding="utf-8",
    )
    tasks = [
        *(
            f"    - name: directory {i}\n      ansible.builtin.file: {{path: /srv/bench/d{i}, state: directory}}"
            for i in range(COUNT)
        ),
        *(
            f'    - name: file {i}\n      ansible.builtin.copy: {{content: "content {i}\\n", dest: /srv/bench/f{i}}}'
            for i in range(COUNT)
        ),
        *(
            f"    - name: link {i}\n      ansible.builtin.file: "
            f"{{path: /srv/bench/l{i}, src: /srv/bench/f{i}, state: link}}"
            for i in range(COUNT)
        ),
    ]
    playbook = folder / "workload.yml"
    playbook.write_text("- hosts: fleet\n  gather_facts: false\n  tasks:\n" + "\n".join(tasks) + "\n", encoding="utf-8")
    config = folder / "ansible.cfg"
    config.write_text(
        f"[defaults]\nforks = {len(st['hosts'])}\nhost_key_checking = True\nstdout_callback = default\n"
        "[ssh_connection]\npipelining = True\nssh_args = -o ControlMaster=auto -o ControlPersist=60s\n",
        encoding="utf-8",
    )
    return inventory, playbook, config


def _playbook(tool: Path, inventory: Path, playbook: Path, config: Path) -> float:
    started = time.perf_counter()
    run = subprocess.run(
        [str(tool), "-i", str(inventory), str(playbook)],
        capture_output=True,
        text=True,
        env={**os.environ, "ANSIBLE_CONFIG": str(config)},
        check=False,
    )
    elapsed = time.perf_counter() - started
    if run.returncode != 0:
        sys.exit(f"ansible-playbook failed:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    return elapsed


def one(n: int, runs: int, folder: Path, tool: Path) -> dict[str, float]:
    FLEET.cli("up", "--hosts", str(n))
    head = OWN_INVENTORY.format(state=str(FLEET.dir / "state.json"), recipe="recipes/demo-gpu.yaml")
    inv = folder / "inventory.py"
    inv.write_text(head + "fleet = _hosts\n", encoding="utf-8")
    deploy = _pyinfra_workload(folder)
    ansible = _ansible_workload(folder)
    first, _ = timed(FLEET, inv, deploy=str(deploy))
    if first.code != 0:
        sys.exit(f"N={n}: the pyinfra workload failed:\n{first.log[-2000:]}")
    _playbook(tool, *ansible)
    pyinfra, playbook, floor = [], [], []
    for _ in range(runs):
        run, seconds = timed(FLEET, inv, deploy=str(deploy))
        if run.code != 0 or run.changed():
            sys.exit(f"N={n}: the pyinfra re-run was not a no-op: {run.changed() or run.log[-1500:]}")
        pyinfra.append(seconds)
        playbook.append(_playbook(tool, *ansible))
        floor.append(timed(FLEET, inv, deploy="bench/floor.py")[1])
    return {
        "pyinfra": statistics.median(pyinfra),
        "ansible": statistics.median(playbook),
        "floor": statistics.median(floor),
    }


def main() -> None:
    args = fleet_arguments(__doc__.splitlines()[0])
    tool = _ansible()

    def line(n: int, folder: Path) -> str:
        row = one(n, args.runs, folder, tool)
        return (
            f"N={n:>3}  21-operation no-op: pyinfra {row['pyinfra']:.2f} s, Ansible {row['ansible']:.2f} s "
            f"(x{row['ansible'] / row['pyinfra']:.1f})  floor {row['floor']:.2f} s"
        )

    for_each_size(args, line)


if __name__ == "__main__":
    main()
