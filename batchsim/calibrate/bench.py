"""Real serving-benchmark results, read into one validated columnar :class:`BenchRun`.

Four tools' output files are read (and written, so that tests and calibration
checks can build files without downloading any):

``vllm``
    ``vllm bench serve --save-result --save-detailed`` JSON, vllm 0.33.0
    (``vllm/benchmarks/serve.py``). Run settings (``model_id``,
    ``request_rate`` as a number or ``"inf"``, ``burstiness``,
    ``max_concurrency``), totals, summary keys (``mean_ttft_ms``,
    ``median_ttft_ms``, ``p99_ttft_ms``, same for tpot/itl/e2el) and, with
    ``--save-detailed``, the per-request lists ``input_lens``,
    ``output_lens``, ``ttfts`` (s), ``itls`` (a list of gaps in s per
    request), ``latencies`` (s), ``start_times`` (``time.perf_counter``
    values), ``errors`` and ``generated_texts``. The lists hold every request,
    failed ones too (non-empty ``errors[i]``, ttft 0, output 0). Files of
    older versions (vllm 0.10) have no ``latencies`` (then latency = ttft +
    sum of the gaps) and no ``start_times`` (then only a closed-loop run, one
    with ``max_concurrency``, can be read, with every start at 0).
``guidellm``
    GuideLLM 0.8.1 ``benchmarks.json``, the pydantic dump of
    ``GenerativeBenchmarksReport`` (``metadata.version`` 2): ``benchmarks[]``
    of ``type_`` ``"generative_benchmark"``, each with its
    ``config.strategy`` (``synchronous``, ``concurrent`` with ``streams``,
    ``throughput`` with ``max_concurrency``, ``constant`` / ``poisson``
    with ``rate``) and ``requests.successful/errored/incomplete`` lists of
    ``GenerativeRequestStats`` (``info.timings.request_start`` etc. in epoch
    seconds, ``prompt_tokens``, ``output_tokens``, ``request_latency`` in s,
    ``time_to_first_token_ms``, ``inter_token_latency_ms``). GuideLLM keeps no
    per-token gaps: a request's gaps are ``output_tokens - 1`` copies of its
    ``inter_token_latency_ms``, so ITL percentiles of a GuideLLM run are
    percentiles of per-request means, not of single gaps. Starts are epoch
    seconds in float64, good to about 1e-6 s.
``sglang``
    ``python -m sglang.benchmark.serving`` (formerly ``sglang.bench_serving``)
    ``--output-file F.jsonl --output-details``, SGLang 0.5.23
    (``sglang/benchmark/serving.py``): one JSON object per line, one line
    appended per benchmark run, with ``backend``, ``dataset_name``,
    ``request_rate`` (a number, ``Infinity`` or ``"trace"``),
    ``max_concurrency``, summary keys like vLLM's and, with
    ``--output-details``, the per-request lists ``input_lens``,
    ``output_lens``, ``ttfts`` (s), ``itls`` (gaps in s per request),
    ``generated_texts`` and ``errors``. It saves no send times and no
    latencies (latency = ttft + sum of the gaps): a closed-loop run
    (``max_concurrency``) or one at an infinite rate (every request sent at
    once) can be replayed, a finite-rate run cannot. (``vllm bench serve
    --append-result`` writes a JSONL file too, one vllm result per line; both
    are read line by line.)
``genai-perf``
    genai-perf 0.0.16 ``profile_export.json``, written by perf_analyzer:
    ``experiments[]``, each with ``experiment`` {``mode``: ``"concurrency"``
    or ``"request_rate"``, ``value``} and ``requests[]`` of ``timestamp``
    (ns), ``request_inputs.payload`` (the request JSON as a string),
    ``response_timestamps`` (ns) and ``response_outputs[].response`` (the SSE
    text of each chunk). The file has no token counts (genai-perf tokenizes
    the text itself); they are taken from OpenAI streaming usage, the last
    chunk's ``usage`` {``prompt_tokens``, ``completion_tokens``}, which the
    server sends only when the payload asked for it with
    ``"stream_options": {"include_usage": true}``. TTFT is the first
    token-bearing chunk's time, latency the last chunk's; gaps are the
    differences of the token-bearing chunks' times (usage-only chunks, with
    empty ``choices``, and ``data: [DONE]`` are skipped). One chunk may carry
    several tokens: the gaps stay as timed, ``output_tokens`` is
    ``completion_tokens``.

:func:`read_bench` detects the format from the contents and returns one
:class:`BenchRun` per benchmark in the file. Every bad input raises
:class:`~batchsim.sim.errors.InputError` whose ``where`` names the file and
the field (``"bench.json: ttfts"``) and whose message gives the bad value.
:func:`run_from_records` turns batchsim's own request and ITL records into a
:class:`BenchRun`, so a simulated run can be written in any of the formats and
compared with a real one.
"""

from __future__ import annotations

import dataclasses

import json
import math
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from batchsim.sim.errors import InputError
from batchsim.sim.sending import BURST, CLOSED, NEITHER, sending

if TYPE_CHECKING:  # pandas only for run_from_records
    import pandas as pd

__all__ = ["FORMATS", "METRICS", "MODES", "BenchRun", "read_bench", "run_from_records", "write_genai_perf",
           "write_guidellm", "write_sglang_bench", "write_vllm_bench"]

FORMATS = ("vllm", "sglang", "guidellm", "genai-perf")
MODES = ("rate", "concurrency", "trace")
METRICS = ("ttft", "tpot", "itl", "e2el")

PathLike = str | os.PathLike

_VLLM_KEYS = frozenset({"input_lens", "output_lens", "ttfts", "itls", "request_rate", "num_prompts",
                        "mean_ttft_ms", "median_ttft_ms", "request_throughput", "endpoint_type"})
_VLLM_DETAILED = ("input_lens", "output_lens", "ttfts", "itls")
_DECODER = json.JSONDecoder()
_GUIDELLM_STRATEGIES = ("synchronous", "concurrent", "throughput", "constant", "poisson")
_MAX_TOKENS = 2 ** 53  # exact in float64, far beyond any context window

# Clock origins the writers use (the readers subtract the first request's time).
_PERF_BASE = 12345.0  # s, a time.perf_counter() value
_EPOCH_BASE = 1_700_000_000.0  # s, 2023-11-14
_EPOCH_BASE_NS = 1_700_000_000_000_000_000  # ns


