"""Every bad recipe gives ONE line ``FILE: FIELD: MESSAGE`` naming the file, the field and the rule.

Each case mutates a deep copy of the real recipe, writes it to a temporary file and asserts the
exact line ``load_recipe`` raises. The expected texts are written out by hand from the rules in
``kimi_deploy/recipe.py``; a change of wording shows up here on purpose.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kimi_deploy.errors import ConfigError
from kimi_deploy.recipe import Recipe
from kimi_deploy.recipe_file import load_recipe
from tests.conftest import RECIPE, ROOT

Mutation = Callable[[dict[str, Any]], None]
Key = str | int

RECIPE_TEXT = (ROOT / RECIPE).read_text(encoding="utf-8")
BASE: dict[str, Any] = yaml.safe_load(RECIPE_TEXT)


def _parent(tree: dict[str, Any], path: tuple[Key, ...]) -> Any:
    node: Any = tree
    for part in path[:-1]:
        node = node[part]
    return node


def _set(*assignments: tuple[tuple[Key, ...], Any]) -> Mutation:
    def mutate(tree: dict[str, Any]) -> None:
        for path, value in assignments:
            _parent(tree, path)[path[-1]] = value

    return mutate


def _delete(path: tuple[Key, ...]) -> Mutation:
    def mutate(tree: dict[str, Any]) -> None:
        del _parent(tree, path)[path[-1]]

    return mutate


def _rename(path: tuple[Key, ...], new: str) -> Mutation:
    def mutate(tree: dict[str, Any]) -> None:
        parent = _parent(tree, path)
        parent[new] = parent.pop(path[-1])

    return mutate


def _write(tmp_path: Path, tree: dict[str, Any]) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(tree, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def _error(path: Path) -> str:
    """The ConfigError line for ``path``; fails unless it is exactly one non-empty line."""
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    text = str(info.value)
    assert text.splitlines() == [text], f"not a single line: {text!r}"
    assert text.strip() == text
    assert text.startswith(str(path)), text
    return text


FALLBACK = {"url": "https://api.moonshot.ai", "api_key": {"env": "MOONSHOT_API_KEY"}, "model": "kimi-k3.1-pro"}
COMMIT_RULE = "must be a commit, 40 lowercase hex digits (a branch or tag moves under the lock)"
TOPO = "topologies"
SN = (TOPO, "single-node")
TPU = (TOPO, "tpu7x")
CPU = {"vendor": "cpu", "per_host": 8, "memory_gib": 260}
PD = (TOPO, "gb300-pd")
PREFILL = (*PD, "pools", "prefill")
MULTI = (TOPO, "tokenspeed-multi")

# (id, mutation, the error line after "FILE: ")
CASES: list[tuple[str, Mutation, str]] = [
    (
        "smoke-tool-name-not-a-function-name",
        _set((("smoke", "tool_call", "name"), "get weather; rm")),
        "smoke.tool_call.name: String should match pattern '^[A-Za-z0-9_-]{1,64}$', found str 'get weather; rm'",
    ),
    (
        "mooncake-master-without-its-release",
        _delete(("stores", "mooncake-transfer-engine")),
        "topologies.gb300-pd.kv_transfer.connectors: MooncakeStoreConnector's master runs on the router "
        "host from a release of its own: pin mooncake-transfer-engine under stores",
    ),
    (
        "typo-max_model_len",
        _rename((*PD, "max_model_len"), "max_modl_len"),
        "topologies.gb300-pd.max_modl_len: unknown key (did you mean 'max_model_len'?)",
    ),
    (
        "typo-revision",
        _rename(("model", "revision"), "revison"),
        "model.revison: unknown key (did you mean 'revision'?)",
    ),
    (
        "typo-schema-alias",
        _rename(("schema",), "schem"),
        "schem: unknown key (did you mean 'schema'?)",
    ),
    (
        "typo-pool-instances",
        _rename((*PREFILL, "instances"), "instnces"),
        "topologies.gb300-pd.pools.prefill.instnces: unknown key (did you mean 'instances'?)",
    ),
    (
        "typo-license-accepted",
        _rename(("model", "license", "accepted"), "acepted"),
        "model.license.acepted: unknown key (did you mean 'accepted'?)",
    ),
    (
        "unknown-key-no-hint",
        _set(((*PD, "zzzz"), 1)),
        "topologies.gb300-pd.zzzz: unknown key",
    ),
    (
        "shards-string",
        _set((("model", "shards"), "96")),
        "model.shards: Input should be a valid integer, found str '96'",
    ),
    (
        "shards-bool",
        _set((("model", "shards"), True)),
        "model.shards: Input should be a valid integer, found bool True",
    ),
    (
        "shards-float",
        _set((("model", "shards"), 1.5)),
        "model.shards: Input should be a valid integer, found float 1.5",
    ),
    (
        "shards-negative",
        _set((("model", "shards"), -3)),
        "model.shards: Input should be greater than or equal to 1, found int -3",
    ),
    (
        "missing-required",
        _delete(("model", "served_name")),
        "model.served_name: required key is missing",
    ),
    (
        "schema-version",
        _set((("schema",), 2)),
        "schema: Input should be 1, found int 2",
    ),
    (
        "engine-unknown",
        _set(((TOPO, "tpu7x", "engine"), "trt")),
        "topologies.tpu7x.engine: Input should be 'vllm', 'sglang', 'sglang-jax', 'vllm-tpu' or 'tokenspeed', found str 'trt'",
    ),
    (
        "revision-a-branch",
        _set((("model", "revision"), "main")),
        f"model.revision: {COMMIT_RULE}, found 'main'",
    ),
    (
        "revision-a-branch-without-remote-code",
        _set((("model", "revision"), "main"), (("model", "trust_remote_code"), False)),
        f"model.revision: {COMMIT_RULE}, found 'main'",
    ),
    (
        "revision-uppercase-hex",
        _set((("model", "revision"), "5E2B7A09C41D8F36B0E9A4C7D21F58E3A6B90C1D")),
        f"model.revision: {COMMIT_RULE}, found '5E2B7A09C41D8F36B0E9A4C7D21F58E3A6B90C1D'",
    ),
    (
        "revision-short-commit",
        _set((("model", "revision"), "5e2b7a09c41d")),
        f"model.revision: {COMMIT_RULE}, found '5e2b7a09c41d'",
    ),
    (
        "revision-commit-and-a-line-break",
        _set((("model", "revision"), "5e2b7a09c41d8f36b0e9a4c7d21f58e3a6b90c1d\n")),
        f"model.revision: {COMMIT_RULE}, found '5e2b7a09c41d8f36b0e9a4c7d21f58e3a6b90c1d\\n'",
    ),
    (
        "license-not-accepted",
        _set((("model", "license", "accepted"), False)),
        "model.license: license 'kimi-k3.1-license' is not acknowledged: read it and set accepted: true",
    ),
    (
        "parallel-does-not-multiply",
        _set(((*PREFILL, "hosts"), 4)),
        "topologies.gb300-pd: pool prefill: parallel sizes do not multiply to the pool's accelerators: "
        "instances*tp*dp*pp = 3*8*1*1 = 24, hosts*per_host = 4*4 = 16",
    ),
    (
        "instance-not-whole-hosts",
        _set(((*PREFILL, "parallel", "tp"), 6)),
        "topologies.gb300-pd: pool prefill: one instance uses tp*dp*pp = 6 accelerators, "
        "not a whole number of 4-accelerator hosts",
    ),
    (
        "max_model_len-not-on-ladder",
        _set(((*PD, "max_model_len"), 65536)),
        "topologies.gb300-pd.max_model_len: 65536 is not a context_ladder step [32768, 131072, 262144, 1048576]",
    ),
    (
        "ladder-not-rising",
        _set((("context_ladder",), [32768, 262144, 131072, 1048576])),
        "context_ladder must rise strictly, found [32768, 262144, 131072, 1048576]",
    ),
    (
        "ladder-repeats-a-step",
        _set((("context_ladder",), [32768, 32768, 131072, 262144, 1048576])),
        "context_ladder must rise strictly, found [32768, 32768, 131072, 262144, 1048576]",
    ),
    (
        "ladder-above-max_context",
        _set((("context_ladder",), [32768, 131072, 262144, 2097152])),
        "context_ladder top 2097152 exceeds model.max_context 1048576",
    ),
    (
        "ladder-empty",
        _set((("context_ladder",), [])),
        "context_ladder: List should have at least 1 item after validation, not 0, found list []",
    ),
    (
        "ladder-step-string",
        _set((("context_ladder", 0), "32768")),
        "context_ladder[0]: Input should be a valid integer, found str '32768'",
    ),
    (
        "engine-not-pinned",
        _delete(("engines", "sglang-jax")),
        "topologies.tpu7x.engine: 'sglang-jax' has no pinned release under engines",
    ),
    (
        "connector-package-not-pinned",
        _delete(("engines", "vllm", "packages", "nixl")),
        "topologies.gb300-pd.kv_transfer.connectors: NixlConnector needs nixl in the engine's release: "
        "pin it under engines.vllm.packages",
    ),
    (
        "store-client-not-pinned",
        _delete(("engines", "vllm", "packages", "mooncake-transfer-engine-cuda13")),
        "topologies.gb300-pd.kv_transfer.connectors: MooncakeStoreConnector needs mooncake-transfer-engine-cuda13 "
        "or mooncake-transfer-engine in the engine's release: pin it under engines.vllm.packages",
    ),
    (
        "router-not-pinned",
        _delete(("routers", "vllm-router")),
        "topologies.gb300-pd.router.package: 'vllm-router' has no pinned release under routers",
    ),
    (
        "nvidia-driver-not-pinned",
        _delete(("drivers", "nvidia")),
        "topologies.single-node.accelerators: nvidia hosts need drivers.nvidia pinned",
    ),
    (
        "proprietary-modules-on-blackwell",
        _set((("drivers", "nvidia", "flavor"), "proprietary")),
        "topologies.single-node.accelerators: B300 GPUs run only NVIDIA's open kernel modules: "
        "set drivers.nvidia.flavor to open, found proprietary",
    ),
    (
        "tpu-runtime-not-pinned",
        _delete(("engines", "sglang-jax", "packages", "libtpu")),
        "topologies.tpu7x.accelerators: tpu hosts run the TPU runtime of their engine's release: "
        "pin libtpu (with the jax and jaxlib it was built for) under engines.sglang-jax.packages",
    ),
    (
        "tpu-runtime-as-a-driver",
        _set((("drivers", "tpu"), {"libtpu": "0.0.51"})),
        "drivers.tpu: unknown key",
    ),
    (
        "pd-without-kv_transfer",
        _delete((*PD, "kv_transfer")),
        "topologies.gb300-pd: prefill/decode pools need kv_transfer (connectors and transport)",
    ),
    (
        "pd-without-router",
        _delete((*PD, "router")),
        "topologies.gb300-pd: prefill/decode pools need a router in front",
    ),
    (
        "pd-without-expose",
        _delete((*PD, "expose")),
        "topologies.gb300-pd: prefill/decode engines are reached by the router over the network: "
        "set expose (bind: address) with an api_key",
    ),
    (
        "prefill-without-decode",
        _delete((*PD, "pools", "decode")),
        "topologies.gb300-pd: a disaggregated topology needs prefill and decode pools, found ['prefill']",
    ),
    (
        "serve-pool-beside-prefill",
        _set(((*PREFILL, "role"), "serve")),
        "topologies.gb300-pd: a serve pool must be the only pool; use prefill and decode pools to split",
    ),
    (
        "serve-pool-beside-decode",
        _set(
            (
                (TOPO, "single-node", "pools", "extra"),
                {"group": "b300_extra", "role": "decode", "hosts": 1, "parallel": {"tp": 8}},
            )
        ),
        "topologies.single-node: a serve pool must be the only pool; use prefill and decode pools to split",
    ),
    (
        "router-before-unexposed-engines",
        _set(((TOPO, "single-node", "router"), {"group": "b300_router", "package": "vllm-router"})),
        "topologies.single-node: engines behind a router are reached by the router over the network: "
        "set expose (bind: address) with an api_key",
    ),
    (
        "hicache-on-vllm",
        _set(((TOPO, "single-node", "hicache"), {"ratio": 2.0})),
        "topologies.single-node: hicache is an SGLang feature, engine is vllm",
    ),
    (
        "hicache-ratio-not-above-1",
        _set(((TOPO, "tpu7x", "hicache"), {"ratio": 1.0})),
        "topologies.tpu7x.hicache.ratio: Input should be greater than 1, found float 1.0",
    ),
    (
        "hicache-on-sglang-jax",
        _set(((TOPO, "tpu7x", "hicache"), {"ratio": 2.0})),
        "topologies.tpu7x: hicache: sglang-jax refuses host-memory offload (--hicache-storage) for a model "
        "with linear-attention (KDA) layers such as Kimi's: its recurrent state stays on the TPU",
    ),
    (
        "expose-without-api_key",
        _delete((*PD, "expose", "api_key")),
        "topologies.gb300-pd.expose.api_key: required key is missing",
    ),
    (
        "secret-env-and-file",
        _set(((*PD, "expose", "api_key"), {"env": "KIMI_API_KEY", "file": "/etc/kimi/key"})),
        "topologies.gb300-pd.expose.api_key: give exactly one of env or file",
    ),
    (
        "secret-neither-env-nor-file",
        _set(((*PD, "expose", "api_key"), {})),
        "topologies.gb300-pd.expose.api_key: give exactly one of env or file",
    ),
    (
        "secret-env-lowercase",
        _set(((*PD, "expose", "api_key", "env"), "kimi_key")),
        "topologies.gb300-pd.expose.api_key.env: String should match pattern '^[A-Z_][A-Z0-9_]*$', "
        "found str 'kimi_key'",
    ),
    (
        "port-below-1024",
        _set(((*PD, "ports"), {"api": 80})),
        "topologies.gb300-pd.ports.api: Input should be greater than or equal to 1024, found int 80",
    ),
    (
        "port-above-65535",
        _set(((*PD, "ports"), {"router": 70000})),
        "topologies.gb300-pd.ports.router: Input should be less than or equal to 65535, found int 70000",
    ),
    (
        "topology-group-reused",
        _set(((TOPO, "tokenspeed-single", "group"), "b300")),
        "topologies.tokenspeed-single: group 'b300' is already used by topology single-node",
    ),
    (
        "pool-group-reused-by-another-topology",
        _set(((TOPO, "tokenspeed-single", "pools", "serve", "group"), "gb300_decode")),
        "topologies.tokenspeed-single: group 'gb300_decode' is already used by topology gb300-pd",
    ),
    (
        "weights-do-not-fit",
        _set(((*MULTI, "pools", "serve", "hosts"), 1), ((*MULTI, "pools", "serve", "parallel", "tp"), 8)),
        "topologies.tokenspeed-multi.pools.serve: one copy of the weights spans 8 x 140 GiB = 1120 GiB, "
        "the weights need 1598 GiB (1560000000000 bytes + 10% headroom)",
    ),
    (
        "all-reduce-nccl-on-tpu",
        _set(((TOPO, "tpu7x", "comm_check"), {"all_reduce": {"min_busbw_gbs": 100}})),
        "topologies.tpu7x: comm_check.all_reduce: backend nccl needs nvidia accelerators, found tpu",
    ),
    (
        "all-reduce-sizes-reversed",
        _set(
            (
                (TOPO, "single-node", "comm_check", "all_reduce"),
                {"min_busbw_gbs": 370, "min_bytes": 2**30, "max_bytes": 2**20},
            )
        ),
        "topologies.single-node.comm_check.all_reduce: min_bytes 1073741824 is larger than max_bytes 1048576",
    ),
    (
        "all-reduce-without-threshold",
        _set(((TOPO, "single-node", "comm_check", "all_reduce"), {"backend": "nccl"})),
        "topologies.single-node.comm_check.all_reduce.min_busbw_gbs: required key is missing",
    ),
    (
        "model-not-a-mapping",
        _set((("model",), None)),
        "model: expected a mapping, found NoneType None",
    ),
    (
        "env-value-with-a-unit-line",
        _set(((*PD, "env"), {"KIMI_X": "1\nExecStartPre=+/bin/sh"})),
        "topologies.gb300-pd.env: ['KIMI_X']: control character U+000A is refused in text that reaches a host's "
        "files, found '1\\nExecStartPre=+/bin/sh'",
    ),
    (
        "connector-with-a-carriage-return",
        _set(((*PD, "kv_transfer", "connectors"), ["NixlConnector", "x\ry"])),
        "topologies.gb300-pd.kv_transfer.connectors: [1]: control character U+000D is refused in text that reaches "
        "a host's files, found 'x\\ry'",
    ),
    (
        # a draft is pinned like the model: a free name (a Hub id the engine would fetch) is not
        "speculative-model-is-no-pin",
        _set(((*PD, "speculative"), {"method": "dspark", "num_speculative_tokens": 3, "model": "org/draft"})),
        "topologies.gb300-pd.speculative: model: a draft is a pinned checkpoint: write draft: {repo, revision, "
        "shards, size_bytes, architecture, license} instead",
    ),
    (
        # vLLM 0.33.0 drafts with the served checkpoint itself when "dspark" names no draft
        "dspark-without-a-draft",
        _set(((*PD, "speculative"), {"method": "dspark", "num_speculative_tokens": 3})),
        "topologies.gb300-pd: speculative: method dspark drafts with a checkpoint of its own: pin it as draft "
        "(repo, revision, shards, size_bytes, architecture, license); without one the engine would draft with the "
        "served checkpoint",
    ),
    (
        "smoke-expect-with-c1",
        _set((("smoke",), {"expect": "READY\x9b"})),
        "smoke.expect: control character U+009B is refused in text that reaches a host's files, found 'READY\\x9b'",
    ),
    (
        "path-with-a-specifier",
        _set((("paths",), {"config": "/etc/kimi%n"})),
        "paths.config: String should match pattern '^/[A-Za-z0-9._+@=,:~/-]*$', found str '/etc/kimi%n'",
    ),
    (
        "path-with-a-variable",
        _set((("paths",), {"models": "/srv/$HOME"})),
        "paths.models: String should match pattern '^/[A-Za-z0-9._+@=,:~/-]*$', found str '/srv/$HOME'",
    ),
    (
        "mirror-path-with-a-quote",
        _set((("weights",), {"mirror_path": "/mnt/a'b"})),
        "weights.mirror_path: String should match pattern '^/[A-Za-z0-9._+@=,:~/-]*$', found str \"/mnt/a'b\"",
    ),
    (
        "fallback-url-with-credentials",
        _set(((*PD, "router", "fallback"), {**FALLBACK, "url": "https://user:pw@api.moonshot.ai/v1"})),
        "topologies.gb300-pd.router.fallback.url: must name its host as an IP address or a DNS hostname "
        "(and a port), found 'https://user:pw@api.moonshot.ai/v1'",
    ),
    (
        "fallback-url-host-not-a-name",
        _set(((*PD, "router", "fallback"), {**FALLBACK, "url": "https://api_moonshot!ai/v1"})),
        "topologies.gb300-pd.router.fallback.url: must name its host as an IP address or a DNS hostname "
        "(and a port), found 'https://api_moonshot!ai/v1'",
    ),
    (
        "fallback-url-with-a-control-character",
        _set(((*PD, "router", "fallback"), {**FALLBACK, "url": "https://api.moonshot.ai\x1b/v1"})),
        "topologies.gb300-pd.router.fallback.url: must name its host as an IP address or a DNS hostname "
        "(and a port), found 'https://api.moonshot.ai\\x1b/v1'",
    ),
    (
        "fallback-url-climbing-out-of-its-path",
        _set(((*PD, "router", "fallback"), {**FALLBACK, "url": "https://api.moonshot.ai/v1/../admin"})),
        "topologies.gb300-pd.router.fallback.url: String should match pattern "
        "'^https?://[^\\s/?#]+(/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)*/?$', found str 'https://api.moonshot.ai/v1/../admin'",
    ),
    (
        "fallback-url-with-an-empty-segment",
        _set(((*PD, "router", "fallback"), {**FALLBACK, "url": "https://api.moonshot.ai/tenant//v1"})),
        "topologies.gb300-pd.router.fallback.url: String should match pattern "
        "'^https?://[^\\s/?#]+(/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)*/?$', found str 'https://api.moonshot.ai/tenant//v1'",
    ),
    (
        "fallback-url-with-a-query",
        _set(((*PD, "router", "fallback"), {**FALLBACK, "url": "https://api.moonshot.ai/v1?to=evil"})),
        "topologies.gb300-pd.router.fallback.url: String should match pattern "
        "'^https?://[^\\s/?#]+(/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)*/?$', found str 'https://api.moonshot.ai/v1?to=evil'",
    ),
    (
        "fallback-url-with-a-fragment",
        _set(((*PD, "router", "fallback"), {**FALLBACK, "url": "https://api.moonshot.ai/v1#x"})),
        "topologies.gb300-pd.router.fallback.url: String should match pattern "
        "'^https?://[^\\s/?#]+(/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)*/?$', found str 'https://api.moonshot.ai/v1#x'",
    ),
    (
        "fallback-url-with-a-variable",
        _set(((*PD, "router", "fallback"), {**FALLBACK, "url": "https://api.moonshot.ai/$host"})),
        "topologies.gb300-pd.router.fallback.url: String should match pattern "
        "'^https?://[^\\s/?#]+(/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)*/?$', found str 'https://api.moonshot.ai/$host'",
    ),
    (
        "fallback-url-not-http",
        _set(((*PD, "router", "fallback"), {**FALLBACK, "url": "ftp://api.moonshot.ai"})),
        "topologies.gb300-pd.router.fallback.url: String should match pattern "
        "'^https?://[^\\s/?#]+(/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)*/?$', found str 'ftp://api.moonshot.ai'",
    ),
    (
        "fallback-url-in-the-clear-to-a-lab-address",
        _set(((*PD, "router", "fallback"), {**FALLBACK, "url": "http://10.0.0.7:8000"})),
        "topologies.gb300-pd.router.fallback.url: must be https:// (the hosted API's key goes with every "
        "request); http:// only on loopback (127.0.0.0/8, ::1, localhost), found 'http://10.0.0.7:8000'",
    ),
    (
        "fallback-url-in-the-clear-to-a-name",
        _set(((*PD, "router", "fallback"), {**FALLBACK, "url": "http://api.moonshot.ai/v1"})),
        "topologies.gb300-pd.router.fallback.url: must be https:// (the hosted API's key goes with every "
        "request); http:// only on loopback (127.0.0.0/8, ::1, localhost), found 'http://api.moonshot.ai/v1'",
    ),
    (
        "fallback-url-in-the-clear-to-a-loopback-lookalike",
        _set(((*PD, "router", "fallback"), {**FALLBACK, "url": "http://localhost.evil.example"})),
        "topologies.gb300-pd.router.fallback.url: must be https:// (the hosted API's key goes with every "
        "request); http:// only on loopback (127.0.0.0/8, ::1, localhost), found 'http://localhost.evil.example'",
    ),
    (
        "benchmark-compare-url-in-the-clear",
        _set((("benchmark", "compare"), {**FALLBACK, "url": "http://[fd00::7]/v1"})),
        "benchmark.compare.url: must be https:// (the hosted API's key goes with every "
        "request); http:// only on loopback (127.0.0.0/8, ::1, localhost), found 'http://[fd00::7]/v1'",
    ),
    (
        "fallback-max-tokens-zero",
        _set(((*PD, "router", "fallback"), {**FALLBACK, "max_tokens": 0})),
        "topologies.gb300-pd.router.fallback.max_tokens: Input should be greater than or equal to 1, found int 0",
    ),
    (
        "cpu-accelerators-without-cpu-settings",
        _set(((*SN, "accelerators"), CPU), ((*SN, "comm_check"), {})),
        "topologies.single-node: cpu: an engine on cpu accelerators needs cpu settings (kv_cache_gib at least)",
    ),
    (
        "cpu-settings-on-gpus",
        _set(((*SN, "cpu"), {"kv_cache_gib": 4})),
        "topologies.single-node: cpu: only for cpu accelerators, found nvidia",
    ),
    (
        "cpu-accelerators-for-sglang",
        _set(((*TPU, "accelerators"), {**CPU, "per_host": 4}), ((*TPU, "cpu"), {"kv_cache_gib": 1})),
        "topologies.tpu7x: accelerators.vendor: cpu is served by the CPU build of vllm, engine is sglang-jax",
    ),
    (
        "cpu-memory-fraction-above-one",
        _set(
            ((*SN, "accelerators"), CPU),
            ((*SN, "comm_check"), {}),
            ((*SN, "cpu"), {"kv_cache_gib": 4, "memory_fraction": 1.5}),
        ),
        "topologies.single-node.cpu.memory_fraction: Input should be less than or equal to 1, found float 1.5",
    ),
    (
        "cpu-threads-bind-not-a-cpu-list",
        _set(
            ((*SN, "accelerators"), CPU),
            ((*SN, "comm_check"), {}),
            ((*SN, "cpu"), {"kv_cache_gib": 4, "threads_bind": "0-3;x"}),
        ),
        "topologies.single-node.cpu.threads_bind: String should match pattern "
        "'^(auto|nobind|[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*(\\|[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*)*)$', found str '0-3;x'",
    ),
    (
        "gpu-accelerators-without-a-model",
        _delete((*SN, "accelerators", "model")),
        "topologies.single-node.accelerators: model: nvidia accelerators need a model (e.g. B300, TPU7x)",
    ),
    (
        "without-a-pinned-requirement",
        _set((("engines", "vllm", "without"), ["fastsafetensors"])),
        "engines.vllm.without: 'fastsafetensors' is a pinned requirement of the release",
    ),
    (
        "topology-name-not-a-name",
        _rename((TOPO, "tpu7x"), "TPU 7x"),
        "topologies.TPU 7x.[key]: String should match pattern '^[a-z0-9][a-z0-9_.-]*$', found str 'TPU 7x'",
    ),
]


def test_the_real_recipe_round_trips(tmp_path: Path) -> None:
    """The control for every case below: the unmutated copy loads and equals the original."""
    loaded = load_recipe(_write(tmp_path, copy.deepcopy(BASE)))
    assert isinstance(loaded, Recipe)
    assert loaded == load_recipe(RECIPE)


@pytest.mark.parametrize(("mutate", "expected"), [pytest.param(m, e, id=i) for i, m, e in CASES])
def test_bad_recipe_gives_one_exact_line(tmp_path: Path, mutate: Mutation, expected: str) -> None:
    tree = copy.deepcopy(BASE)
    mutate(tree)
    path = _write(tmp_path, tree)
    assert _error(path) == f"{path}: {expected}"


@pytest.mark.parametrize(
    "url",
    [
        "https://api.moonshot.ai",
        "https://API.Moonshot.ai:8443/v1/",
        "https://10.0.0.7:8000",
        "https://[fd00::7]/v1",
        "http://127.0.0.1:8000",
        "http://127.8.9.10/v1",
        "http://[::1]:8000/v1",
        "http://localhost:8000",
        "http://LocalHost",
    ],
)
def test_a_fallback_url_naming_a_host_is_accepted(tmp_path: Path, url: str) -> None:
    tree = copy.deepcopy(BASE)
    tree["topologies"]["gb300-pd"]["router"]["fallback"] = {**FALLBACK, "url": url}
    fallback = load_recipe(_write(tmp_path, tree)).topologies["gb300-pd"].router
    assert fallback is not None
    assert fallback.fallback is not None
    assert fallback.fallback.url == url


def test_error_fields_are_exposed(tmp_path: Path) -> None:
    tree = copy.deepcopy(BASE)
    tree["model"]["shards"] = "96"
    path = _write(tmp_path, tree)
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    assert (info.value.where, info.value.field) == (str(path), "model.shards")
    assert info.value.message == "Input should be a valid integer, found str '96'"


def test_remote_code_defaults_to_off(tmp_path: Path) -> None:
    tree = copy.deepcopy(BASE)
    del tree["model"]["trust_remote_code"]
    assert load_recipe(_write(tmp_path, tree)).model.trust_remote_code is False


# ---- file-level errors -------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    assert _error(path) == f"{path}: cannot read: No such file or directory"


def test_directory_instead_of_file(tmp_path: Path) -> None:
    assert _error(tmp_path) == f"{tmp_path}: cannot read: Is a directory"


def test_yaml_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    # Line 8 of the real file is "  shards: 96"; a second ":" on it is the 13th column.
    assert RECIPE_TEXT.splitlines()[7] == "  shards: 96"
    path.write_text(RECIPE_TEXT.replace("  shards: 96\n", "  shards: 96: 97\n"), encoding="utf-8")
    # libyaml's words ("... in this context"), or the pure-Python parser's ("... here")
    assert _error(path).startswith(f"{path}:8:13: YAML syntax: mapping values are not allowed ")


def test_yaml_unclosed_flow_sequence(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text("schema: 1\ncontext_ladder: [1, 2\nmodel: {}\n", encoding="utf-8")
    assert _error(path) == f"{path}:3:6: YAML syntax: expected ',' or ']', but got ':'"


def test_tab_indentation(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text("schema: 1\nmodel:\n\trepo: a/b\n", encoding="utf-8")
    assert _error(path) == f"{path}:3:1: YAML syntax: found character '\\t' that cannot start any token"


def test_duplicate_key_names_the_second_occurrence(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE_TEXT.replace("  shards: 96\n", "  shards: 96\n  shards: 97\n"), encoding="utf-8")
    assert _error(path) == f"{path}:9:3: YAML syntax: duplicate key 'shards'"


def test_duplicate_topology(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE_TEXT + "\n  tpu7x:\n    engine: sglang\n", encoding="utf-8")
    line = len(RECIPE_TEXT.splitlines()) + 2
    assert _error(path) == f"{path}:{line}:3: YAML syntax: duplicate key 'tpu7x'"


def test_unsafe_tag_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text("schema: !!python/object/apply:os.system [true]\n", encoding="utf-8")
    assert _error(path) == (
        f"{path}:1:9: YAML syntax: could not determine a constructor for the tag "
        "'tag:yaml.org,2002:python/object/apply:os.system'"
    )


@pytest.mark.parametrize(
    ("text", "found"),
    [
        pytest.param("- schema\n- model\n", "list", id="list"),
        pytest.param("just a string\n", "str", id="scalar"),
        pytest.param("42\n", "int", id="int"),
    ],
)
def test_top_level_not_a_mapping(tmp_path: Path, text: str, found: str) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    assert _error(path) == f"{path}: expected a mapping at top level, found {found}"


@pytest.mark.parametrize("text", ["", "# only a comment\n"], ids=["empty-file", "only-comments"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    assert _error(path) == f"{path}: the file is empty, expected a mapping"


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    raw = RECIPE_TEXT.encode("utf-8")
    offset = raw.index(b"served_name")
    path.write_bytes(raw[:offset] + b"\xff" + raw[offset:])
    assert _error(path) == f"{path}: not UTF-8 text: invalid start byte at byte {offset}"


def test_latin1_text(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_bytes(b"schema: 1\nmodel: {repo: caf\xe9}\n")
    assert _error(path) == f"{path}: not UTF-8 text: invalid continuation byte at byte 27"


def test_control_character(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text("schema: 1\x07\n", encoding="utf-8")
    assert _error(path) == (
        f"{path}: YAML syntax: unacceptable character #x0007: special characters are not allowed "
        'in "<unicode string>", position 9'
    )


def test_integer_key_at_top_level(tmp_path: Path) -> None:
    """Poor but single-line: the int key reads like a list index ``[5]``."""
    tree: dict[Any, Any] = copy.deepcopy(BASE)
    tree[5] = "x"
    assert _error(_write(tmp_path, tree)) == f"{tmp_path / 'recipe.yaml'}: [5]: Keys should be strings"


# ---- inputs that once escaped as tracebacks -------------------------------------------------------


def test_unhashable_key_gives_one_line(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text("? [a, b]\n: 1\n", encoding="utf-8")
    assert _error(path) == (f"{path}:1:3: YAML syntax: a mapping key must be a plain value, found a list or mapping")


def test_huge_size_bytes_gives_one_line(tmp_path: Path) -> None:
    tree = copy.deepcopy(BASE)
    tree["model"]["size_bytes"] = 10**400
    path = _write(tmp_path, tree)
    message = _error(path)
    assert message.startswith(f"{path}: model.size_bytes: Input should be less than or equal to ")
    assert len(message.splitlines()) == 1


def test_key_with_a_line_break_gives_one_line(tmp_path: Path) -> None:
    tree = copy.deepcopy(BASE)
    tree["model"]["revi\nsion"] = "x"
    path = _write(tmp_path, tree)
    assert _error(path) == f"{path}: model.revi sion: unknown key (did you mean 'revision'?)"


def test_value_with_line_breaks_gives_one_line(tmp_path: Path) -> None:
    tree = copy.deepcopy(BASE)
    tree["model"]["license"] = {"name": "a\u2028b\nc", "accepted": False}
    path = _write(tmp_path, tree)
    assert _error(path) == (
        f"{path}: model.license.name: control character U+2028 is refused in text that reaches a host's files, "
        "found 'a\\u2028b\\nc'"
    )


def test_integer_past_pythons_digit_limit_gives_one_line(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE_TEXT.replace("  shards: 96\n", f"  shards: {'9' * 5000}\n"), encoding="utf-8")
    assert _error(path) == (
        f"{path}:8:11: YAML syntax: an integer of 5000 digits is longer than Python reads (4300 at most)"
    )


def test_integer_key_past_pythons_digit_limit_gives_one_line(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE_TEXT + f"? {'1' * 5000}\n: x\n", encoding="utf-8")
    line = len(RECIPE_TEXT.splitlines()) + 1
    assert _error(path) == (
        f"{path}:{line}:3: YAML syntax: an integer of 5000 digits is longer than Python reads (4300 at most)"
    )


def _laughs(levels: int, width: int) -> str:
    """A flow list whose last anchor expands to ``width ** levels`` strings."""
    anchors = ["&a0 [" + ", ".join(['"lol"'] * width) + "]"]
    anchors += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "[" + ", ".join(anchors) + "]"


def test_alias_bomb_is_refused_before_anything_walks_it(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE_TEXT.replace("  quantization: mxfp4\n", f"  quantization: {_laughs(9, 9)}\n"))
    assert (
        _error(path)
        == f"{path}: the document holds more than 100000 values with its YAML aliases expanded (an alias bomb?)"
    )


def test_aliases_under_the_bound_are_read_and_shown_bounded(tmp_path: Path) -> None:
    """9**5 strings: allowed, and the error line shows a few of them, not 59049."""
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE_TEXT.replace("  quantization: mxfp4\n", f"  quantization: {_laughs(5, 9)}\n"))
    message = _error(path)
    assert message.startswith(f"{path}: model.quantization: Input should be a valid string, found list [[")
    assert len(message) < len(str(path)) + 200


def test_alias_inside_the_list_it_names_gives_one_line(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE_TEXT.replace("  quantization: mxfp4\n", "  quantization: &loop [1, *loop]\n"))
    assert _error(path) == f"{path}: a YAML alias refers to a list or mapping that contains it"


def test_anchors_used_as_a_recipe_uses_them_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(_with_merge_key(), encoding="utf-8")
    assert load_recipe(path) == load_recipe(RECIPE)


def test_deeply_nested_yaml_gives_one_line(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text("schema: " + "[" * 5000 + "]" * 5000 + "\n", encoding="utf-8")
    assert _error(path) == f"{path}: YAML nesting is too deep"


def _with_merge_key() -> str:
    """The real recipe with tokenspeed-single's accelerators merged from single-node's anchor."""
    text = RECIPE_TEXT.replace(
        "accelerators: {vendor: nvidia, model: B300, per_host: 8, memory_gib: 260}\n    max_model_len: 32768\n"
        "    load_format",
        "accelerators: &b300 {vendor: nvidia, model: B300, per_host: 8, memory_gib: 260}\n"
        "    max_model_len: 32768\n    load_format",
        1,
    ).replace(
        "group: ts_b300\n    accelerators: {vendor: nvidia, model: B300, per_host: 8, memory_gib: 260}",
        "group: ts_b300\n    accelerators:\n      <<: *b300",
    )
    assert "<<: *b300" in text
    assert "&b300" in text
    return text


def test_yaml_merge_key_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(_with_merge_key(), encoding="utf-8")
    assert load_recipe(path) == load_recipe(RECIPE)


def test_yaml_merge_key_with_an_override(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(_with_merge_key().replace("<<: *b300", "<<: *b300\n      memory_gib: 270"), encoding="utf-8")
    assert load_recipe(path).topologies["tokenspeed-single"].accelerators.memory_gib == 270


def test_duplicate_key_beside_a_merge_key(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    text = _with_merge_key().replace("<<: *b300", "<<: *b300\n      per_host: 8\n      per_host: 4")
    path.write_text(text, encoding="utf-8")
    line = text.splitlines().index("      per_host: 4") + 1
    assert _error(path) == f"{path}:{line}:7: YAML syntax: duplicate key 'per_host'"


def test_pools_of_one_topology_need_their_own_groups(tmp_path: Path) -> None:
    tree = copy.deepcopy(BASE)
    tree["topologies"]["gb300-pd"]["pools"]["decode"]["group"] = "gb300_prefill"
    assert _error(_write(tmp_path, tree)) == (
        f"{tmp_path / 'recipe.yaml'}: topologies.gb300-pd: pools and router need a group each, "
        "found ['gb300_prefill', 'gb300_prefill', 'gb300_router']"
    )


def test_data_parallel_ranks_spread_evenly_over_an_instance(tmp_path: Path) -> None:
    tree = copy.deepcopy(BASE)
    tree["topologies"]["tpu7x"]["pools"]["serve"].update(hosts=3, parallel={"tp": 3, "dp": 4})
    assert _error(_write(tmp_path, tree)) == (
        f"{tmp_path / 'recipe.yaml'}: topologies.tpu7x: pool serve: 4 data-parallel ranks do not "
        "spread evenly over the 3 hosts of an instance"
    )


def test_data_parallel_without_expert_parallel_holds_a_full_copy_per_rank(tmp_path: Path) -> None:
    tree = copy.deepcopy(BASE)
    tree["topologies"]["single-node"]["pools"]["serve"]["parallel"] = {"dp": 8}
    assert _error(_write(tmp_path, tree)) == (
        f"{tmp_path / 'recipe.yaml'}: topologies.single-node.pools.serve: one copy of the weights spans "
        "1 x 260 GiB = 260 GiB, the weights need 1598 GiB (1560000000000 bytes + 10% headroom)"
    )
    tree["topologies"]["single-node"]["pools"]["serve"]["parallel"] = {"dp": 8, "ep": 8}
    assert load_recipe(_write(tmp_path, tree)).topologies["single-node"].pools["serve"].parallel.dp == 8
