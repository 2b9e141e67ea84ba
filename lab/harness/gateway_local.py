"""The gateway's nginx, run on loopback outside systemd: the deploy's own templates, rendered with
the keys and paths of a folder, started as systemd would start it (``nginx -c CONF -e stderr``).

Used by the gateway's tests (tests/test_gateway.py) and by bench/gateway_limits.py.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kimi_deploy.render.files import environment
from kimi_deploy.render.gateway import NGINX, config_data


@dataclass
class LocalGateway:
    port: int
    folder: Path
    proc: subprocess.Popen[bytes]

    @property
    def stderr(self) -> Path:
        return self.folder / "stderr"

    def log(self) -> str:
        return self.stderr.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def nginx() -> str | None:
    """The nginx binary the deploy runs, or on this machine's PATH; None without one."""
    return NGINX if Path(NGINX).exists() else shutil.which("nginx")


def render(folder: Path, keys: dict[str, str], **data: Any) -> Path:
    """Write the gateway's nginx.conf, gateway.js and keys file into ``folder``; the config's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run").mkdir(exist_ok=True)
    values = config_data(
        runtime_dir=str(folder / "run"), keys_file=str(folder / "keys.conf"), js_file=str(folder / "gateway.js"), **data
    )
    jinja = environment()
    plan = SimpleNamespace(host="localhost", topology="local", pool="local")
    keys_text = jinja.get_template("gateway-keys.nginx.j2").render(path="keys.conf", plan=plan, secrets_map=keys)
    (folder / "keys.conf").write_text(keys_text, encoding="utf-8")
    (folder / "gateway.js").write_text(jinja.get_template("gateway.js.j2").render(**values), encoding="utf-8")
    conf = folder / "nginx.conf"
    conf.write_text(jinja.get_template("gateway.nginx.conf.j2").render(**values), encoding="utf-8")
    return conf


def start(folder: Path, keys: dict[str, str], port: int, **data: Any) -> LocalGateway:
    """Render into ``folder`` and start nginx listening on 127.0.0.1:``port``; it answers on return."""
    binary = nginx()
    assert binary is not None, "nginx is not installed (scripts/test installs Debian's nginx and libnginx-mod-http-js)"
    conf = render(folder, keys, bind="127.0.0.1", port=port, **data)
    with open(folder / "stderr", "wb") as err:
        proc = subprocess.Popen([binary, "-c", str(conf), "-e", "stderr"], stderr=err, stdin=subprocess.DEVNULL)
    gateway = LocalGateway(port, folder, proc)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return gateway
        except OSError:
            assert proc.poll() is None, gateway.log()
            assert time.monotonic() < deadline, "nginx did not listen within 10 s"
            time.sleep(0.05)
