"""The fake Hub (localcluster.hub) serving the tiny repo (localcluster.tiny_model) to the real huggingface_hub client."""

from __future__ import annotations

import hashlib
import http.client
import io
import itertools
import json
import re
import shutil
import struct
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils.tqdm import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

from localcluster.hub import HubServer, serve, write_faults
from localcluster.tiny_model import CHANGED_SHARDS, REPO_ID, RepoInfo, build, git_blob_sha1, load_info

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

# What the default build produces, on every machine: recipes and locks may pin these.
DEFAULT_COMMIT_A = "23eb01d77aab1f1b9ff6dda80033b783970fe79c"
DEFAULT_COMMIT_B = "1088b4b0a968514a4de7da23014f7058bbfbd30c"
SHARD_BYTES = 4096  # small shards keep the module fast
PAGE_SIZE = 50
SHARD_57 = "model-00057-of-00096.safetensors"


@dataclass
class Hub:
    server: HubServer
    root: Path
    info: RepoInfo
    log: io.StringIO

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def a(self) -> str:
        return self.info.commits["a"]

    @property
    def b(self) -> str:
        return self.info.commits["b"]

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/_stats") as r:
            data: dict[str, Any] = json.load(r)
            return data

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/_stats/reset", method="POST")).close()


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    root = tmp_path_factory.mktemp("hub")
    info = build(root, shard_bytes=SHARD_BYTES)
    log = io.StringIO()
    server = serve(root, "127.0.0.1", 0, page_size=PAGE_SIZE, log_stream=log)
    bars_were_off = are_progress_bars_disabled()
    disable_progress_bars()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_DISABLE_XET", "1")
        mp.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        mp.setenv("HF_ENDPOINT", server.url)  # for anything reading it late; calls below pass endpoint=
        try:
            yield Hub(server, root, info, log)
        finally:
            server.stop()
            if not bars_were_off:
                enable_progress_bars()


@pytest.fixture(autouse=True)
def _clean(request: pytest.FixtureRequest) -> None:
    if "hub" in request.fixturenames:
        h: Hub = request.getfixturevalue("hub")
        write_faults(h.root, None)
        h.reset()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _snapshot(hub: Hub, revision: str, dest: Path, **kwargs: Any) -> Path:
    return Path(
        snapshot_download(
            REPO_ID, revision=revision, local_dir=dest, cache_dir=dest.parent / "cache", endpoint=hub.url, **kwargs
        )
    )


def _repo_files(local: Path) -> set[str]:
    return {
        str(p.relative_to(local))
        for p in local.rglob("*")
        if p.is_file() and ".cache" not in p.relative_to(local).parts
    }