@dataclass(frozen=True, eq=False)
class BenchRun:
    """One benchmark (one load level) of a real serving benchmark, successful requests only.

    Columns are sorted by ``start``; all times are seconds. Request ``i``'s
    inter-token gaps are ``itl_gaps[itl_offsets[i]:itl_offsets[i + 1]]``.
    """

    source: str  # the file path as given
    format: str  # "vllm" | "sglang" | "guidellm" | "genai-perf" ("batchsim" from run_from_records)
    label: str  # "rate=4.0", "concurrency=16", "poisson@4.0", ...; one per benchmark in the file
    model: str | None  # model id if the file names one
    mode: str  # "rate" (open loop) | "concurrency" (closed loop) | "trace" (arrival times only)
    rate: float | None  # req/s when mode == "rate"
    concurrency: int | None
    start: np.ndarray  # float64 s, send time after the first request's
    input_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    ttft: np.ndarray  # float64 s
    latency: np.ndarray  # float64 s, end to end
    itl_gaps: np.ndarray  # float64 s, every request's gaps, in request order
    itl_offsets: np.ndarray  # int64, len n + 1
    failed: int  # failed / errored / incomplete requests (not in the columns)
    file_rows: np.ndarray | None = None  # int64 per request: its index among the file's requests (errors name it)

    def __post_init__(self) -> None:
        n = len(self.start)
        for name in ("input_tokens", "output_tokens", "ttft", "latency"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"BenchRun.{name} has {len(getattr(self, name))} rows; expected {n} like start")
        off = self.itl_offsets
        if len(off) != n + 1 or off[0] != 0 or off[-1] != len(self.itl_gaps) or np.any(np.diff(off) < 0):
            raise ValueError(f"BenchRun.itl_offsets must be {n + 1} non-decreasing offsets from 0 to "
                             f"{len(self.itl_gaps)} (len(itl_gaps))")
        if self.mode not in MODES:
            raise ValueError(f"BenchRun.mode is {self.mode!r}; expected one of {', '.join(MODES)}")

    def __len__(self) -> int:
        return len(self.start)

    @property
    def tpot(self) -> np.ndarray:
        """Per request (latency - ttft) / (output_tokens - 1); NaN where output_tokens <= 1."""
        out = self.output_tokens
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (self.latency - self.ttft) / (out - 1)
        return np.where(out > 1, t, np.nan)

    def gaps(self, i: int) -> np.ndarray:
        """Request ``i``'s inter-token gaps (s)."""
        return self.itl_gaps[self.itl_offsets[i]:self.itl_offsets[i + 1]]

    def file_row(self, i: int) -> int:
        """Request ``i``'s index among the file's requests (``i`` itself when the file's order is not known)."""
        return int(self.file_rows[i]) if self.file_rows is not None else int(i)

    def with_mean_gaps(self) -> "BenchRun":
        """This run with each request's gaps replaced by their mean: the ITL a GuideLLM report keeps
        (one ``inter_token_latency_ms`` per request), so a simulated run compares like for like."""
        lens = np.diff(self.itl_offsets)
        sums = _gap_sums(self.itl_gaps, lens)
        with np.errstate(divide="ignore", invalid="ignore"):
            means = np.where(lens > 0, sums / np.maximum(lens, 1), 0.0)
        return dataclasses.replace(self, itl_gaps=np.repeat(means, lens).astype(np.float64))

    def percentiles(self, metric: str, ps: Sequence[float] = (50, 99)) -> dict[str, float]:
        """``{"p50": ..., "p99": ...}`` in seconds of ttft, tpot, itl (all gaps pooled) or e2el.

        ``np.percentile``'s default (linear) method; NaN tpots (one-token
        requests) are left out; NaN for every p when nothing is left.
        """
        columns = {"ttft": self.ttft, "tpot": self.tpot, "itl": self.itl_gaps, "e2el": self.latency}
        if metric not in columns:
            raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
        v = columns[metric]
        v = v[~np.isnan(v)]
        ps = list(ps)
        vals = np.percentile(v, ps) if len(v) else np.full(len(ps), np.nan)
        return {f"p{p:g}": float(x) for p, x in zip(ps, vals, strict=True)}


# ----------------------------------------------------------------------------- validation helpers


def _short(v: object) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _fail(where: str, message: str) -> InputError:
    return InputError(message, where)


def _shown(v: object) -> str:
    return "missing (null)" if v is None else _short(v)


class _Bad(Exception):
    """Entry ``index`` of a list is wrong; ``text`` is the value and what was wrong with it."""

    def __init__(self, index: int, text: str) -> None:
        super().__init__(text)
        self.index, self.text = index, text


def _floats(values: list, nonneg: bool) -> np.ndarray:
    """float64 of a JSON list, or :class:`_Bad` for the first non-number, non-finite or negative entry."""
    if not set(map(type, values)) <= {int, float}:  # NOTE: bool is its own type, so True is refused here
        i, v = next((i, v) for i, v in enumerate(values) if type(v) not in (int, float))
        raise _Bad(i, _shown(v))
    try:
        a = np.array(values, dtype=np.float64)
    except OverflowError:  # an integer beyond float64
        i, v = next((i, v) for i, v in enumerate(values) if type(v) is int and abs(v) > 1e308)
        raise _Bad(i, _short(v)) from None
    ok = np.isfinite(a)
    if nonneg:
        ok &= a >= 0
    if not ok.all():
        i = int(np.argmin(ok))
        raise _Bad(i, f"{_short(values[i])} ({'not finite' if not np.isfinite(a[i]) else 'negative'})")
    return a


def _numbers(values: list, where: str, what: str, *, nonneg: bool = True, item: str = "entry") -> np.ndarray:
    """A JSON list as float64; the first non-number, non-finite or (if ``nonneg``) negative entry raises."""
    try:
        return _floats(values, nonneg)
    except _Bad as e:
        raise _fail(where, f"{item} {e.index} is {e.text}; expected {what}") from None


def _integers(values: list, where: str, what: str = "a token count (an integer >= 0)", *,
              item: str = "entry") -> np.ndarray:
    """A JSON list of non-negative integers (integral floats accepted) as int64."""
    a = _numbers(values, where, what, item=item)
    bad = (a != np.floor(a)) | (a > _MAX_TOKENS)
    if bad.any():
        i = int(np.argmax(bad))
        raise _fail(where, f"{item} {i} is {_short(values[i])}; expected {what}")
    return a.astype(np.int64)


def _ragged(values: list, where: str, what: str, item: str = "entry") -> tuple[np.ndarray, np.ndarray]:
    """A JSON list of lists of times: (flat float64, lengths int64)."""
    if not set(map(type, values)) <= {list}:
        i, v = next((i, v) for i, v in enumerate(values) if type(v) is not list)
        raise _fail(where, f"{item} {i} is {_shown(v)}; expected a list of {what}")
    lens = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    try:
        return _floats([x for row in values for x in row], True), lens
    except _Bad as e:  # name the request and its gap, not the flat index
        off = _offsets(lens)
        i = int(np.searchsorted(off, e.index, side="right") - 1)
        raise _fail(where, f"{item} {i} gap {e.index - off[i]} is {e.text}; expected {what}") from None


def _obj(v: Any, where: str, what: str) -> dict:
    if not isinstance(v, dict):
        raise _fail(where, f"is {_shown(v)}; expected {what}")
    return v


def _lst(v: Any, where: str, what: str) -> list:
    if not isinstance(v, list):
        raise _fail(where, f"is {_shown(v)}; expected {what}")
    return v


def _positive_int(v: Any, where: str, what: str) -> int:
    if type(v) is float and v.is_integer():
        v = int(v)
    if type(v) is not int or v <= 0:
        raise _fail(where, f"is {_shown(v)}; expected {what}")
    return v


def _positive_rate(v: Any, where: str, what: str) -> float:
    if type(v) not in (int, float) or not (-1e308 < v < 1e308) or not v > 0:
        raise _fail(where, f"is {_shown(v)}; expected {what}")
    return float(v)


