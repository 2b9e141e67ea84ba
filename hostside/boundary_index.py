"""What a package index's project page lists: the versions of its files (PEP 503's simple HTML).

A page comes from outside the recipe (PyPI, a mirror, the local cluster's index): it is read to a
bounded size, and only the file names its links end in count, each taken apart as a wheel's or an
sdist's name is (``NAME-VERSION(-...).whl``, ``NAME-VERSION.tar.gz``). Stdlib only: the host's
release installer (hostside/venv_install.py) runs it bundled, the controller imports it
(``kimi-deploy validate --index``).
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request

# The most of a project page read: PyPI's vllm page, some 400 files, is about 200 KB.
PAGE_MAX_BYTES = 16 << 20
_FILE = re.compile(r'href="(?:[^"]*/)?([^/"#]+?)(?:\.whl|\.tar\.gz|\.zip)[#"]')


def normalized(name: str) -> str:
    """A project's name as PEP 503 spells it in the index's URLs."""
    return re.sub(r"[-_.]+", "-", name).lower()


def listed_versions(html: str, project: str) -> list[str]:
    """The versions of ``project`` the page's file links name, in the page's order, each once."""
    versions: list[str] = []
    for stem in _FILE.findall(html):
        name, _, rest = stem.partition("-")
        while rest and normalized(name) != normalized(project):  # a project name with "-" in an sdist's name
            more, _, rest = rest.partition("-")
            name = f"{name}-{more}"
        version = rest.split("-")[0]
        if version and version not in versions:
            versions.append(version)
    return versions


def project_versions(index_url: str, project: str, timeout: float = 10) -> list[str] | None:
    """The versions ``index_url`` lists for ``project`` (empty: it has no such project); None when
    the index does not answer."""
    try:
        with urllib.request.urlopen(f"{index_url.rstrip('/')}/{normalized(project)}/", timeout=timeout) as page:  # noqa: S310
            html = page.read(PAGE_MAX_BYTES).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return [] if exc.code == 404 else None
    except (OSError, ValueError):
        return None
    return listed_versions(html, project)
