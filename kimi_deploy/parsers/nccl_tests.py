"""Parse the output of nccl-tests (``all_reduce_perf`` and the other ``*_perf`` binaries) and check it.

:func:`parse_nccl_tests` returns a :class:`NcclTestsRun`, a plain JSON-able dict::

    {"test": "all_reduce_perf",
     "nccl_tests_version": "2.17.8", "nccl_version": "2.29.2",
     "config": {"threads": 1, "gpus_per_thread": 1, "min_bytes": 8, "max_bytes": 134217728, "step": 2,
                "step_kind": "factor", "warmup_iters": 1, "iters": 20, "agg_iters": 1, "validation": 1,
                "graph": 0},
     "ranks": [{"rank": 0, "group": 0, "pid": 662195, "host": "gpu-1-1", "device": 0,
                "pci_bus": "0009:01:00", "gpu": "NVIDIA GH200 120GB"}, ...],
     "rows": [{"size_bytes": 1048576, "count": 262144, "type": "float", "redop": "sum", "root": -1,
               "out_of_place": {"time_us": 477.32, "algbw_gbs": 2.2, "busbw_gbs": 2.2, "wrong": 96},
               "in_place": {"time_us": 492.81, "algbw_gbs": 2.13, "busbw_gbs": 2.13, "wrong": 32}}, ...],
     "out_of_bounds": 4, "avg_busbw_gbs": 4.79995, "avg_busbw_verdict": None,
     "failures": [".. gpu-1-1 pid 662195: Test failure common.cu:1189", ...]}

- ``test`` is the binary named by ``# Collective test starting:`` (nccl-tests 2.17 and later), else None.
  ``nccl_version`` is the ``NCCL version`` line NCCL prints (``2.26.2+cuda12.8``), else the version
  decoded from ``nccl-library=`` of the ``# nccl-tests version`` line, else None.
- ``config`` is None without the ``# nThread ... nGpus ...`` line; a key its line lacks (older
  versions print no ``agg iters``/``graph``) is None.
- ``rows`` keep the printed order. ``wrong`` is the ``#wrong`` count, None for ``N/A`` (no
  validation) and for the fractional maximum error that versions before ``#wrong`` printed in that
  column. Timestamps and per-iteration columns that newer versions can add are read past.
- ``out_of_bounds`` and ``avg_busbw_gbs`` come from the summary lines and are None when the run did
  not print them. ``avg_busbw_verdict`` is ``"OK"``/``"FAILED"`` when the run checked its own
  average against a threshold, else None.
- ``failures`` holds, in order, the ``Test NCCL failure``/``Test CUDA failure``/``Test failure``,
  ``# error:`` and ``Invalid number of GPUs`` lines.

Lines may carry an Open MPI ``--tag-output`` prefix (``[1,0]<stdout>:``), a Slurm ``srun -l`` label
(``0: ``), indentation, and CRLF ends; anything else interleaved (launcher warnings, ``NCCL INFO``/
``NCCL WARN`` lines) is ignored. :class:`~kimi_deploy.parsers.ParseError` is raised, and nothing else,
for text with none of the lines above, for a line that starts like a result row but is not one, and
for a second ``# nThread`` header (several runs in one output, as a build without MPI prints when
started by ``mpirun``).

:func:`run_problems` lists what went wrong in a run and :func:`check_bus_bandwidth` compares its bus
bandwidth with a threshold; both answer in single lines.
"""

from __future__ import annotations

import math
import re
from typing import Literal, TypedDict

from kimi_deploy.parsers import ParseError, read_int


class RunConfig(TypedDict):
    threads: int
    gpus_per_thread: int
    min_bytes: int
    max_bytes: int
    step: int
    step_kind: Literal["factor", "bytes"]
    warmup_iters: int | None
    iters: int | None
    agg_iters: int | None
    validation: int | None
    graph: int | None


class RankInfo(TypedDict):
    rank: int
    group: int | None
    pid: int
    host: str
    device: int
    pci_bus: str
    gpu: str


class Measurement(TypedDict):
    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: int | None


class ResultRow(TypedDict):
    size_bytes: int
    count: int
    type: str
    redop: str
    root: int
    out_of_place: Measurement
    in_place: Measurement


class NcclTestsRun(TypedDict):
    test: str | None
    nccl_tests_version: str | None
    nccl_version: str | None
    config: RunConfig | None
    ranks: list[RankInfo]
    rows: list[ResultRow]
    out_of_bounds: int | None
    avg_busbw_gbs: float | None
    avg_busbw_verdict: Literal["OK", "FAILED"] | None
    failures: list[str]