def _field(path: PathLike, prefix: str = ""):
    """A function naming a field of ``path`` under ``prefix`` for ``where``: ``"f.json: benchmarks[0].config"``."""
    def at(key: str = "") -> str:
        if prefix.startswith("line ") and key:  # (a JSONL line's field: "f.jsonl: line 3, field 'request_rate'")
            return f"{path}: {prefix}, field '{key}'"
        name = ".".join(x for x in (prefix, key) if x)
        return f"{path}: {name}" if name else str(path)
    return at


def _gap_sums(gaps: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Each request's gaps summed (0.0 for one without), ``lens`` gaps each, in request order."""
    return np.bincount(np.repeat(np.arange(len(lens)), lens), weights=gaps, minlength=len(lens))


def _offsets(lens: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lens, dtype=np.int64)])


def _make_run(source: PathLike, fmt: str, label: str, model: str | None, mode: str, rate: float | None,
              concurrency: int | None, start: np.ndarray, inp: np.ndarray, out: np.ndarray, ttft: np.ndarray,
              latency: np.ndarray, gaps: np.ndarray, lens: np.ndarray, failed: int,
              where: str | None = None, rows: np.ndarray | None = None) -> BenchRun:
    """Sort the successful requests by start, rebase start to 0, check latency >= ttft."""
    if where is not None:
        short = latency < ttft - 1e-6 * np.maximum(1.0, ttft)  # NOTE: tolerance for clocks rounded apart
        if short.any():
            k = int(np.argmax(short))
            i = int(rows[k]) if rows is not None else k
            raise _fail(where, f"request {i}: latency {float(latency[k])!r} s is shorter than its ttft "
                               f"{float(ttft[k])!r} s; expected the end-to-end time, at least the time to first token")
    order = np.argsort(start, kind="stable")
    off = _offsets(lens)
    lens = lens[order]
    new_off = _offsets(lens)
    # gap j of sorted request k sits at off[order[k]] + j in the file's order
    idx = np.repeat(off[:-1][order] - new_off[:-1], lens) + np.arange(new_off[-1], dtype=np.int64)
    start = start[order]
    start = start - start[0] if len(start) else start
    file_rows = (np.asarray(rows, dtype=np.int64) if rows is not None else np.arange(len(order), dtype=np.int64))
    return BenchRun(str(source), fmt, label, model, mode, rate, concurrency, start.astype(np.float64),
                    inp[order].astype(np.int64), out[order].astype(np.int64), ttft[order].astype(np.float64),
                    latency[order].astype(np.float64), gaps[idx].astype(np.float64), new_off, int(failed),
                    file_rows[order])


def _num_label(x: float) -> str:
    return repr(float(x))


# ----------------------------------------------------------------------------- reading


def read_bench(path: PathLike) -> list[BenchRun]:
    """Every benchmark in a vllm bench serve, SGLang bench_serving, GuideLLM or genai-perf result file (format
    from the contents)."""
    where = str(path)
    expected = ("the JSON result of vllm bench serve, SGLang bench_serving (JSONL), GuideLLM (benchmarks.json) or "
                "genai-perf (profile_export.json)")
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # NOTE: -sig: a BOM is not an error
    except UnicodeDecodeError as e:
        raise _fail(where, f"not UTF-8 text ({e.reason}); expected {expected}") from None
    except OSError as e:
        raise _fail(where, f"cannot be read ({e.strerror or e}); expected {expected}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # several JSON values: SGLang appends one object per run (JSONL)
            return _read_jsonl(path, text, expected)
        raise _fail(where, f"not JSON ({e.msg} at line {e.lineno} column {e.colno}); expected {expected}") from None
    except RecursionError:
        raise _fail(where, f"JSON nested too deeply; expected {expected}") from None
    if not isinstance(data, dict):
        raise _fail(where, f"holds a JSON {type(data).__name__}, not an object; expected {expected}")
    if "benchmarks" in data:
        return _read_guidellm(path, data)
    if "experiments" in data:
        return _read_genai_perf(path, data)
    if _is_sglang(data):
        return [_read_vllm(path, data, "sglang")]
    if _VLLM_KEYS & data.keys():
        return [_read_vllm(path, data)]
    keys = ", ".join(list(data)[:8]) + (", ..." if len(data) > 8 else "")
    raise _fail(where, f"unknown format (top-level keys: {keys or 'none'}); expected {expected}: "
                       "vllm has ttfts/itls/request_rate, GuideLLM has benchmarks, genai-perf has experiments")


def _is_sglang(data: dict) -> bool:
    """SGLang bench_serving's result: its run settings, none of vllm bench serve's own keys."""
    return "dataset_name" in data and "random_input_len" in data and not {"model_id", "endpoint_type"} & data.keys()


def _read_jsonl(path: PathLike, text: str, expected: str) -> list[BenchRun]:
    """One benchmark object per line: SGLang bench_serving's output file, or vllm bench serve's with
    ``--append-result``."""
    one = "one SGLang bench_serving or vllm bench serve (--append-result) result object per line"
    runs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}: line {lineno}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise _fail(where, f"not JSON ({e.msg} at column {e.colno}); expected {one}") from None
        except RecursionError:
            raise _fail(where, f"JSON nested too deeply; expected {one}") from None
        if isinstance(data, dict) and _is_sglang(data):
            runs.append(_read_vllm(path, data, "sglang", f"line {lineno}"))
        elif isinstance(data, dict) and _VLLM_KEYS & data.keys():
            runs.append(_read_vllm(path, data, "vllm", f"line {lineno}"))
        else:
            what = f"a JSON {type(data).__name__}" if not isinstance(data, dict) else "an object of neither tool"
            raise _fail(where, f"is {what}; expected {expected}: a file of several JSON values holds {one}")
    return runs


