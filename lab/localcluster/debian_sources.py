"""Every host uses the cluster's Debian mirror, configured the way a site points its hosts at its own.

Each host gets, in its own overlay layer (never in the shared base image: the gateway address and
the key belong to one cluster), rewritten at every ``up``:

- ``/etc/apt/sources.list.d/debian.sources``, a deb822 source (sources.list(5), "DEB822-STYLE
  FORMAT": ``Types``, ``URIs``, ``Suites``, ``Components``, ``Signed-By``), naming
  ``http://GATEWAY:8767/debian`` (built by ``localcluster.debian_repo``, served by the ``apt`` service);
- ``/usr/share/keyrings/kimi-cluster-debian.gpg``, the cluster's signing key as a binary OpenPGP
  keyring: ``Signed-By`` names it, so apt trusts that key for this source only (sources.list(5),
  "signed-by").
"""

from __future__ import annotations

from pathlib import Path

from localcluster.image import SUITE, write_into
from localcluster.repo_signing import ensure_key, public_key, signing_home
from localcluster.state import Settings

# The service that serves the cluster's apt repositories (localcluster.services), and its port.
APT_SERVICE = "apt"
APT_PORT = 8767
# Where the mirror lies under the service's URL root, as deb.debian.org/debian does.
URL_PATH = "/debian"
COMPONENT = "main"
SOURCES_FILE = "etc/apt/sources.list.d/debian.sources"
KEYRING_FILE = "usr/share/keyrings/kimi-cluster-debian.gpg"


def mirror_url(gateway: str) -> str:
    """The mirror as hosts reach it: ``http://GATEWAY:8767/debian``."""
    return f"http://{gateway}:{APT_PORT}{URL_PATH}"


def sources(url: str) -> str:
    """The deb822 stanza of ``debian.sources`` for the mirror at ``url``."""
    return (
        "# The kimi-cluster's Debian mirror (localcluster.debian_repo), signed with the cluster's key.\n"
        "Types: deb\n"
        f"URIs: {url}\n"
        f"Suites: {SUITE}\n"
        f"Components: {COMPONENT}\n"
        f"Signed-By: /{KEYRING_FILE}\n"
    )


def signing_key_home(settings: Settings) -> Path:
    """The GnuPG home of the cluster's signing key: the ``apt`` service's, made once per cluster."""
    return signing_home(settings.state_dir / APT_SERVICE)


def write(settings: Settings, root: Path) -> None:
    """Write the mirror's source and keyring into the host whose ``/`` is ``root``."""
    home = signing_key_home(settings)
    write_into(root, KEYRING_FILE, public_key(home, ensure_key(home)))
    write_into(root, SOURCES_FILE, sources(mirror_url(settings.gateway)))