# Each digit belongs to one quantifier: a number that is not followed by what the pattern expects
# is given up in one pass, not after every split of its digits between two of them.
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_NUMBER_RE = re.compile(_NUMBER)
# Launcher prefixes: Open MPI --tag-output (optionally after --timestamp-output) and srun -l.
_MPI_TAG = re.compile(r"^.*?\[\d+,\d+\]<std(?:out|err)>:")
_SRUN_LABEL = re.compile(r"^\s*\d+: ")
_CONFIG = re.compile(
    r"nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)\s+step:\s*(\d+)\((factor|bytes)\)"
)
_CONFIG_OPTIONAL = {
    "warmup_iters": re.compile(r"warmup iters:\s*(\d+)"),
    # Plain "iters:" follows the warmup count; "agg iters:" follows "agg".
    "iters": re.compile(r"(?<=\d)\s+iters:\s*(\d+)"),
    "agg_iters": re.compile(r"agg iters:\s*(\d+)"),
    "validation": re.compile(r"validation:\s*(\d+)"),
    "graph": re.compile(r"graph:\s*(\d+)"),
}
_RANK = re.compile(
    r"#\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]*)\]\s*(.*)"
)
_TESTS_VERSION = re.compile(r"#\s*[nr]ccl-tests version\s+(\S+)(?:.*?[nr]ccl-library=(\d+))?")
_NCCL_VERSION = re.compile(r"\bNCCL version\s+(\d+\.\d+\.\d+\S*)")
_TEST_NAME = re.compile(r"#\s*Collective test starting:\s*(\S+)")
_OUT_OF_BOUNDS = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)")
_AVG_BUSBW = re.compile(rf"#\s*Avg bus bandwidth\s*:\s*({_NUMBER})(?:\s+(OK|FAILED))?\s*$")
_FAILURE = re.compile(r"\bTest (?:NCCL |CUDA )?failure\b|^#\s*error:|^Invalid number of GPUs")
_CAUSE = re.compile(r"\bTest (?:NCCL|CUDA) failure\b|^#\s*error:|^Invalid number of GPUs")
_ROW_START = re.compile(r"(\d+)\s+(\d+)\s+([A-Za-z]\w*)\s+([A-Za-z]\w*)\s+(-?\d+)\b(.*)")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIME = re.compile(r"\d{2}:\d{2}:\d{2}")
_BODY = 4  # time, algbw, busbw, #wrong
_PER_ITER = 4  # i_min, i_max, i_p99, i_cv% after each body with per-iteration timing


def parse_nccl_tests(text: str) -> NcclTestsRun:
    """The run an nccl-tests binary printed in ``text`` (shape in the module docstring)."""
    run = NcclTestsRun(
        test=None,
        nccl_tests_version=None,
        nccl_version=None,
        config=None,
        ranks=[],
        rows=[],
        out_of_bounds=None,
        avg_busbw_gbs=None,
        avg_busbw_verdict=None,
        failures=[],
    )
    library_code: int | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _strip_prefix(raw).strip()
        if not line:
            continue
        if _FAILURE.search(line):
            run["failures"].append(line)
        elif config := _CONFIG.search(line):
            if run["config"] is not None:
                raise ParseError(
                    f"line {number}: a second '# nThread' header; the output holds more than one run"
                    " (a build without MPI started by mpirun runs once per process)"
                )
            run["config"] = _config(config, line, f"line {number}")
        elif rank := _RANK.fullmatch(line):
            run["ranks"].append(_rank(rank, f"line {number}"))
        elif version := _TESTS_VERSION.match(line):
            run["nccl_tests_version"] = version.group(1)
            library_code = read_int(version.group(2), f"line {number}: nccl-library") if version.group(2) else None
        elif name := _TEST_NAME.match(line):
            run["test"] = name.group(1)
        elif bounds := _OUT_OF_BOUNDS.match(line):
            run["out_of_bounds"] = read_int(bounds.group(1), f"line {number}: Out of bounds values")
        elif average := _AVG_BUSBW.match(line):
            run["avg_busbw_gbs"] = _finite(average.group(1), f"line {number}: Avg bus bandwidth")
            verdict = average.group(2)
            run["avg_busbw_verdict"] = "OK" if verdict == "OK" else "FAILED" if verdict == "FAILED" else None
        elif row := _ROW_START.fullmatch(line):
            run["rows"].append(_row(row, number, line))
        elif (nccl := _NCCL_VERSION.search(line)) and run["nccl_version"] is None:
            run["nccl_version"] = nccl.group(1)
    if run["nccl_version"] is None and library_code is not None:
        run["nccl_version"] = _decode_nccl_code(library_code)
    if not _anything_read(run):
        raise ParseError(
            "no nccl-tests output: no '# nThread' header, '# Rank' line, result row, summary or 'Test failure' line"
        )
    return run