def _read_vllm(path: PathLike, data: dict, fmt: str = "vllm", prefix: str = "") -> BenchRun:
    """vllm bench serve's JSON, or one SGLang bench_serving result (``fmt`` "sglang", the same lists)."""
    at = _field(path, prefix)
    tool = ("python -m sglang.benchmark.serving with --output-details" if fmt == "sglang"
            else "vllm bench serve with --save-result --save-detailed")
    missing = [k for k in _VLLM_DETAILED if k not in data]
    if len(missing) == len(_VLLM_DETAILED):
        summary = [k for k in data if k.endswith("_ms")]
        shown = ", ".join(summary[:4]) + (", ..." if len(summary) > 4 else "") if summary else "none"
        raise _fail(at("input_lens"), "not found: the file has only summary keys (" + shown + "), no per-request "
                    f"lists input_lens, output_lens, ttfts, itls; re-run {tool}")
    if missing:
        raise _fail(at(missing[0]), f"not found; expected a per-request list, as {tool} saves")
    inputs = _lst(data["input_lens"], at("input_lens"), "a list with one prompt length per request")
    n = len(inputs)
    if n == 0:
        raise _fail(at("input_lens"), "is empty; expected one entry per request")
    lists: dict[str, list] = {"input_lens": inputs}
    for key in ("output_lens", "ttfts", "itls", "latencies", "start_times", "errors"):
        if key not in data:
            continue
        v = _lst(data[key], at(key), "a list with one entry per request")
        if len(v) != n:
            raise _fail(at(key), f"has {len(v)} entries; expected {n}, one per request like input_lens")
        lists[key] = v

    # run settings
    rate_raw = data.get("request_rate", "inf")
    if fmt == "sglang" and rate_raw == "trace":
        raise _fail(at("request_rate"), "is \"trace\" (requests sent at a dataset's timestamps): SGLang saves no "
                                        "send times, so the arrivals cannot be replayed; expected a run with "
                                        "--max-concurrency or at --request-rate inf")
    if isinstance(rate_raw, str) and rate_raw.strip().lower() in ("inf", "infinity"):
        rate = math.inf
    elif type(rate_raw) in (int, float) and not math.isnan(rate_raw) and rate_raw > 0:
        rate = float(rate_raw) if rate_raw < 1e308 else math.inf
    else:
        raise _fail(at("request_rate"), f"is {_shown(rate_raw)}; expected requests per second > 0 or \"inf\"")
    conc = data.get("max_concurrency")
    if conc is not None:
        conc = _positive_int(conc, at("max_concurrency"), "a positive integer or null")
    sent = sending(rate, conc, "start_times" in lists)
    if sent == CLOSED:
        mode, label = "concurrency", f"concurrency={conc}"
    elif sent == BURST:
        mode, label = "trace", "rate=inf"
    else:
        mode, label = "rate", f"rate={_num_label(rate)}"
    model = data.get("model_id")
    if fmt == "sglang":
        info = data.get("server_info")
        model = info.get("model_path") if isinstance(info, dict) else None
    model = model if isinstance(model, str) and model else None

    # failed requests: non-empty error text (their other entries are not checked)
    errors = lists.get("errors")
    if errors is not None:
        bad = next((i for i, e in enumerate(errors) if e is not None and not isinstance(e, str)), None)
        if bad is not None:
            raise _fail(at("errors"), f"entry {bad} is {_short(errors[bad])}; expected an error text or \"\"")
        err = np.fromiter((bool(e) for e in errors), dtype=bool, count=n)
    else:
        err = np.zeros(n, dtype=bool)

    def scrub(v: list, blank: Any) -> list:
        return [blank if e else x for x, e in zip(v, err.tolist(), strict=True)] if err.any() else v

    inp = _integers(scrub(inputs, 0), at("input_lens"), "a prompt length (an integer >= 0)")
    out = _integers(scrub(lists["output_lens"], 0), at("output_lens"), "an output length (an integer >= 0)")
    ttft = _numbers(scrub(lists["ttfts"], 0.0), at("ttfts"), "a time to first token in seconds (>= 0)")
    gaps, lens = _ragged(scrub(lists["itls"], []), at("itls"), "inter-token gaps in seconds (>= 0)")
    if "latencies" in lists:
        lat = _numbers(scrub(lists["latencies"], 0.0), at("latencies"), "an end-to-end latency in seconds (>= 0)")
    else:  # NOTE: vllm 0.10 saved no latencies; its e2el was ttft + the sum of the gaps too
        lat = ttft + _gap_sums(gaps, lens)
    if "start_times" in lists:
        start = _numbers(scrub(lists["start_times"], 0.0), at("start_times"), "a perf_counter time in seconds",
                         nonneg=False)
    elif sent in (CLOSED, BURST):
        # closed loop: the arrivals follow from the completions, not the file; an infinite rate sends all at once
        start = np.zeros(n)
    elif fmt == "sglang":
        raise _fail(at("request_rate"), f"is {_shown(rate_raw)}: SGLang saves no send times, so a finite-rate run's "
                                        "arrivals cannot be replayed (with max_concurrency too: requests sent at a "
                                        "rate and capped in flight are neither a closed loop nor a burst); expected "
                                        "a run with --max-concurrency at --request-rate inf, or at --request-rate inf")
    else:
        raise _fail(at("start_times"), "not found (older vllm bench serve, e.g. 0.10, did not save it): "
                                       f"the arrival times of a run at request_rate {_shown(rate_raw)} cannot be "
                                       "replayed" + (f" (max_concurrency {conc} caps it in flight, so it is no closed "
                                                     "loop either)" if sent == NEITHER else "")
                                       + "; expected per-request send times, a closed-loop run (max_concurrency set "
                                       "at an infinite rate), or an infinite rate")

    failed = err | ((out == 0) & (ttft == 0))  # vLLM leaves ttft 0 and output 0 on a failed request
    keep = np.flatnonzero(~failed)
    kept_gaps = np.repeat(~failed, lens)
    return _make_run(path, fmt, label, model, mode, None if mode != "rate" else rate, conc,
                     start[keep], inp[keep], out[keep], ttft[keep], lat[keep], gaps[kept_gaps], lens[keep],
                     int(failed.sum()), at("latencies" if "latencies" in lists else "itls"), keep)


def _strategy(strategy: dict, at) -> tuple[str, str, float | None, int | None]:
    """(mode, label, rate, concurrency) of a GuideLLM scheduling strategy."""
    kind = strategy.get("type_")
    if kind not in _GUIDELLM_STRATEGIES:
        raise _fail(at("config.strategy.type_"),
                    f"is {_shown(kind)}; expected one of {', '.join(_GUIDELLM_STRATEGIES)}")
    mc = strategy.get("max_concurrency")
    if mc is not None:
        mc = _positive_int(mc, at("config.strategy.max_concurrency"), "a positive integer or null")
    if kind == "synchronous":
        return "concurrency", "synchronous", None, 1
    if kind == "concurrent":
        streams = _positive_int(strategy.get("streams"), at("config.strategy.streams"),
                                "the number of concurrent streams (a positive integer)")
        return "concurrency", f"concurrent@{streams}", None, streams
    if kind == "throughput":
        return ("concurrency", f"throughput@{mc}", None, mc) if mc is not None else ("trace", "throughput", None, None)
    rate = _positive_rate(strategy.get("rate"), at("config.strategy.rate"), "requests per second (a number > 0)")
    return "rate", f"{kind}@{_num_label(rate)}", rate, mc