def _read_safetensors_header(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header: dict[str, Any] = json.loads(raw[8 : 8 + n])
    return header


# ---- the repo on disk ---------------------------------------------------------------------------------


def test_default_build_is_reproducible_and_pinned(tmp_path: Path) -> None:
    info = build(tmp_path / "one")
    assert info.commits == {"a": DEFAULT_COMMIT_A, "b": DEFAULT_COMMIT_B}
    assert info.refs == {"main": DEFAULT_COMMIT_B, "v1": DEFAULT_COMMIT_A}
    assert build(tmp_path / "two").commits == info.commits
    manifest = tmp_path / "one" / "repos" / REPO_ID / "commits" / f"{DEFAULT_COMMIT_A}.json"
    before = manifest.stat().st_mtime_ns
    assert build(tmp_path / "one") == info  # idempotent: nothing regenerated
    assert manifest.stat().st_mtime_ns == before
    assert load_info(tmp_path / "one") == info
    total = sum(e.size for e in info.files[DEFAULT_COMMIT_A].values())
    assert 5_000_000 < total < 8_000_000


def test_repo_content_and_commit_diff(hub: Hub) -> None:
    a, b = hub.info.files[hub.a], hub.info.files[hub.b]
    shards = sorted(p for p in a if p.endswith(".safetensors"))
    assert shards == [f"model-{i:05d}-of-00096.safetensors" for i in range(1, 97)]
    assert {
        "config.json",
        "generation_config.json",
        "tokenizer_config.json",
        "tokenizer.json",
        "README.md",
        "LICENSE",
        "model.safetensors.index.json",
    } == set(a) - set(shards)
    assert set(b) == set(a) - {"README.md"} | {"extra_b.json"}
    changed = {p for p in set(a) & set(b) if a[p] != b[p]}
    assert changed == {"config.json", *(f"model-{i:05d}-of-00096.safetensors" for i in CHANGED_SHARDS)}
    assert all(a[p].size == b[p].size for p in changed if p.endswith(".safetensors"))
    assert all(e.is_lfs == p.endswith(".safetensors") for p, e in a.items())

    # Real safetensors: header offsets tile the data exactly; the index names every tensor's shard.
    objects = hub.root / "objects"
    index = json.loads((objects / a["model.safetensors.index.json"].sha256).read_bytes())
    seen: dict[str, str] = {}
    for shard in shards:
        path = objects / a[shard].sha256
        header = _read_safetensors_header(path)
        header_len = struct.unpack("<Q", path.read_bytes()[:8])[0]
        spans = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
        assert spans[0][0] == 0
        assert all(x[1] == y[0] for x, y in itertools.pairwise(spans))
        assert 8 + header_len + spans[-1][1] == a[shard].size
        assert header_len % 8 == 0
        seen |= {k: shard for k in header if k != "__metadata__"}
    assert index["weight_map"] == seen
    json.loads((objects / a["tokenizer.json"].sha256).read_bytes())


def test_blob_ids_are_gits(hub: Hub) -> None:
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    entry = hub.info.files[hub.a]["config.json"]
    data = (hub.root / "objects" / entry.sha256).read_bytes()
    out = subprocess.run(["git", "hash-object", "--stdin"], input=data, capture_output=True, check=True)
    assert out.stdout.decode().strip() == entry.git_blob_sha1 == git_blob_sha1(data)


# ---- downloads with the real client -------------------------------------------------------------------


def test_snapshot_at_commit_a_and_b(hub: Hub, tmp_path: Path) -> None:
    local_a = _snapshot(hub, hub.a, tmp_path / "a")
    assert _repo_files(local_a) == set(hub.info.files[hub.a])
    for path, entry in hub.info.files[hub.a].items():
        assert _sha256(local_a / path) == entry.sha256, path

    local_b = _snapshot(hub, hub.b, tmp_path / "b")
    assert _repo_files(local_b) == set(hub.info.files[hub.b])
    for path, entry in hub.info.files[hub.b].items():
        assert _sha256(local_b / path) == entry.sha256, path
    for shard in CHANGED_SHARDS:
        name = f"model-{shard:05d}-of-00096.safetensors"
        assert _sha256(local_a / name) != _sha256(local_b / name)
    assert (local_a / "config.json").read_bytes() != (local_b / "config.json").read_bytes()
    assert (local_b / "extra_b.json").is_file()
    assert not (local_b / "README.md").exists()
    assert hub.stats()["downloads"][SHARD_57] == 2  # once per commit: the bytes differ


def test_branch_and_tag_resolve(hub: Hub, tmp_path: Path) -> None:
    api = HfApi(endpoint=hub.url)
    assert api.model_info(REPO_ID, revision="main").sha == hub.b
    assert api.model_info(REPO_ID, revision="v1").sha == hub.a
    assert api.model_info(REPO_ID).sha == hub.b
    refs = api.list_repo_refs(REPO_ID)
    assert [(r.name, r.target_commit) for r in refs.branches] == [("main", hub.b)]
    assert [(r.name, r.target_commit) for r in refs.tags] == [("v1", hub.a)]
    assert [c.commit_id for c in api.list_repo_commits(REPO_ID)] == [hub.b, hub.a]

    cache = tmp_path / "cache"
    snap = snapshot_download(REPO_ID, revision="main", cache_dir=cache, endpoint=hub.url, allow_patterns=["*.json"])
    assert Path(snap).name == hub.b
    assert (Path(snap) / "extra_b.json").is_file()
    readme = hf_hub_download(REPO_ID, "README.md", revision="v1", cache_dir=cache, endpoint=hub.url)
    assert f"/snapshots/{hub.a}/" in readme
    assert (cache / f"models--{REPO_ID.replace('/', '--')}" / "refs" / "v1").read_text() == hub.a


def test_model_info_siblings(hub: Hub) -> None:
    info = HfApi(endpoint=hub.url).model_info(REPO_ID, revision=hub.a, files_metadata=True)
    assert info.id == REPO_ID
    assert info.siblings is not None
    assert info.config is not None
    assert info.config["model_type"] == "kimi_k3"
    by_name = {s.rfilename: s for s in info.siblings}
    entry = hub.info.files[hub.a][SHARD_57]
    lfs = by_name[SHARD_57].lfs
    assert lfs is not None
    assert (lfs.sha256, lfs.size) == (entry.sha256, entry.size)
    assert by_name["config.json"].blob_id == hub.info.files[hub.a]["config.json"].git_blob_sha1


def test_tree_pages_and_matches_repo_info(hub: Hub) -> None:
    api = HfApi(endpoint=hub.url)
    entries = list(api.list_repo_tree(REPO_ID, revision=hub.b, recursive=True, expand=True))
    files = {e.path: e for e in entries if isinstance(e, RepoFile)}
    expected = hub.info.files[hub.b]
    assert set(files) == set(expected)
    assert hub.stats()["requests"]["GET tree"] == -(-len(expected) // PAGE_SIZE) > 1
    for path, e in files.items():
        want = expected[path]
        assert e.size == want.size
        assert e.blob_id == want.git_blob_sha1
        if want.is_lfs:
            assert e.lfs is not None
            assert (e.lfs.sha256, e.lfs.size) == (want.sha256, want.size)
        else:
            assert e.lfs is None
    last = {p: e.last_commit.oid for p, e in files.items() if e.last_commit is not None}
    assert last[SHARD_57] == hub.b
    assert last["model-00001-of-00096.safetensors"] == hub.a

    infos = api.get_paths_info(REPO_ID, [SHARD_57, "LICENSE", "missing.bin"], revision="v1")
    assert [(i.path, getattr(i, "blob_id", None)) for i in infos] == [
        (SHARD_57, hub.info.files[hub.a][SHARD_57].git_blob_sha1),
        ("LICENSE", hub.info.files[hub.a]["LICENSE"].git_blob_sha1),
    ]


def test_rerun_at_pinned_commit_makes_no_request(hub: Hub, tmp_path: Path) -> None:
    _snapshot(hub, hub.a, tmp_path / "local")
    snapshot_download(REPO_ID, revision=hub.a, cache_dir=tmp_path / "cache2", endpoint=hub.url)
    assert hub.stats()["downloads"][SHARD_57] == 2
    hub.reset()
    _snapshot(hub, hub.a, tmp_path / "local")
    snapshot_download(REPO_ID, revision=hub.a, cache_dir=tmp_path / "cache2", endpoint=hub.url)
    assert hub.stats()["requests_total"] == 0


def _get(
    conn: http.client.HTTPConnection, path: str, headers: dict[str, str] | None = None
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One GET on a kept-alive connection: status, headers, body."""
    conn.request("GET", path, headers=headers or {})
    answer = conn.getresponse()
    return answer.status, answer.headers, answer.read()


def test_range_requests(hub: Hub) -> None:
    split = urlsplit(hub.url)
    conn = http.client.HTTPConnection(split.hostname or "", split.port)
    config = (hub.root / "objects" / hub.info.files[hub.a]["config.json"].sha256).read_bytes()
    try:
        conn.request("GET", f"/{REPO_ID}/resolve/{hub.a}/config.json", headers={"Range": "bytes=10-19"})
        r = conn.getresponse()
        assert (r.status, r.read(), r.getheader("Content-Range")) == (206, config[10:20], f"bytes 10-19/{len(config)}")

        conn.request("HEAD", f"/{REPO_ID}/resolve/v1/{SHARD_57}")
        r = conn.getresponse()
        r.read()
        entry = hub.info.files[hub.a][SHARD_57]
        assert r.status == 302
        assert r.getheader("X-Repo-Commit") == hub.a
        assert r.getheader("X-Linked-Etag") == f'"{entry.sha256}"'
        assert r.getheader("X-Linked-Size") == str(entry.size)
        # Stored in Xet, as the Hub's files are: a client that takes that path asks for a token and
        # is refused (the deploy's hosts never do; test_weights_hub_weather counts it).
        assert re.fullmatch(r"[0-9a-f]{64}", r.getheader("X-Xet-Hash") or "")
        (listed,) = HfApi(endpoint=hub.url).get_paths_info(REPO_ID, [SHARD_57], revision=hub.a)
        assert isinstance(listed, RepoFile)
        assert listed.xet_hash == r.getheader("X-Xet-Hash")  # the tree's xetHash, as the client reads it
        token_route = f"{hub.url}/api/models/{REPO_ID}/xet-read-token/{hub.a}"
        assert r.getheader("Link") == f'<{token_route}>; rel="xet-auth"'
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(token_route)
        assert refused.value.code == 501
        cdn = urlsplit(r.getheader("Location") or "")
        assert (cdn.hostname, cdn.port) == (split.hostname, hub.server.cdn.port) != (split.hostname, split.port)
        shard = (hub.root / "objects" / entry.sha256).read_bytes()
        at_cdn = http.client.HTTPConnection(cdn.hostname or "", cdn.port)
        try:
            assert _get(at_cdn, f"{cdn.path}?{cdn.query}", {"Range": "bytes=-16"})[::2] == (206, shard[-16:])
            status, headers, _ = _get(at_cdn, f"{cdn.path}?{cdn.query}", {"Range": f"bytes={len(shard)}-"})
            assert (status, headers.get("Content-Range")) == (416, f"bytes */{len(shard)}")
            assert _get(at_cdn, f"/{REPO_ID}/resolve/v1/config.json")[0] == 404  # the CDN serves its files only
        finally:
            at_cdn.close()
        assert _get(conn, f"{cdn.path}?{cdn.query}")[0] == 404  # and the Hub none of them
    finally:
        conn.close()


def test_client_errors(hub: Hub, tmp_path: Path) -> None:
    common: dict[str, Any] = {"cache_dir": tmp_path, "endpoint": hub.url}
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("moonshotai/No-Such-Model", "config.json", **common)
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=hub.url).model_info("moonshotai/No-Such-Model")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO_ID, "config.json", revision="no-such-branch", **common)
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(REPO_ID, revision="0" * 40, **common)
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(REPO_ID, "README.md", revision="main", **common)  # removed by commit B


# ---- faults -------------------------------------------------------------------------------------------


def test_corrupt_fault_keeps_size_changes_digest(hub: Hub, tmp_path: Path) -> None:
    write_faults(hub.root, {"corrupt": [SHARD_57]})
    got = Path(hf_hub_download(REPO_ID, SHARD_57, revision=hub.a, local_dir=tmp_path, endpoint=hub.url))
    entry = hub.info.files[hub.a][SHARD_57]
    assert got.stat().st_size == entry.size
    assert _sha256(got) != entry.sha256
    assert _read_safetensors_header(got)  # only the tensor data is damaged
    assert hub.stats()["downloads"] == {SHARD_57: 1}


def test_down_fault_makes_client_raise(hub: Hub, tmp_path: Path) -> None:
    write_faults(hub.root, {"down": True})
    with pytest.raises(HfHubHTTPError) as err:
        HfApi(endpoint=hub.url).model_info(REPO_ID)
    assert err.value.response.status_code == 503
    with pytest.raises(LocalEntryNotFoundError):
        snapshot_download(REPO_ID, revision="main", local_dir=tmp_path / "x", endpoint=hub.url)
    write_faults(hub.root, None)
    assert HfApi(endpoint=hub.url).model_info(REPO_ID).sha == hub.b


def test_dropped_transfer_is_retried(hub: Hub, tmp_path: Path) -> None:
    name = "model-00003-of-00096.safetensors"
    entry = hub.info.files[hub.a][name]
    cut = entry.size // 2
    write_faults(hub.root, {"truncate": {"model-0000[3]-*": cut}, "truncate_times": 1})
    got = Path(hf_hub_download(REPO_ID, name, revision=hub.a, local_dir=tmp_path, endpoint=hub.url))
    assert _sha256(got) == entry.sha256
    stats = hub.stats()
    # The client resumes only from whole 10 MiB chunks: a small file is fetched again from the start.
    assert stats["downloads"] == {name: 2}
    assert stats["bytes"] == {name: cut + entry.size}


def test_slow_fault_throttles(hub: Hub) -> None:
    size = hub.info.files[hub.a]["LICENSE"].size
    write_faults(hub.root, {"slow_bytes_per_s": size * 4})
    started = time.monotonic()
    with urllib.request.urlopen(f"{hub.url}/{REPO_ID}/resolve/v1/LICENSE") as r:
        assert len(r.read()) == size
    assert time.monotonic() - started >= 0.2


def test_going_down_cuts_a_slow_transfer_short(hub: Hub) -> None:
    entry = hub.info.files[hub.a][SHARD_57]
    write_faults(hub.root, {"slow_bytes_per_s": max(1, entry.size // 4)})  # four seconds for the body
    split = urlsplit(hub.url)
    conn = http.client.HTTPConnection(split.hostname or "", split.port, timeout=30)
    try:
        conn.request("GET", f"/{REPO_ID}/resolve/{hub.a}/{SHARD_57}")
        answer = conn.getresponse()
        if answer.status == 302:  # the CDN's address, as the Hub answers for a large file
            location = urlsplit(answer.getheader("Location") or "")
            answer.read()
            conn.close()
            conn = http.client.HTTPConnection(location.hostname or "", location.port, timeout=30)
            conn.request("GET", f"{location.path}?{location.query}")
            answer = conn.getresponse()
        assert answer.status == 200
        first = answer.read(64)
        write_faults(hub.root, {"down": True})
        with pytest.raises(http.client.IncompleteRead) as cut:
            answer.read()
        assert len(first) + len(cut.value.partial) < entry.size
    finally:
        conn.close()


def test_token_is_accepted_and_never_logged(hub: Hub, tmp_path: Path) -> None:
    secret = "hf_" + "S3cr3tT0k3n" * 3
    path = hf_hub_download(REPO_ID, "LICENSE", revision="v1", cache_dir=tmp_path, endpoint=hub.url, token=secret)
    assert _sha256(Path(path)) == hub.info.files[hub.a]["LICENSE"].sha256
    log = hub.log.getvalue()
    assert f"/{REPO_ID}/resolve/v1/LICENSE 200" in log
    assert secret not in log
    assert "Bearer" not in log
    assert "uthorization" not in log


def test_fail_rules_answer_as_the_hub_does_then_step_aside(hub: Hub) -> None:
    """A 429 the real client reads as the Hub's rate limit (its own message names the bucket and
    the wait); a rule's turns counted; then the file answers again."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url  # noqa: PLC0415
    from huggingface_hub.utils import parse_ratelimit_headers  # type: ignore[attr-defined]  # noqa: PLC0415

    write_faults(
        hub.root, {"fail": [{"path": SHARD_57, "method": "HEAD", "status": 429, "retry_after": 7, "times": 2}]}
    )
    url = hf_hub_url(REPO_ID, SHARD_57, revision=hub.a, endpoint=hub.url)
    for _ in range(2):
        with pytest.raises(HfHubHTTPError) as err:
            get_hf_file_metadata(url, endpoint=hub.url)
        assert err.value.response.status_code == 429
        assert err.value.response.headers["Retry-After"] == "7"
        limit = parse_ratelimit_headers(err.value.response.headers)
        assert limit is not None
        assert (limit.resource_type, limit.remaining, limit.reset_in_seconds, limit.window_seconds) == (
            "resolvers",
            0,
            7,
            300,
        )
        assert "you have reached your 'resolvers' rate limit" in str(err.value)
    assert get_hf_file_metadata(url, endpoint=hub.url).size == hub.info.files[hub.a][SHARD_57].size
    assert hub.stats()["files"][f"HEAD {SHARD_57}"] == 3  # two refused; then /resolve alone: its 302 says it all


def test_a_reset_rule_cuts_the_body_at_its_fraction_with_a_reset(hub: Hub) -> None:
    size = hub.info.files[hub.a][SHARD_57].size
    write_faults(hub.root, {"fail": [{"path": SHARD_57, "method": "GET", "reset_at": 0.5, "times": 1}]})
    got = b""
    url = f"{hub.url}/{REPO_ID}/resolve/{hub.a}/{SHARD_57}"
    with pytest.raises(ConnectionResetError), urllib.request.urlopen(url) as answer:  # noqa: PT012 - counted
        while block := answer.read1(1024):
            got += block
    assert len(got) == size // 2
    with urllib.request.urlopen(f"{hub.url}/{REPO_ID}/resolve/{hub.a}/{SHARD_57}") as answer:
        assert len(answer.read()) == size  # one turn only
    assert hub.stats()["starts"] == {SHARD_57: [0, 0]}


def test_a_whole_rule_answers_a_range_with_the_whole_body(hub: Hub) -> None:
    size = hub.info.files[hub.a][SHARD_57].size
    write_faults(hub.root, {"whole": ["model-*"]})
    request = urllib.request.Request(f"{hub.url}/{REPO_ID}/resolve/{hub.a}/{SHARD_57}", headers={"Range": "bytes=100-"})
    with urllib.request.urlopen(request) as answer:
        assert (answer.status, len(answer.read())) == (200, size)


@pytest.mark.parametrize(
    ("rule", "why"),
    [
        ({"path": "x", "method": "PUT", "status": 503}, "fail[0]: path must be a glob and method HEAD or GET"),
        ({"path": "x", "method": "GET"}, "fail[0]: give one of status and reset_at"),
        ({"path": "x", "method": "HEAD", "reset_at": 0.5}, "fail[0]: reset_at must be a fraction between 0 and 1"),
        ({"path": "x", "method": "GET", "status": 200}, "fail[0]: status must be an HTTP error status"),
        ({"path": "x", "method": "GET", "status": 503, "times": 0}, "fail[0]: times must be a positive integer"),
    ],
)
def test_a_bad_fail_rule_is_named(hub: Hub, rule: dict[str, Any], why: str) -> None:
    write_faults(hub.root, {"fail": [rule]})
    with pytest.raises(HfHubHTTPError) as err:
        HfApi(endpoint=hub.url).model_info(REPO_ID)
    assert err.value.response.status_code == 500
    assert why in err.value.response.headers["X-Error-Message"]