def run_problems(run: NcclTestsRun) -> list[str]:
    """Each thing the run reported as wrong, one line each, the most telling first; ``[]`` for a clean run.

    In order: result rows with a non-zero ``#wrong``, ``Out of bounds values`` above 0, the failure
    lines (the first one naming a cause, and how many more there were), an average the run itself
    marked FAILED, no result rows at all, and result rows without the closing summary (the run
    stopped before it finished).
    """
    problems: list[str] = []
    rows = run["rows"]
    wrong = [row for row in rows if any(count for count in _wrong_counts(row).values())]
    if wrong:
        first = wrong[0]
        counts = ", ".join(f"{count} {placement}" for placement, count in _wrong_counts(first).items() if count)
        problems.append(
            f"wrong values in {len(wrong)} of {len(rows)} result rows, first at {format_bytes(first['size_bytes'])}"
            f" {first['type']} {first['redop']} ({counts})"
        )
    if run["out_of_bounds"]:
        problems.append(f"Out of bounds values : {run['out_of_bounds']} FAILED")
    failures = run["failures"]
    if failures:
        cause = next((line for line in failures if _CAUSE.search(line)), failures[0])
        more = len(failures) - 1
        problems.append(cause + (f" (and {more} more failure line{'s' if more > 1 else ''})" if more else ""))
    if run["avg_busbw_verdict"] == "FAILED":
        problems.append(f"Avg bus bandwidth {run['avg_busbw_gbs']:g} GB/s FAILED the run's own threshold")
    if not rows:
        problems.append("printed no result rows")
    elif run["out_of_bounds"] is None and run["avg_busbw_gbs"] is None:
        problems.append(
            f"stopped after the {format_bytes(rows[-1]['size_bytes'])} row without printing its summary"
            " ('# Out of bounds values', '# Avg bus bandwidth')"
        )
    return problems


def check_bus_bandwidth(run: NcclTestsRun, min_busbw_gbs: float, min_bytes: int | None = None) -> str | None:
    """None when the run is clean and fast enough, else one line saying what is wrong.

    The first problem :func:`run_problems` finds fails the check (wrong values, failures, no rows,
    no summary); call it for the full list. Then the bus bandwidth is compared with ``min_busbw_gbs``:

    - without ``min_bytes``, at the largest message size the run measured;
    - with ``min_bytes``, at every size from ``min_bytes`` up, so that a dip below the threshold at
      any large size fails; a run that measured nothing that large fails.

    Why not the ``# Avg bus bandwidth`` line: it averages every size, and small messages are bound
    by latency, not bandwidth (issue 309 of nccl-tests: average 139.56 GB/s, 469 GB/s at 16 GiB).
    Published ring/NVLS bus bandwidth figures, and what people compare with them, are the plateau
    reached at the largest sizes. At each size the lower of the out-of-place and in-place figures
    counts, so neither variant hides a slow path; the message names which one it was.
    """
    name = run["test"] or "nccl-tests"
    problems = run_problems(run)
    if problems:
        return f"{name}: {problems[0]}"
    largest = max(row["size_bytes"] for row in run["rows"])
    if min_bytes is None:
        measured = [row for row in run["rows"] if row["size_bytes"] == largest]
    else:
        measured = [row for row in run["rows"] if row["size_bytes"] >= min_bytes]
        if not measured:
            return (
                f"{name}: no result at {format_bytes(min_bytes)} or larger to compare with {min_busbw_gbs:g} GB/s;"
                f" the largest message was {format_bytes(largest)}"
            )
    busbw, size, placement = lowest_bus_bandwidth(measured)
    if busbw >= min_busbw_gbs:
        return None
    # With one rank nothing crosses a bus, so nccl-tests reports 0: say so rather than blame the fabric.
    alone = "; a single rank moves no data between GPUs" if len(run["ranks"]) == 1 else ""
    return (
        f"{name}: bus bandwidth {busbw:g} GB/s at {format_bytes(size)} ({placement}),"
        f" needs >= {min_busbw_gbs:g} GB/s{alone}"
    )


def lowest_bus_bandwidth(rows: list[ResultRow]) -> tuple[float, int, str]:
    """The lowest bus bandwidth of ``rows`` (out-of-place and in-place alike): (GB/s, its message
    size, ``"out-of-place"`` or ``"in-place"``)."""
    figures = [
        (measurement["busbw_gbs"], row["size_bytes"], placement)
        for row in rows
        for placement, measurement in (("out-of-place", row["out_of_place"]), ("in-place", row["in_place"]))
    ]
    return min(figures, key=lambda figure: figure[0])