def _read_guidellm(path: PathLike, data: dict) -> list[BenchRun]:
    benches = _lst(data["benchmarks"], f"{path}: benchmarks", "a list of GuideLLM benchmarks")
    if not benches:
        raise _fail(f"{path}: benchmarks", "is empty; expected at least one benchmark")
    top = data.get("config")
    top_model = top.get("model") if isinstance(top, dict) else None
    runs = []
    for b, bench in enumerate(benches):
        at = _field(path, f"benchmarks[{b}]")
        bench = _obj(bench, at(""), "a GuideLLM benchmark object")
        if bench.get("type_") != "generative_benchmark":
            raise _fail(at("type_"), f"is {_shown(bench.get('type_'))}; expected \"generative_benchmark\"")
        cfg = _obj(bench.get("config"), at("config"), "the benchmark's config object")
        mode, label, rate, conc = _strategy(_obj(cfg.get("strategy"), at("config.strategy"),
                                                 "the scheduling strategy object"), at)
        model = cfg.get("model") or top_model
        reqs = _obj(bench.get("requests"), at("requests"), "an object of successful/errored/incomplete lists")
        succ = _lst(reqs.get("successful"), at("requests.successful"), "a list of request stats")
        failed = 0
        for key in ("errored", "incomplete"):
            if reqs.get(key) is not None:
                failed += len(_lst(reqs[key], at(f"requests.{key}"), "a list of request stats"))
        stats = [_obj(r, at(f"requests.successful[{i}]"), "a request stats object") for i, r in enumerate(succ)]
        sat = _field(path, f"benchmarks[{b}].requests.successful[]")
        metrics = bench.get("metrics")
        totals = (metrics.get("request_totals") if isinstance(metrics, dict) else None) or bench.get("request_totals")
        total_ok = totals.get("successful") if isinstance(totals, dict) else None
        if type(total_ok) is int and total_ok > len(stats):
            raise _fail(at("requests.successful"),
                        f"holds {len(stats)} of the benchmark's {total_ok} successful requests "
                        "(metrics.request_totals.successful): GuideLLM kept a sample of them (--sample-requests / "
                        "--output-sampling), and a sample replayed alone is a lighter load than the server saw; "
                        "expected every request: rerun GuideLLM keeping them all")

        def timing(r: dict) -> Any:
            info = r.get("info")
            t = info.get("timings") if isinstance(info, dict) else None
            return t.get("request_start") if isinstance(t, dict) else None

        kw = {"item": "request"}
        start = _numbers([timing(r) for r in stats], sat("info.timings.request_start"),
                         "an epoch time in seconds", nonneg=False, **kw)
        inp = _integers([r.get("prompt_tokens") for r in stats], sat("prompt_tokens"),
                        "a prompt length (an integer >= 0)", **kw)
        out = _integers([r.get("output_tokens") for r in stats], sat("output_tokens"),
                        "an output length (an integer >= 0)", **kw)
        lat = _numbers([r.get("request_latency") for r in stats], sat("request_latency"),
                       "an end-to-end latency in seconds (>= 0)", **kw)
        ttft = _numbers([r.get("time_to_first_token_ms") for r in stats], sat("time_to_first_token_ms"),
                        "a time to first token in ms (>= 0)", **kw) / 1000.0
        # NOTE: GuideLLM leaves inter_token_latency_ms null for a one-token output; no gaps then
        itl_ms = [r.get("inter_token_latency_ms") if o > 1 else 0.0 for r, o in zip(stats, out.tolist(), strict=True)]
        itl = _numbers(itl_ms, sat("inter_token_latency_ms"), "an inter-token latency in ms (>= 0)", **kw) / 1000.0
        lens = np.maximum(out - 1, 0)
        runs.append(_make_run(path, "guidellm", label, model if isinstance(model, str) and model else None,
                              mode, rate, conc, start, inp, out, ttft, lat, np.repeat(itl, lens), lens, failed,
                              sat("request_latency")))
    return runs


def _sse_events(text: str) -> list[str]:
    """The ``data:`` payloads of one SSE response text (the whole text if it is not SSE)."""
    s = text.strip()
    if not s.startswith("data:"):
        return [s] if s else []
    return [line.strip()[5:].strip() for line in s.splitlines() if line.strip().startswith("data:")]


def _read_genai_perf(path: PathLike, data: dict) -> list[BenchRun]:
    exps = _lst(data["experiments"], f"{path}: experiments", "a list of perf_analyzer experiments")
    if not exps:
        raise _fail(f"{path}: experiments", "is empty; expected at least one experiment")
    service = data.get("service_kind")
    runs = []
    for e, exp in enumerate(exps):
        at = _field(path, f"experiments[{e}]")
        exp = _obj(exp, at(""), "an experiment object")
        ex = _obj(exp.get("experiment"), at("experiment"), "an object with mode and value")
        kind = ex.get("mode")
        if kind == "concurrency":
            conc = _positive_int(ex.get("value"), at("experiment.value"), "the concurrency (a positive integer)")
            mode, label, rate = "concurrency", f"concurrency={conc}", None
        elif kind == "request_rate":
            rate = _positive_rate(ex.get("value"), at("experiment.value"), "requests per second (a number > 0)")
            mode, label, conc = "rate", f"rate={_num_label(rate)}", None
        else:
            raise _fail(at("experiment.mode"), f"is {_shown(kind)}; expected \"concurrency\" or \"request_rate\"")
        reqs = _lst(exp.get("requests"), at("requests"), "a list of requests")
        model = None
        t0s, inp, out, ttft, lat, gap_rows, rows, no_usage = [], [], [], [], [], [], [], []
        failed = 0
        for k, req in enumerate(reqs):
            rat = _field(path, f"experiments[{e}].requests[{k}]")
            req = _obj(req, at(f"requests[{k}]"), "a request object")
            ts = req.get("timestamp")
            if type(ts) is not int or ts < 0:
                raise _fail(rat("timestamp"), f"is {_shown(ts)}; expected the send time in ns (an integer >= 0)")
            rts = _lst(req.get("response_timestamps"), rat("response_timestamps"), "a list of times in ns")
            outs = _lst(req.get("response_outputs"), rat("response_outputs"), "a list of response chunks")
            if len(outs) != len(rts):
                raise _fail(rat("response_outputs"), f"has {len(outs)} entries; expected {len(rts)}, one per "
                                                     "response timestamp")
            if k == 0:  # NOTE: one payload is enough (and a payload holds the whole prompt)
                model = _payload_model(req.get("request_inputs"))
            if not rts:  # no response at all: the request failed
                failed += 1
                continue
            if not set(map(type, rts)) <= {int}:
                j, v = next((j, v) for j, v in enumerate(rts) if type(v) is not int)
                raise _fail(rat("response_timestamps"), f"entry {j} is {_shown(v)}; expected a time in ns (an integer)")
            try:
                t = np.array(rts, dtype=np.int64) - ts
            except OverflowError:
                raise _fail(rat("response_timestamps"), "holds a time beyond 2**63 ns; expected times in ns") from None
            if t[0] < 0 or (np.diff(t) < 0).any():
                j = 0 if t[0] < 0 else int(np.argmax(np.diff(t) < 0)) + 1
                raise _fail(rat("response_timestamps"), f"entry {j} is {rts[j]}, earlier than "
                            + ("the request's timestamp" if j == 0 else f"entry {j - 1}")
                            + "; expected non-decreasing times after the send time")
            tokens, usage, error = [], None, None
            for j, o in enumerate(outs):
                resp = o.get("response") if isinstance(o, dict) else None
                if not isinstance(resp, str):
                    raise _fail(rat(f"response_outputs[{j}].response"),
                                f"is {_shown(resp)}; expected the SSE text of an OpenAI streaming chunk"
                                + (f" (service_kind is {service!r}; only openai files carry it)"
                                   if service not in (None, "openai") else ""))
                bearing = False
                for ev in _sse_events(resp):
                    if ev == "[DONE]":
                        continue
                    try:  # NOTE: raw_decode + the end check is json.loads for stripped text, with less overhead
                        chunk, end = _DECODER.raw_decode(ev)
                        if end != len(ev):
                            raise json.JSONDecodeError("Extra data", ev, end)
                    except (json.JSONDecodeError, RecursionError):
                        raise _fail(rat(f"response_outputs[{j}].response"),
                                    f"{_short(ev)} is not JSON; expected an OpenAI streaming chunk") from None
                    if not isinstance(chunk, dict):
                        raise _fail(rat(f"response_outputs[{j}].response"),
                                    f"{_short(ev)} is not a JSON object; expected an OpenAI streaming chunk")
                    if chunk.get("error"):
                        error = chunk["error"]
                    if isinstance(chunk.get("usage"), dict):
                        usage = (j, chunk["usage"])
                    bearing |= _has_text(chunk.get("choices"))
                if bearing:
                    tokens.append(j)
            if error is not None or not tokens:  # an error chunk, or no token came back
                failed += 1
                continue
            if usage is None:
                no_usage.append(k)
                continue
            j, u = usage
            uat = rat(f"response_outputs[{j}].response.usage")
            u_in, u_out = u.get("prompt_tokens"), u.get("completion_tokens")
            for name, v in (("prompt_tokens", u_in), ("completion_tokens", u_out)):
                if type(v) is not int or v < 0:
                    raise _fail(f"{uat}.{name}", f"is {_shown(v)}; expected a token count (an integer >= 0)")
            tt = t[tokens]
            t0s.append(ts)
            inp.append(u_in)
            out.append(u_out)
            ttft.append(tt[0])
            lat.append(tt[-1])  # (genai-perf: the last response with content; usage and [DONE] carry none)
            gap_rows.append(np.diff(tt))
            rows.append(k)
        if no_usage and not rows:
            raise _fail(at("requests[].response_outputs"),
                        "token counts are missing: no response carries OpenAI usage (prompt_tokens, "
                        "completion_tokens); run the benchmark with \"stream_options\": {\"include_usage\": true} "
                        "in the request payload (genai-perf --extra-inputs)")
        if no_usage:
            raise _fail(at(f"requests[{no_usage[0]}].response_outputs"),
                        "no chunk carries OpenAI usage (prompt_tokens, completion_tokens), though other requests' "
                        "do; expected every request sent with \"stream_options\": {\"include_usage\": true}")
        t0 = np.array(t0s, dtype=np.int64)
        start = ((t0 - t0.min()) / 1e9) if len(t0) else np.zeros(0)
        lens = np.fromiter(map(len, gap_rows), dtype=np.int64, count=len(gap_rows))
        gaps = np.concatenate(gap_rows) / 1e9 if gap_rows else np.zeros(0)
        runs.append(_make_run(path, "genai-perf", label, model, mode, rate, conc, start,
                              np.array(inp, dtype=np.int64), np.array(out, dtype=np.int64),
                              np.array(ttft, dtype=np.float64) / 1e9, np.array(lat, dtype=np.float64) / 1e9,
                              gaps, lens, failed, rows=np.array(rows, dtype=np.int64)))
    return runs


