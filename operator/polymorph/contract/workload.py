"""Benchmark workloads: a list of request shapes drawn from a profile or read from a trace.

Owns: sampling request shapes (input length, output length, arrival offset) from a
``polymorph.contract.api.WorkloadProfile`` with a seed, reading JSONL traces, reading workload files,
and scaling a workload down to what a device can run quickly while keeping its shape.

A profile histogram bucket ``i`` covers lengths ``(bounds[i-1], bounds[i]]`` (``[1, bounds[0]]``
for the first); a sampled length is uniform inside its bucket. Profile workloads are closed
loop: every request arrives at offset 0 and at most ``concurrency`` run at once. Trace
workloads are open loop: each request arrives at its offset.

Workload files: a trace is named ``*.jsonl`` (any case) or is JSON lines whatever its name; any
other file is a YAML/JSON profile, read with ``polymorph.contract.yaml_input.load_yaml`` (duplicate keys and
alias bombs refused) and checked with ``polymorph validate``'s phrasing for field errors.

Trace lines are ``TraceLine`` documents: JSON objects ``{"inputTokens": int >= 1, "outputTokens":
int >= 1, "arrivalS": float >= 0}`` (seconds since the trace start; ``arrival`` and ``offsetS``
are accepted as spellings of ``arrivalS``, which defaults to 0). ``profile_of`` derives a trace's
``WorkloadProfile``.

It knows nothing about models, token ids or timing: prompts are made by the benchmark.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from polymorph.contract.api import Histogram, WorkloadProfile
from polymorph.contract.errors import UsageError
from polymorph.contract.inputs import DuplicateKey, json_object, read_text, shown
from polymorph.contract.validate import format_validation_error
from polymorph.contract.yaml_input import MAX_NUMBER_DIGITS, bounded_int, load_yaml

__all__ = [
    "DEFAULT_WORKLOAD",
    "MAX_SERVING_BATCH",
    "SERVING_MAX_BATCH",
    "RequestShape",
    "TraceLine",
    "Workload",
    "fit_workload",
    "is_trace",
    "load_workload",
    "parse_trace",
    "profile_of",
    "read_profile",
    "read_workload",
    "sample_requests",
    "serving_max_batch",
    "workload_from_profile",
]

DEFAULT_WORKLOAD = WorkloadProfile(
    inputTokens=Histogram(bounds=[128, 512, 2048], counts=[50, 35, 15]),
    outputTokens=Histogram(bounds=[64, 256, 1024], counts=[50, 40, 10]),
    concurrency=8,
)
"""A chat-like sample profile: mostly short prompts and answers, a tail of long ones."""

SERVING_MAX_BATCH = 8
"""Requests a serving engine decodes together when its ``--max-batch`` is not given."""
MAX_SERVING_BATCH = 4096
"""The largest ``--max-batch`` an engine takes."""
_ARRIVAL_KEYS = ("arrivalS", "arrival", "offsetS")
MAX_REQUEST_TOKENS = 1 << 20
"""The longest prompt or output a workload may ask for (1,048,576 tokens)."""


@dataclass(frozen=True)
class RequestShape:
    """One benchmark request: how many prompt tokens, how many to generate, when it arrives."""

    input_tokens: int
    output_tokens: int
    arrival_s: float = 0.0


@dataclass(frozen=True)
class Workload:
    """Request shapes plus the number that may run at once (the scheduler's batch size)."""

    requests: tuple[RequestShape, ...]
    concurrency: int
    digest: str = ""
    """A stable hash of where the workload came from (the profile digest or the trace bytes)."""

    @property
    def max_tokens(self) -> int:
        """The longest sequence any request needs (prompt plus generated tokens)."""
        return max(r.input_tokens + r.output_tokens for r in self.requests)


def _sample_length(hist: Histogram, rng: random.Random) -> int:
    bucket = rng.choices(range(len(hist.counts)), weights=hist.counts)[0]
    low = 1 if bucket == 0 else hist.bounds[bucket - 1] + 1
    return rng.randint(low, hist.bounds[bucket])


def sample_requests(profile: WorkloadProfile, n: int, seed: int = 0) -> list[RequestShape]:
    """``n`` request shapes drawn from ``profile``'s histograms; the same seed gives the same list."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = random.Random(seed)
    return [
        RequestShape(_sample_length(profile.inputTokens, rng), _sample_length(profile.outputTokens, rng))
        for _ in range(n)
    ]


def workload_from_profile(profile: WorkloadProfile, n: int = 64, seed: int = 0) -> Workload:
    """A closed-loop workload of ``n`` requests sampled from ``profile``."""
    return Workload(tuple(sample_requests(profile, n, seed)), profile.concurrency, profile.digest())


def parse_trace(lines: list[str], concurrency: int = 8, source: str = "trace") -> Workload:
    """A workload from JSONL trace lines (blank lines skipped), sorted by arrival.

    Raises ``UsageError`` naming the line and field when a line is malformed.
    """
    shapes: list[RequestShape] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line, parse_int=bounded_int, object_pairs_hook=json_object)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{source} line {number} is not JSON ({exc.msg}).") from None
        except DuplicateKey as exc:
            raise UsageError(
                f"{source} line {number}: duplicate key {exc.key!r}; a key may appear once in an object, as in YAML."
            ) from None
        except ValueError:  # bounded_int refused a number
            raise UsageError(
                f"{source} line {number} holds a number with more than {MAX_NUMBER_DIGITS} digits."
            ) from None
        if not isinstance(entry, dict):
            raise UsageError(
                f"{source} line {number} must be a JSON object with inputTokens and outputTokens."
            )
        shapes.append(_trace_entry(entry, f"{source} line {number}"))
    if not shapes:
        raise UsageError(f"{source} holds no requests; add JSON lines with inputTokens and outputTokens.")
    shapes.sort(key=lambda r: r.arrival_s)
    digest = "sha256:" + _sha256("\n".join(lines))
    # A trace's requests run at most ``concurrency`` at once, and never more than it holds.
    return Workload(tuple(shapes), min(concurrency, len(shapes)), digest)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class TraceLine(BaseModel):
    """One line of a JSONL trace: a request's shape, never its content. Written by the engine's
    trace sampler (``polymorph_engine.serving.trace``) and read back by ``parse_trace``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    inputTokens: int = Field(ge=1, le=MAX_REQUEST_TOKENS)
    outputTokens: int = Field(ge=1, le=MAX_REQUEST_TOKENS)
    arrivalS: float = Field(
        default=0.0, ge=0, allow_inf_nan=False, validation_alias=AliasChoices(*_ARRIVAL_KEYS)
    )
    """Seconds since the trace's first request (``arrival`` and ``offsetS`` are read as spellings)."""

    def encode(self) -> str:
        """The line as JSON (no newline)."""
        return json.dumps(
            {"inputTokens": self.inputTokens, "outputTokens": self.outputTokens, "arrivalS": self.arrivalS}
        )


def _trace_entry(entry: dict[str, object], where: str) -> RequestShape:
    try:
        line = TraceLine.model_validate(entry)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        if error["type"] == "extra_forbidden":
            raise UsageError(
                f"{where}: unknown field {field!r}; allowed fields are inputTokens, outputTokens, arrivalS."
            ) from None
        if field in ("inputTokens", "outputTokens"):
            raise UsageError(
                f"{where}: {field} must be an integer from 1 to {MAX_REQUEST_TOKENS}, "
                f"got {shown(entry.get(field))}."
            ) from None
        raise UsageError(
            f"{where}: arrivalS must be a number of seconds >= 0, got {shown(error.get('input'))}."
        ) from None
    return RequestShape(line.inputTokens, line.outputTokens, line.arrivalS)


def profile_of(workload: Workload) -> WorkloadProfile:
    """The WorkloadProfile of a trace: power-of-two length buckets, and its concurrency."""
    return WorkloadProfile(
        inputTokens=_histogram([r.input_tokens for r in workload.requests]),
        outputTokens=_histogram([r.output_tokens for r in workload.requests]),
        concurrency=max(1, min(workload.concurrency, 4096)),
    )


def _histogram(lengths: list[int]) -> Histogram:
    bounds = sorted({1 << max(0, n - 1).bit_length() for n in lengths})
    counts = [
        sum(1 for n in lengths if (i == 0 or n > bounds[i - 1]) and n <= b) for i, b in enumerate(bounds)
    ]
    return Histogram(bounds=bounds, counts=counts)


def load_workload(path: str | Path, n: int = 64, seed: int = 0) -> Workload:
    """Read a workload file: a ``.jsonl`` trace, or a YAML/JSON WorkloadProfile (see ``read_workload``)."""
    return read_workload(path, n, seed)[0]


def read_workload(path: str | Path, n: int = 64, seed: int = 0) -> tuple[Workload, WorkloadProfile]:
    """A workload file's requests and its profile (a trace's is derived with ``profile_of``).

    The file is read with ``polymorph.contract.inputs.read_text`` (at most ``MAX_FILE_BYTES``, UTF-8). A
    profile may be the bare profile or wrapped as ``{profile: ...}`` (the CompileJob
    ``spec.workload`` shape); ``n`` requests are sampled from it with ``seed``. No request may
    ask for more than ``MAX_REQUEST_TOKENS``. Raises ``UsageError`` (one sentence naming the
    file and field) on bad input.
    """
    path = Path(path)
    text = read_text(path, "workload file")
    if is_trace(path, text):
        workload = parse_trace(text.splitlines(), source=str(path))
        return workload, profile_of(workload)
    profile = read_profile(text, str(path))
    return workload_from_profile(profile, n=n, seed=seed), profile


def is_trace(path: Path, text: str) -> bool:
    """Whether a workload file is a JSON-lines trace: named ``*.jsonl`` (any case), or its first
    line is a JSON object naming ``inputTokens`` and more lines follow (a trace saved as ``.json``)."""
    if path.suffix.lower() == ".jsonl":
        return True
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2 or not lines[0].lstrip().startswith("{"):
        return False
    try:
        first = json.loads(lines[0])
    except json.JSONDecodeError:
        return False
    return isinstance(first, dict) and "inputTokens" in first


def read_profile(text: str, source: str) -> WorkloadProfile:
    """A WorkloadProfile from YAML/JSON text (bare, or wrapped as ``{profile: ...}``); ``UsageError``
    naming ``source`` and the field, in ``polymorph validate``'s words, otherwise."""
    doc = load_yaml(text, f"workload file {source}")
    if isinstance(doc, dict) and set(doc) == {"profile"}:
        doc = doc["profile"]
    if not isinstance(doc, dict):
        raise UsageError(
            f"workload file {source} must hold a profile with inputTokens, outputTokens and concurrency, "
            "or be a JSON-lines trace (.jsonl)."
        )
    try:
        profile = WorkloadProfile.model_validate(doc)
    except ValidationError as exc:
        lines = format_validation_error(exc, root=WorkloadProfile)
        raise UsageError(f"workload file {source}: {lines[0]}.") from None
    for name, hist in (("inputTokens", profile.inputTokens), ("outputTokens", profile.outputTokens)):
        if hist.bounds[-1] > MAX_REQUEST_TOKENS:
            raise UsageError(
                f"workload file {source}: {name}.bounds[{len(hist.bounds) - 1}] is {hist.bounds[-1]}; "
                f"a request holds at most {MAX_REQUEST_TOKENS} tokens."
            )
    return profile


def fit_workload(
    workload: Workload,
    *,
    max_requests: int | None = None,
    max_input: int | None = None,
    max_output: int | None = None,
    max_concurrency: int | None = None,
    time_scale: float = 1.0,
) -> Workload:
    """Scale ``workload`` down for a small device while keeping its shape.

    Keeps ``max_requests`` requests spread evenly over the whole workload (every k-th, in arrival
    order: a long trace keeps its shape, not its first minutes); scales all input lengths by one factor so the
    longest is at most ``max_input`` (and likewise outputs), rounding up so no length hits 0;
    caps concurrency; multiplies arrival offsets by ``time_scale``. The same call on the same
    workload always gives the same result, so hot and cold runs see identical requests.
    """
    requests = list(workload.requests)
    if max_requests and len(requests) > max_requests:
        requests = [requests[i * len(requests) // max_requests] for i in range(max_requests)]
    in_factor = _factor([r.input_tokens for r in requests], max_input)
    out_factor = _factor([r.output_tokens for r in requests], max_output)
    scaled = [
        replace(
            r,
            input_tokens=_scale(r.input_tokens, in_factor),
            output_tokens=_scale(r.output_tokens, out_factor),
            arrival_s=r.arrival_s * time_scale,
        )
        for r in requests
    ]
    concurrency = min(workload.concurrency, max_concurrency) if max_concurrency else workload.concurrency
    return Workload(tuple(scaled), concurrency, workload.digest)


def _scale(length: int, factor: float) -> int:
    # The epsilon keeps float noise (10 * 0.2 = 2.0000000000000004) from rounding up a whole token.
    return max(1, math.ceil(length * factor - 1e-9))


def _factor(lengths: list[int], cap: int | None) -> float:
    longest = max(lengths)
    return 1.0 if cap is None or longest <= cap else cap / longest


def serving_max_batch(args: list[str]) -> int:
    """The ``--max-batch`` that engine arguments (a deployment's ``spec.engine.args``) give its pods.

    The last one wins, as on the engine's command line; ``SERVING_MAX_BATCH`` when none is given
    (or its value is not a whole number in range, which the engine refuses at start-up)."""
    value: str | None = None
    for i, arg in enumerate(args):
        if arg == "--max-batch" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--max-batch="):
            value = arg.split("=", 1)[1]
    if value is not None and value.isdigit() and 1 <= int(value) <= MAX_SERVING_BATCH:
        return int(value)
    return SERVING_MAX_BATCH