def format_bytes(size: int) -> str:
    """``8589934592`` -> ``"8 GiB"``, ``1048576`` -> ``"1 MiB"``, ``8`` -> ``"8 B"``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


def _strip_prefix(line: str) -> str:
    tagged = _MPI_TAG.match(line)
    if tagged:
        line = line[tagged.end() :]
    labelled = _SRUN_LABEL.match(line)
    return line[labelled.end() :] if labelled else line


def _config(match: re.Match[str], line: str, where: str) -> RunConfig:
    optional: dict[str, int | None] = {}
    for key, pattern in _CONFIG_OPTIONAL.items():
        found = pattern.search(line)
        optional[key] = read_int(found.group(1), f"{where}: {key}") if found else None
    return RunConfig(
        threads=read_int(match.group(1), f"{where}: nThread"),
        gpus_per_thread=read_int(match.group(2), f"{where}: nGpus"),
        min_bytes=read_int(match.group(3), f"{where}: minBytes"),
        max_bytes=read_int(match.group(4), f"{where}: maxBytes"),
        step=read_int(match.group(5), f"{where}: step"),
        step_kind="factor" if match.group(6) == "factor" else "bytes",
        warmup_iters=optional["warmup_iters"],
        iters=optional["iters"],
        agg_iters=optional["agg_iters"],
        validation=optional["validation"],
        graph=optional["graph"],
    )


def _rank(match: re.Match[str], where: str) -> RankInfo:
    return RankInfo(
        rank=read_int(match.group(1), f"{where}: Rank"),
        group=read_int(match.group(2), f"{where}: Group") if match.group(2) is not None else None,
        pid=read_int(match.group(3), f"{where}: Pid"),
        host=match.group(4),
        device=read_int(match.group(5), f"{where}: device"),
        pci_bus=match.group(6),
        gpu=match.group(7).strip(),
    )


def _row(match: re.Match[str], number: int, line: str) -> ResultRow:
    where = f"line {number}: {line!r} is not a result row"
    values = match.group(6).split()
    # Runs that report timestamps print the date and time after the in-place figures.
    if len(values) >= 2 and _DATE.fullmatch(values[-2]) and _TIME.fullmatch(values[-1]):
        values = values[:-2]
    if len(values) == 2 * _BODY:
        out_of_place = _measurement(values[:_BODY], where)
        in_place = _measurement(values[_BODY:], where)
    elif len(values) == 2 * (_BODY + _PER_ITER):
        _numbers(values[_BODY : _BODY + _PER_ITER] + values[-_PER_ITER:], where)
        out_of_place = _measurement(values[:_BODY], where)
        in_place = _measurement(values[_BODY + _PER_ITER : 2 * _BODY + _PER_ITER], where)
    else:
        raise ParseError(
            f"{where}: {len(values)} values after the root column, expected 8 (time, algbw, busbw, #wrong twice)"
        )
    return ResultRow(
        size_bytes=read_int(match.group(1), f"line {number}: size"),
        count=read_int(match.group(2), f"line {number}: count"),
        type=match.group(3),
        redop=match.group(4),
        root=read_int(match.group(5), f"line {number}: root"),
        out_of_place=out_of_place,
        in_place=in_place,
    )


def _measurement(values: list[str], where: str) -> Measurement:
    time_us, algbw, busbw = _numbers(values[:3], where)
    wrong_text = values[3]
    wrong: int | None
    if wrong_text == "N/A":
        wrong = None
    else:
        (count,) = _numbers([wrong_text], where)
        # %g prints large counts as 1.04858e+06; older versions printed a fractional maximum error here.
        wrong = int(count) if count.is_integer() and count >= 0 else None
    return Measurement(time_us=time_us, algbw_gbs=algbw, busbw_gbs=busbw, wrong=wrong)


def _numbers(values: list[str], where: str) -> list[float]:
    numbers: list[float] = []
    for value in values:
        if not _NUMBER_RE.fullmatch(value):
            raise ParseError(f"{where}: {value!r} is not a number")
        numbers.append(_finite(value, where))
    return numbers


def _finite(value: str, where: str) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ParseError(f"{where}: {value!r} is not a finite number")
    return number


def _wrong_counts(row: ResultRow) -> dict[str, int]:
    counts: dict[str, int] = {}
    if row["out_of_place"]["wrong"] is not None:
        counts["out-of-place"] = row["out_of_place"]["wrong"]
    if row["in_place"]["wrong"] is not None:
        counts["in-place"] = row["in_place"]["wrong"]
    return counts


def _decode_nccl_code(code: int) -> str:
    # NCCL_VERSION_CODE is major*10000 + minor*100 + patch since 2.9, major*1000 + minor*100 + patch before.
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def _anything_read(run: NcclTestsRun) -> bool:
    return bool(
        run["config"] is not None
        or run["ranks"]
        or run["rows"]
        or run["failures"]
        or run["out_of_bounds"] is not None
        or run["avg_busbw_gbs"] is not None
        or run["test"] is not None
        or run["nccl_tests_version"] is not None
    )