def _has_text(choices: Any) -> bool:
    """Whether a streaming chunk's choices carry output text: genai-perf's parser drops the responses
    with none (vLLM's role chunk, a final chunk with only ``finish_reason``, the usage chunk) before
    it takes TTFT, the gaps and the latency (``_preprocess_response``)."""
    if not isinstance(choices, list):
        return False
    for c in choices:
        if not isinstance(c, dict):
            continue
        for part in (c.get("delta"), c.get("message")):
            if isinstance(part, dict) and isinstance(part.get("content"), str) and part["content"]:
                return True
        if isinstance(c.get("text"), str) and c["text"]:
            return True
    return False


def _payload_model(inputs: Any) -> str | None:
    """The ``model`` of a genai-perf request payload, if it names one (the payload is not otherwise needed)."""
    payload = inputs.get("payload") if isinstance(inputs, dict) else None
    try:
        p = json.loads(payload) if isinstance(payload, str) else payload
    except (json.JSONDecodeError, RecursionError):
        return None
    m = p.get("model") if isinstance(p, dict) else None
    return m if isinstance(m, str) and m else None


# ----------------------------------------------------------------------------- writing


def _ms(v: np.ndarray) -> np.ndarray:
    return np.asarray(v, dtype=np.float64) * 1000.0


def _stat(v: np.ndarray, fn) -> float:
    v = v[~np.isnan(v)]
    return float(fn(v)) if len(v) else float("nan")


def _duration(run: BenchRun) -> float:
    return float(np.max(run.start + run.latency)) if len(run) else 0.0


def _request_gaps(run: BenchRun) -> list[np.ndarray]:
    return np.split(run.itl_gaps, run.itl_offsets[1:-1]) if len(run) else []


def _write(path: PathLike, data: dict) -> Path:
    p = Path(path)
    p.write_text(json.dumps(data), encoding="utf-8")
    return p


def write_vllm_bench(path: PathLike, run: BenchRun, *, save_detailed: bool = True) -> Path:
    """``run`` as ``vllm bench serve --save-result [--save-detailed]`` saves it; returns the path.

    ``run.failed`` requests are appended as vLLM records them (error text,
    ttft 0, output 0). Without ``save_detailed`` only the settings, totals and
    summary keys are written, like vLLM without ``--save-detailed``.
    """
    n, nf = len(run), run.failed
    if run.mode == "rate" and run.rate is None:
        raise ValueError("a rate-mode BenchRun needs its rate")
    if run.mode == "concurrency" and run.concurrency is None:
        raise ValueError("a concurrency-mode BenchRun needs its concurrency")
    duration = _duration(run)

    def tput(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    data: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai",
        "backend": "openai",
        "label": run.label,
        "model_id": run.model,
        "tokenizer_id": run.model,
        "num_prompts": n + nf,
        "request_rate": float(run.rate) if run.mode == "rate" else "inf",
        "burstiness": 1.0,
        "max_concurrency": run.concurrency,
        "duration": duration,
        "completed": n,
        "failed": nf,
        "total_input_tokens": int(run.input_tokens.sum()),
        "total_output_tokens": int(run.output_tokens.sum()),
        "request_throughput": tput(n),
        "request_goodput": None,
        "output_throughput": tput(float(run.output_tokens.sum())),
        "total_token_throughput": tput(float(run.input_tokens.sum() + run.output_tokens.sum())),
    }
    if save_detailed:
        data.update({
            "input_lens": run.input_tokens.tolist() + [0] * nf,
            "output_lens": run.output_tokens.tolist() + [0] * nf,
            "ttfts": run.ttft.tolist() + [0.0] * nf,
            "itls": [g.tolist() for g in _request_gaps(run)] + [[] for _ in range(nf)],
            "latencies": run.latency.tolist() + [0.0] * nf,
            "start_times": (_PERF_BASE + run.start).tolist() + [_PERF_BASE] * nf,
            "generated_texts": [""] * (n + nf),
            "errors": [""] * n + ["request failed (written by batchsim from a failure count)"] * nf,
        })
    for name, v in (("ttft", run.ttft), ("tpot", run.tpot), ("itl", run.itl_gaps), ("e2el", run.latency)):
        v = _ms(v)
        data[f"mean_{name}_ms"] = _stat(v, np.mean)
        data[f"median_{name}_ms"] = _stat(v, np.median)
        data[f"std_{name}_ms"] = _stat(v, np.std)
        data[f"p99_{name}_ms"] = _stat(v, lambda x: np.percentile(x, 99))
    return _write(path, data)


