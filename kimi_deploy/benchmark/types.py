"""The serving benchmark's records as the controller makes them: the request its generator host
runs (``plan.bench_request``), the report built from what that host recorded (``report.report``)
and the figures a release record keeps of it (``delta.figures``). Plain dicts at run time, written
as JSON as they are.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class RequestTask(TypedDict):
    """A task as the generator host sends it."""

    id: str
    prompt: str
    max_tokens: int
    # OpenAI chat ``tools`` entries, JSON as the recipe holds them (``BenchTask.tools``)
    tools: list[dict[str, Any]]


class RequestTarget(TypedDict):
    """An endpoint the tasks run against and where the generator host reads its key (``plan.Target``)."""

    name: str
    url: str
    model: str
    key_file: str | None
    key_var: str | None


class RequestLevel(TypedDict):
    """One concurrency and the tasks (by index) it sends, in order."""

    concurrency: int
    rows: list[int]


class RequestEngine(TypedDict):
    """The generator host's engine, whose CPU time and peaks each level of the endpoint measures."""

    unit: str
    url: str
    key_file: str | None
    key_var: str | None
    # its accelerators' memory is read with nvidia-smi
    nvidia: bool
    # its gauges of KV cache use (``Engine.kv_usage_metrics``)
    kv_metrics: list[str]


class BenchRequest(TypedDict):
    """``hostside/bench_load.py``'s request: no secret, only where the keys are on the host."""

    run: str
    python: str
    tokenizer: str
    trust_remote_code: bool
    user: str
    timeout_s: int
    tasks: list[RequestTask]
    targets: list[RequestTarget]
    levels: list[RequestLevel]
    engine: RequestEngine
    # files the host program removes when done (the hosted API's key)
    remove: list[str]


class Accelerators(TypedDict):
    """The priced kind of the topology's engine hosts and how many of it they hold."""

    kind: str
    count: float


class LevelCost(TypedDict):
    """One level's cost in ``currency``, by the guides' formula: the deployment's parts (compute,
    storage and network, operations) or the hosted API's (its fees), then correction."""

    currency: str
    compute: NotRequired[float]
    storage_network: NotRequired[float]
    operations: NotRequired[float]
    api_fees: NotRequired[float]
    correction: float
    total: float
    # None when no task succeeded
    per_success: float | None


class FailedTask(TypedDict):
    """How often a task failed at one level, and why it failed first."""

    failed: int
    first_reason: str


class LevelReport(TypedDict):
    """One level of one target: the answers judged and the figures (None where the host's record
    held none of the expected type)."""

    concurrency: int | None
    requests: int
    succeeded: int
    success_rate: float | None
    errors: int
    error_kinds: dict[str, int]
    failed_tasks: dict[str, FailedTask]
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    itl_p50_ms: float | None
    itl_p95_ms: float | None
    output_tok_s: float | None
    wall_s: float
    generator_cpu_s: float | None
    engine_cpu_s: float | None
    kv_cache_usage: float | None
    accelerator_memory_mib: float | None
    unit_memory_mib: float | None
    tokens_in: float
    tokens_out: float
    generator_error: str | None
    # None when the recipe prices nothing
    cost: LevelCost | None


class ReportMeta(TypedDict):
    """What ``deploys/bench.py`` knows of the run besides the generator host's record."""

    topology: str | None
    endpoint: str
    generator: str
    recipe: str


class Report(ReportMeta):
    """The whole report: the run, the accelerators priced and every level of each target
    (``local``, and ``hosted`` where a hosted API is compared)."""

    run: str | None
    at: str | None
    accelerators: Accelerators
    generator_load_cpu_s: float | None
    tasks: list[str]
    targets: dict[str, list[LevelReport]]
    # added by deploys/bench.py: the release record's answer (hostside/bench_record.py), a host's
    # JSON written back as it came
    release: NotRequired[object]
    before: NotRequired[object]


class KeptLevel(TypedDict):
    """What a release record keeps of one level."""

    concurrency: int | None
    requests: int
    succeeded: int
    success_rate: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    itl_p50_ms: float | None
    output_tok_s: float | None
    cost_per_success: float | None


class Figures(TypedDict):
    """What a release record keeps of a run."""

    run: str | None
    at: str | None
    tasks: list[str]
    targets: dict[str, list[KeptLevel]]


class BenchRecordRequest(TypedDict):
    """``bench_record.py``: the run's figures into the serving release's record on the generator
    host (its ``current`` link and release folders)."""

    figures: Figures
    current: str
    releases: str
