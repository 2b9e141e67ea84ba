"""A release whose lock is resolved on one host before any host installs it, with the index
changing in between (run by tests/e2e/test_venv_releases.py): what is installed must be the
lock that was resolved, not a new resolution.

Host data: ``kimi_pip_index_url``, ``kimi_test_path`` (the release folder), ``kimi_test_wheel`` (a
newer wheel of a dependency) and ``kimi_test_index_files`` (where the index serves wheels from).
"""

from __future__ import annotations

import shutil

from pyinfra.context import host
from pyinfra.operations import python

from kimi_deploy.recipe import load_recipe
from kimi_deploy.venv_lock import LockSource
from operations import engine

REQUIREMENTS = ["huggingface_hub==2.4.0"]
source = LockSource("resolver", host.name)
path = host.data.kimi_test_path
index_url = host.data.kimi_pip_index_url

UV = load_recipe("recipes/demo-gpu.yaml").tools.uv
engine.lock_resolved(
    name="Lock resolved", path=path, requirements=REQUIREMENTS, index_url=index_url, source=source, uv=UV
)
python.call(
    name="A newer dependency on the index",
    function=shutil.copy,
    src=host.data.kimi_test_wheel,
    dst=host.data.kimi_test_index_files,
)
engine.venv(
    name="Release from the resolved lock",
    path=path,
    package="huggingface_hub",
    version="2.4.0",
    requirements=REQUIREMENTS,
    index_url=index_url,
    current=None,
    lock=source,
    uv=UV,
)