def write_sglang_bench(path: PathLike, runs: Sequence[BenchRun]) -> Path:
    """``runs`` as ``python -m sglang.benchmark.serving --output-file F --output-details`` appends them: one
    JSON line each; returns the path. SGLang saves no send times, so only closed-loop runs and runs at an
    infinite rate (mode ``concurrency`` or ``trace`` with every start 0) can be written."""
    lines = []
    for run in runs:
        n, nf = len(run), run.failed
        if run.mode == "rate" or (run.mode == "trace" and len(run) and float(run.start.max()) > 0):
            raise ValueError("SGLang's results hold no send times: only a closed-loop run or one at an infinite "
                             "rate (every start 0) can be written")
        duration = _duration(run)

        def tput(x: float) -> float:
            return x / duration if duration > 0 else 0.0

        data: dict[str, Any] = {
            "tag": run.label, "backend": "sglang", "dataset_name": "random",
            "request_rate": math.inf, "max_concurrency": run.concurrency,
            "sharegpt_output_len": None, "random_input_len": 1024, "random_output_len": 1024,
            "random_range_ratio": 0.0, "server_info": {"model_path": run.model} if run.model else None,
            "duration": duration, "completed": n,
            "total_input_tokens": int(run.input_tokens.sum()), "total_output_tokens": int(run.output_tokens.sum()),
            "request_throughput": tput(n), "input_throughput": tput(float(run.input_tokens.sum())),
            "output_throughput": tput(float(run.output_tokens.sum())),
            "total_throughput": tput(float(run.input_tokens.sum() + run.output_tokens.sum())),
        }
        for name, v in (("e2e_latency", run.latency), ("ttft", run.ttft), ("tpot", run.tpot), ("itl", run.itl_gaps)):
            v = _ms(v)
            data[f"mean_{name}_ms"] = _stat(v, np.mean)
            data[f"median_{name}_ms"] = _stat(v, np.median)
            data[f"std_{name}_ms"] = _stat(v, np.std)
            for q in (90, 95, 99):
                data[f"p{q}_{name}_ms"] = _stat(v, lambda x, q=q: np.percentile(x, q))
        data.update({
            "input_lens": run.input_tokens.tolist() + [0] * nf,
            "output_lens": run.output_tokens.tolist() + [0] * nf,
            "ttfts": run.ttft.tolist() + [0.0] * nf,
            "itls": [g.tolist() for g in _request_gaps(run)] + [[] for _ in range(nf)],
            "generated_texts": [""] * (n + nf),
            "errors": [""] * n + ["request failed (written by batchsim from a failure count)"] * nf,
        })
        lines.append(json.dumps(data))  # (math.inf as Infinity, as SGLang's json.dumps writes it)
    p = Path(path)
    p.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return p


def _guidellm_strategy(run: BenchRun) -> dict[str, Any]:
    kind = run.label.split("@", 1)[0]
    if run.mode == "concurrency":
        if run.concurrency is None:
            raise ValueError("a concurrency-mode BenchRun needs its concurrency")
        if kind == "synchronous" and run.concurrency == 1:
            return {"type_": "synchronous"}
        if kind == "throughput":
            return {"type_": "throughput", "max_concurrency": run.concurrency}
        return {"type_": "concurrent", "streams": run.concurrency}
    if run.mode == "rate":
        if run.rate is None:
            raise ValueError("a rate-mode BenchRun needs its rate")
        kind = kind if kind in ("constant", "poisson") else "poisson"
        s = {"type_": kind, "rate": float(run.rate), "max_concurrency": run.concurrency, "initial_burst": True}
        if kind == "poisson":
            s["random_seed"] = 42
        return s
    return {"type_": "throughput", "max_concurrency": None}


def _distribution(v: np.ndarray) -> dict[str, Any]:
    v = np.asarray(v, dtype=np.float64)
    v = v[~np.isnan(v)]
    if not len(v):
        return {"mean": 0.0, "median": 0.0, "std_dev": 0.0, "min": 0.0, "max": 0.0, "count": 0, "total_sum": 0.0,
                "percentiles": {p: 0.0 for p in ("p50", "p90", "p95", "p99")}}
    return {"mean": float(v.mean()), "median": float(np.median(v)), "std_dev": float(v.std()),
            "min": float(v.min()), "max": float(v.max()), "count": len(v), "total_sum": float(v.sum()),
            "percentiles": {f"p{p}": float(np.percentile(v, p)) for p in (50, 90, 95, 99)}}


def write_guidellm(path: PathLike, runs: Sequence[BenchRun]) -> Path:
    """``runs`` as GuideLLM 0.8.1's benchmarks.json, one benchmark each; returns the path.

    A request's ``inter_token_latency_ms`` is its gaps' sum over
    ``output_tokens - 1`` (GuideLLM's definition), so reading the file back
    gives per-request mean gaps. ``run.failed`` requests are written as errored.
    """
    benches = []
    for b, run in enumerate(runs):
        t0 = _EPOCH_BASE + 1000.0 * b  # benchmarks one after another
        succ = []
        for i, g in enumerate(_request_gaps(run)):
            s, ttft, lat = t0 + float(run.start[i]), float(run.ttft[i]), float(run.latency[i])
            inp, out = int(run.input_tokens[i]), int(run.output_tokens[i])
            last = s + ttft + float(g.sum())
            itl = 1000.0 * float(g.sum()) / (out - 1) if out > 1 else None
            succ.append({
                "type_": "generative_request_stats",
                "request_id": f"{b}-{i}",
                "request_type": "text_completions",
                "info": {"status": "completed", "error": None,
                         "timings": {"request_start": s, "first_token_iteration": s + ttft,
                                     "last_token_iteration": last, "request_end": s + lat,
                                     "token_iterations": len(g) + 1}},
                "input_metrics": {"text_tokens": inp, "total_tokens": inp},
                "output_metrics": {"text_tokens": out, "total_tokens": out},
                "prompt_tokens": inp,
                "output_tokens": out,
                "total_tokens": inp + out,
                "request_latency": lat,
                "time_to_first_token_ms": 1000.0 * ttft,
                "time_per_output_token_ms": 1000.0 * (last - s) / out if out else None,
                "inter_token_latency_ms": itl,
                "output_tokens_per_second": out / lat if lat > 0 else None,
            })
        errored = [{"type_": "generative_request_stats", "request_id": f"{b}-e{i}", "request_type": "text_completions",
                    "info": {"status": "errored", "error": "request failed (written by batchsim from a failure count)",
                             "timings": {"request_start": t0, "first_token_iteration": None,
                                         "last_token_iteration": None, "request_end": t0, "token_iterations": 0}},
                    "prompt_tokens": None, "output_tokens": None, "request_latency": 0.0,
                    "time_to_first_token_ms": None, "time_per_output_token_ms": None,
                    "inter_token_latency_ms": None} for i in range(run.failed)]
        duration = _duration(run)
        itl_means = np.array([r["inter_token_latency_ms"] for r in succ if r["inter_token_latency_ms"] is not None])
        benches.append({
            "type_": "generative_benchmark",
            "id_": f"batchsim-{b}",
            "run_id": "batchsim",
            "run_index": b,
            "config": {"strategy": _guidellm_strategy(run), "model": run.model},
            "start_time": t0,
            "end_time": t0 + duration,
            "duration": duration,
            "metrics": {
                "request_totals": {"successful": len(run), "errored": run.failed, "incomplete": 0,
                                   "total": len(run) + run.failed},
                "requests_per_second": {"successful": {"mean": len(run) / duration if duration > 0 else 0.0}},
                "request_latency": {"successful": _distribution(run.latency)},
                "time_to_first_token_ms": {"successful": _distribution(_ms(run.ttft))},
                "inter_token_latency_ms": {"successful": _distribution(itl_means)},
                "prompt_token_count": {"successful": _distribution(run.input_tokens)},
                "output_token_count": {"successful": _distribution(run.output_tokens)},
            },
            "requests": {"successful": succ, "errored": errored, "incomplete": []},
        })
    model = next((r.model for r in runs if r.model), None)
    data = {
        "metadata": {"version": 2, "guidellm_version": "0.8.1", "python_version": platform.python_version(),
                     "platform": platform.platform()},
        "config": {"model": model, "backend": "openai_http", "data": "batchsim"},
        "benchmarks": benches,
    }
    return _write(path, data)


