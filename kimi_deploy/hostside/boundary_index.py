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
_EXTENSIONS = (".whl", ".tar.gz", ".zip")


def normalized(name: str) -> str:
    """A project's name as PEP 503 spells it in the index's URLs."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _file_stems(html: str) -> list[str]:
    """The names the page's links end in, less their extension (``NAME-VERSION(-...)``): each
    ``href`` read up to its closing quote by ``find`` alone, so a page costs time linear in its
    length whatever it holds."""
    stems: list[str] = []
    start = html.find('href="')
    while start >= 0:
        start += len('href="')
        end = html.find('"', start)
        # a link cut off with the page still names its file if its fragment had begun
        url, fragment, _ = html[start : end if end >= 0 else len(html)].partition("#")
        if end < 0 and not fragment:
            break
        name = url[url.rfind("/") + 1 :]
        extension = next((e for e in _EXTENSIONS if name.endswith(e)), None)
        if extension is not None and len(name) > len(extension):
            stems.append(name[: -len(extension)])
        # the next link may begin inside this one's value (its quote is this one's end): each
        # value still ends at the first quote after it, so each character is read at most twice
        start = html.find('href="', start) if end >= 0 else -1
    return stems


def _version(stem: str, project: str) -> str:
    """The version in ``stem`` of ``project``'s file, or "" when it is no file of ``project``. A
    wheel's name has no "-", an sdist's may: its name is the shortest run of "-"-parts that names
    the project. Each step looks at one part, and the name read so far must stay the start of the
    project's, so a stem of many "-" costs time linear in its length."""
    wanted = normalized(project)
    end = stem.find("-")
    read = normalized(stem if end < 0 else stem[:end])
    while end >= 0 and read != wanted:
        if not wanted.startswith(read):  # what is read only grows: it can no longer name the project
            return ""
        after = stem.find("-", end + 1)
        read = normalized(f"{read}-{stem[end + 1 : after if after >= 0 else len(stem)]}")
        end = after
    if end < 0 or read != wanted:
        return ""
    after = stem.find("-", end + 1)
    return stem[end + 1 : after if after >= 0 else len(stem)]


def listed_versions(html: str, project: str) -> list[str]:
    """The versions of ``project`` the page's file links name, in the page's order, each once."""
    versions: list[str] = []
    seen: set[str] = set()
    for stem in _file_stems(html):
        version = _version(stem, project)
        if version and version not in seen:
            seen.add(version)
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
