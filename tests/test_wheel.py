"""The built wheel runs without a checkout: ``kimi-deploy init`` writes a folder of one's own, and
from there ``kimi-deploy plan`` and the deploys run from the installed package alone.

The wheel is built from this checkout (``pip wheel``) and installed, without its dependencies,
into a folder of its own; every command then runs in the folder ``init`` wrote, with that install
first on the path and the checkout nowhere on it (the modules' own paths are checked).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import PROD, RECIPE, ROOT

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

# The product's top-level packages: all that ``pip install kimi-deploy`` puts in site-packages (the
# lab's cluster and harness are a distribution of their own: lab/pyproject.toml)
PACKAGES = ("kimi_deploy", "kimi_pyinfra")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy of the checkout's files: setuptools builds in the source tree (build/),
    # where files of an earlier build would go into this one.
    source = tmp_path_factory.mktemp("source") / "kimi-deploy"
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for name in listed:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--disable-pip-version-check",
            str(source),
            "-w",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (built,) = out.glob("kimi_deploy-*.whl")
    return built


@pytest.fixture(scope="module")
def site(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The wheel installed in a folder of its own, and a folder ``kimi-deploy init`` wrote."""
    target = tmp_path_factory.mktemp("installed")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    env = {**os.environ, "PYTHONPATH": str(target), "PYTHONDONTWRITEBYTECODE": "1"}
    folder = tmp_path_factory.mktemp("mysite")
    run = subprocess.run(
        [sys.executable, "-m", "kimi_pyinfra.cli", "init", str(folder)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    return folder, env


def test_the_wheel_carries_the_deploys_host_programs_templates_and_examples(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {
        "deploys": sorted(p.name for p in (ROOT / "deploys").glob("*.py")),
        "hostside": sorted(p.name for p in (ROOT / "kimi_deploy" / "hostside").glob("*.py")),
        "templates": sorted(p.name for p in (ROOT / "templates").glob("*.j2")),
        "recipes": sorted(p.name for p in (ROOT / "recipes").glob("*.yaml")),
    }
    inside = {
        "deploys": "kimi_pyinfra/deploys",
        "hostside": "kimi_deploy/hostside",
        "templates": "kimi_deploy/templates",
        "recipes": "kimi_pyinfra/recipes",
    }
    for folder, files in shipped.items():
        missing = [f for f in files if f"{inside[folder]}/{f}" not in names]
        assert not missing, f"the wheel lacks {folder}/ {missing}"
    assert any(n.startswith("kimi_deploy/catalogs/vllm-cpu-") for n in names)
    # every module of the packages (a new subpackage must be listed in pyproject.toml's packages)
    modules = [str(p.relative_to(ROOT)) for folder in PACKAGES for p in (ROOT / folder).rglob("*.py")]
    assert not [m for m in modules if m not in names], "modules missing from the wheel"


def test_the_wheel_puts_only_the_products_own_packages_in_site_packages(wheel: Path) -> None:
    """No generic top-level name (facts, operations, hostside) and nothing of the lab (the test
    cluster, its stand-ins and fake nvidia-smi, the harness) goes into a user's site-packages."""
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == set(PACKAGES)
    assert not [n for n in names if "standin" in n or "localcluster" in n or "harness" in n]


def test_the_lab_is_a_distribution_of_its_own(tmp_path: Path) -> None:
    """``lab/`` builds a wheel of its own with the cluster and the harness, and nothing of the product."""
    source = tmp_path / "lab"  # built from a copy, as the product's (setuptools writes build/ where it builds)
    shutil.copytree(ROOT / "lab", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check", str(source)],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=600,
    )
    (built,) = tmp_path.glob("kimi_deploy_lab-*.whl")
    names = zipfile.ZipFile(built).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"localcluster", "harness", "flag_catalog"}
    assert "localcluster/standins/nvidia_smi.py" in names
    assert "localcluster/standins/nvlsm.sh" in names


def test_the_installed_package_runs_alone(site: tuple[Path, dict[str, str]]) -> None:
    folder, env = site
    code = f"import importlib; print('\\n'.join(importlib.import_module(p).__file__ for p in {PACKAGES!r}))"
    run = subprocess.run([sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True, check=True)
    paths = run.stdout.split()
    assert len(paths) == len(PACKAGES)
    assert not [p for p in paths if p.startswith(str(ROOT))], f"imported from the checkout: {paths}"


def test_plan_from_a_folder_of_ones_own_is_the_checkouts_plan(site: tuple[Path, dict[str, str]]) -> None:
    folder, env = site
    assert (folder / RECIPE).is_file()
    assert (folder / PROD).is_file()
    here = subprocess.run(
        [sys.executable, "-m", "kimi_pyinfra.cli", "plan", RECIPE, PROD, "--json"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    there = subprocess.run(
        [sys.executable, "-m", "kimi_pyinfra.cli", "plan", RECIPE, PROD, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert here.stdout == there.stdout


def test_the_deploy_runs_from_the_installed_package_and_stops_on_bad_input(site: tuple[Path, dict[str, str]]) -> None:
    """``pyinfra INVENTORY deploys/kimi.py`` in the folder ``init`` wrote: the installed deploy
    plans (its facts, operations and core imported from the install) and refuses the example
    recipe's revision, which has no lock there either, in one line, before any change."""
    folder, env = site
    inventory = folder / "local.py"
    inventory.write_text('b300 = [("@local", {"kimi_recipe": "recipes/kimi-k3.1-pro.yaml"})]\n', encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-m", "pyinfra", str(inventory), "deploys/kimi.py", "-y"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert run.returncode != 0
    errors = [line for line in (run.stdout + run.stderr).splitlines() if "pyinfra error" in line]
    assert len(errors) == 1, run.stdout + run.stderr
    assert errors[0].endswith("run `kimi-deploy lock RECIPE`")


def test_init_writes_only_new_files(site: tuple[Path, dict[str, str]]) -> None:
    folder, env = site
    before = (folder / "deploys/kimi.py").read_text(encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-m", "kimi_pyinfra.cli", "init", str(folder)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert run.returncode == 2
    assert run.stderr.strip().endswith("already exists: kimi-deploy init writes only new files")
    assert (folder / "deploys/kimi.py").read_text(encoding="utf-8") == before