def _chunk(cid: str, model: str | None, choices: list, usage: dict | None) -> dict[str, str]:
    body = {"id": cid, "object": "chat.completion.chunk", "created": 1700000000, "model": model or "",
            "choices": choices, "usage": usage}
    return {"response": f"data: {json.dumps(body)}\n\n"}


def write_genai_perf(path: PathLike, runs: Sequence[BenchRun]) -> Path:
    """``runs`` as genai-perf 0.0.16's profile_export.json, one experiment each; returns the path.

    Times become integer ns (a gap round-trips within 1e-9 s). Each request
    streams one chunk per gap plus the first, then a usage-only chunk and
    ``data: [DONE]`` at its end (genai-perf, and so the reader, end a request's latency at its last
    chunk with text). ``run.failed`` requests have no responses.
    A "trace" run has no perf_analyzer mode and raises ValueError.
    """
    exps = []
    for b, run in enumerate(runs):
        if run.mode == "concurrency":
            if run.concurrency is None:
                raise ValueError("a concurrency-mode BenchRun needs its concurrency")
            experiment = {"mode": "concurrency", "value": int(run.concurrency)}
        elif run.mode == "rate":
            if run.rate is None:
                raise ValueError("a rate-mode BenchRun needs its rate")
            experiment = {"mode": "request_rate", "value": float(run.rate)}
        else:
            raise ValueError(f"BenchRun {run.label!r} is a trace (mode 'trace'); genai-perf files hold only "
                             "concurrency or request_rate experiments")
        base = _EPOCH_BASE_NS + b * 1_000_000_000_000
        starts = base + np.rint(run.start * 1e9).astype(np.int64)
        requests = []
        for i, g in enumerate(_request_gaps(run)):
            ts = int(starts[i])
            inp, out = int(run.input_tokens[i]), int(run.output_tokens[i])
            tok = ts + np.rint((float(run.ttft[i]) + np.concatenate([[0.0], np.cumsum(g)])) * 1e9).astype(np.int64)
            end = max(ts + int(np.rint(float(run.latency[i]) * 1e9)), int(tok[-1]))
            cid = f"chatcmpl-{b}-{i}"
            token = _chunk(cid, run.model, [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}], None)
            outputs = [dict(token) for _ in tok]
            outputs.append(_chunk(cid, run.model, [], {"prompt_tokens": inp, "completion_tokens": out,
                                                       "total_tokens": inp + out}))
            outputs.append({"response": "data: [DONE]\n\n"})
            requests.append({"timestamp": ts, "request_inputs": {"payload": _payload(run, out)},
                             "response_timestamps": tok.tolist() + [end, end], "response_outputs": outputs})
        for _ in range(run.failed):
            requests.append({"timestamp": base, "request_inputs": {"payload": _payload(run, 1)},
                             "response_timestamps": [], "response_outputs": []})
        last = max((r["response_timestamps"][-1] for r in requests if r["response_timestamps"]), default=base)
        exps.append({"experiment": experiment, "requests": requests, "window_boundaries": [base, int(last)]})
    return _write(path, {"service_kind": "openai", "endpoint": "v1/chat/completions", "experiments": exps})


def _payload(run: BenchRun, max_tokens: int) -> str:
    return json.dumps({"model": run.model or "", "messages": [{"role": "user", "content": ""}],
                       "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}})


# ----------------------------------------------------------------------------- batchsim's own records

_REQUEST_COLUMNS = ("rid", "status", "arrival", "prompt_tokens", "output_tokens", "ttft", "e2el")


def run_from_records(requests_df: pd.DataFrame, itl_df: pd.DataFrame, *, label: str, mode: str,
                     rate: float | None = None, concurrency: int | None = None, model: str | None = None,
                     source: str = "batchsim") -> BenchRun:
    """A :class:`BenchRun` of batchsim's request records (``status == "completed"`` rows) and ITL records.

    ``requests_df`` has batchsim's request columns (``rid, status, arrival,
    prompt_tokens, output_tokens, first_token, completion, ttft, e2el``);
    ``itl_df`` has ``rid, gap``, one request's gaps in time order but
    interleaved across requests. Other rows (rejected, unfinished) count as
    ``failed``; gaps of rids that did not complete are dropped.
    """
    import pandas as pd

    if mode not in MODES:
        raise ValueError(f"mode is {mode!r}; expected one of {', '.join(MODES)}")
    missing = [c for c in _REQUEST_COLUMNS if c not in requests_df.columns]
    missing += [f"itl {c}" for c in ("rid", "gap") if c not in itl_df.columns]
    if missing:
        raise ValueError(f"records lack columns {', '.join(missing)}")
    done = requests_df[requests_df["status"] == "completed"]
    failed = len(requests_df) - len(done)
    arrival = done["arrival"].to_numpy(dtype=np.float64)
    rid = done["rid"].to_numpy()
    if not pd.Index(rid).is_unique:
        raise ValueError("requests_df has repeated rids among completed requests")
    pos = pd.Index(rid).get_indexer(itl_df["rid"].to_numpy())
    keep = pos >= 0
    pos = pos[keep]
    gaps = itl_df["gap"].to_numpy(dtype=np.float64)[keep][np.argsort(pos, kind="stable")]
    lens = np.bincount(pos, minlength=len(rid)).astype(np.int64)

    def col(name: str, what: str, ints: bool = False) -> np.ndarray:
        values = done[name].tolist()
        f = _integers if ints else _numbers
        return f(values, f"{source}: requests.{name}", what, item="row")

    ttft = col("ttft", "a time to first token in seconds (>= 0)")
    lat = col("e2el", "an end-to-end latency in seconds (>= 0)")
    _numbers(gaps.tolist(), f"{source}: itl.gap", "an inter-token gap in seconds (>= 0)", item="gap")
    _numbers(arrival.tolist(), f"{source}: requests.arrival", "an arrival time in seconds", nonneg=False, item="row")
    return _make_run(source, "batchsim", label, model, mode, None if rate is None else float(rate),
                     None if concurrency is None else int(concurrency), arrival,
                     col("prompt_tokens", "a prompt length (an integer >= 0)", True),
                     col("output_tokens", "an output length (an integer >= 0)", True), ttft, lat, gaps, lens, failed,
                     f"{source}: requests.e2el")
