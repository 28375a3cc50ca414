"""Inter-token gaps without a record per gap (batchsim.sim.itl).

The engines keep each replica's token-step times and each request's runs of
consecutive token steps. These tests check that representation against a
gap-by-gap reference taken independently, as the engine computes each gap
(``now - last token``), by watching every step: the same gaps per request,
and ITL percentiles equal to np.percentile over every gap, exactly, on
scenarios with preemption, separate prefill steps, several replicas, a
horizon and a frontend; and the weighted percentiles equal np.percentile
over the repeated values.
"""

from __future__ import annotations

import numpy as np
import pytest

from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import build_parts, simulate
from batchsim.reports.derive import measured_completed
from batchsim.sim import itl as itl_mod
from batchsim.sim.engine import Replica
from batchsim.sim.itl import ItlRecords, weighted_percentile, weighted_summary
from batchsim.sim.metrics import PERCENTILES
from tests.engine_helpers import POLICIES, _scenario


class _Watched(Replica):
    """A replica that notes every gap as the engine makes it: before a step is applied, each
    row's last token; after it, those whose generated count rose."""

    gaps: list

    def _advance(self, plan, sampled):
        before = {rid: (self.seqs[rid].last_token, self.seqs[rid].num_generated) for rid in plan.num_tokens}
        seqs = {rid: self.seqs[rid] for rid in plan.num_tokens}
        super()._advance(plan, sampled)
        for rid, (last, gen) in before.items():
            s = seqs[rid]
            if s.num_generated == gen + 1 and last is not None:
                type(self).gaps.append((rid, s.last_token - last))


CASES = {
    "continuous": dict(policy=POLICIES["continuous"]),  # (separate prefill steps, preemption)
    "chunked": dict(policy=POLICIES["chunked_prefill"]),
    "static": dict(policy=POLICIES["static"]),
    "dynamic-r3": dict(policy=POLICIES["dynamic"], replicas=3, router="least_outstanding"),
    "continuous-horizon-window": dict(policy=POLICIES["continuous_mixed"], horizon_s=15.0,
                                      measure={"warmup_s": 2.0, "cooldown_s": 3.0}),
    "frontend-horizon": dict(policy=POLICIES["chunked_prefill"], horizon_s=12.0,
                             overheads={"frontend": {"per_step_us": 3000.0, "per_output_token_us": 40.0,
                                                     "per_request_us": 2000.0}}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def watched(request):
    raw = _scenario(CASES[request.param]["policy"], **{k: v for k, v in CASES[request.param].items() if k != "policy"})
    raw["engine"] = "python"
    sc = scenario_from_dict(raw)
    _Watched.gaps = []
    result = simulate(sc, build_parts(sc), replica=_Watched)
    return request.param, sc, result, list(_Watched.gaps)


def test_each_request_has_the_gaps_the_engine_made(watched):
    name, sc, result, gaps = watched
    assert gaps, name
    got = {rid: grp["gap"].tolist() for rid, grp in result.itl.frame().groupby("rid")}
    ref: dict[int, list[float]] = {}
    for rid, g in gaps:
        ref.setdefault(rid, []).append(g)
    if sc.horizon_s is not None and "frontend" in name:
        horizon = sc.horizon_s  # (tokens delivered after it are not the clients')
        first = result.requests.set_index("rid")["first_token"]
        for rid in list(ref):
            t0 = first.get(rid, np.nan)
            if not np.isfinite(t0):  # (first token after the horizon: none of its gaps count)
                ref[rid] = []
                continue
            ref[rid] = [g for g, at in zip(ref[rid], t0 + np.cumsum(ref[rid])) if not at > horizon]
    ref = {rid: g for rid, g in ref.items() if g}
    assert got == ref, name
    assert len(result.itl) == sum(len(g) for g in ref.values())


def test_itl_percentiles_equal_np_percentile_over_every_gap(watched):
    name, sc, result, _ = watched
    done = measured_completed(result.requests, sc.measure.warmup_s, sc.measure.cooldown_s)
    frame = result.itl.frame()
    every = frame[frame["rid"].isin(done["rid"])]["gap"].to_numpy() * 1000.0
    assert len(every) > 100, name
    s = result.summary
    for p in PERCENTILES:
        key = "median_itl_ms" if p == 50 else f"p{p}_itl_ms"
        assert s[key] == float(np.percentile(every, p)), (name, key)
    assert s["mean_itl_ms"] == pytest.approx(every.mean(), rel=1e-12)
    assert s["std_itl_ms"] == pytest.approx(every.std(), rel=1e-9)
    # the per-request maximum the engine kept is the records' maximum
    top = frame.groupby("rid")["gap"].max()
    req = result.requests.set_index("rid")
    assert np.array_equal(req.loc[top.index, "max_itl"].to_numpy(), top.to_numpy()), name


def test_records_grow_with_steps_and_requests_not_tokens(watched):
    name, sc, result, _ = watched
    steps = sum(len(t) for t in result.itl.times)
    assert steps <= result.summary["num_steps"]
    # a run per request, and one more per request a token step skips: a preempted one when it
    # resumes, and (continuous's separate prefill steps) each running one when a preempted
    # request's recompute emits a token without them
    preempted = int(result.requests["preemptions"].sum())
    assert len(result.itl.rid) <= len(result.requests) + 48 * preempted, name
    assert len(result.itl) > 5 * len(result.itl.rid), name  # (many gaps per run)


@pytest.mark.parametrize("few", [itl_mod._FEW, 0], ids=["sorted", "histogram"])
@pytest.mark.parametrize("seed", range(5))
def test_weighted_percentiles_equal_np_percentile_over_repeated_values(seed, few, monkeypatch):
    monkeypatch.setattr(itl_mod, "_FEW", few)  # (both ways of finding the ranks)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5000))
    v = rng.lognormal(-4, 1.5, n)
    v[: n // 4] = v[0]  # ties
    if seed == 0:
        v[:] = 0.0
    c = rng.integers(1, 5, n)
    rep = np.repeat(v, c)
    ps = [0, 0.1, 1, 25, 50, 90, 99, 99.9, 100]
    assert weighted_percentile(v, c, ps) == [float(np.percentile(rep, p)) for p in ps]
    # in pieces, in any split
    cut = sorted(rng.integers(0, n, 3).tolist())
    pieces = [(v[a:b], c[a:b]) for a, b in zip([0, *cut], [*cut, n])]
    got = weighted_summary(lambda: iter(pieces), ps)
    assert got[0] == len(rep) and got[3] == [float(np.percentile(rep, p)) for p in ps]
    assert got[1] == pytest.approx(rep.mean(), rel=1e-12, abs=1e-300)


def test_weighted_percentiles_of_many_values_select_by_bucket(monkeypatch):
    monkeypatch.setattr(itl_mod, "_PIECE", 1000)
    rng = np.random.default_rng(7)
    t = np.cumsum(rng.lognormal(-4, 0.3, 200_000))
    # three requests: one run over most steps, one with a break, one short
    rec = ItlRecords([t], [0, 1, 1, 2], [0, 0, 0, 0], [0, 10, 5000, 150_000], [180_000, 4000, 199_999, 150_010],
                     [np.nan, np.nan, 0.5, np.nan])
    every = rec.frame()["gap"].to_numpy()
    v, c = rec.weighted()
    assert c.sum() == len(every) == len(rec)
    ps = [50, 90, 99, 99.9]
    assert weighted_percentile(v, c, ps) == [float(np.percentile(every, p)) for p in ps]
    assert weighted_summary(rec.pieces, ps)[3] == [float(np.percentile(every, p)) for p in ps]


def test_clip_drops_tokens_after_the_horizon():
    t = np.array([1.0, 2.0, 3.5, 5.0, 7.0])
    rec = ItlRecords([t], [0, 1], [0, 0], [0, 3], [4, 4], [np.nan, 1.25])
    clipped, lost = rec.clip(4.0)
    assert lost.tolist() == [0, 1]
    assert clipped.frame().groupby("rid")["gap"].apply(list).to_dict() == {0: [1.0, 1.5]}
    assert rec.clip(10.0)[0] is rec


_SUMS = """
import numpy as np
from batchsim.sim.itl import weighted_summary
rng = np.random.default_rng(3)
v, c = rng.lognormal(-4, 1.0, 300_000), rng.integers(1, 9, 300_000)
print(repr(weighted_summary(lambda: [(v, c)], [50, 99])))
"""


def test_weighted_sums_do_not_depend_on_the_blas_thread_count():
    # (np.dot of floats splits a long sum across BLAS threads: the mean's last bits followed the cores)
    import os
    import subprocess
    import sys

    outs = set()
    for threads in ("1", "2", "4"):
        env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
        outs.add(subprocess.run([sys.executable, "-c", _SUMS], env=env, capture_output=True, text=True,
                                check=True).stdout)
    assert len(outs) == 1, outs


def test_pieces_made_on_a_thread_give_the_same_summary(monkeypatch):
    """Past _AHEAD values in a piece the rest are made on a thread (itl._ahead): the same pieces,
    in the same order, so the same bits; an error making one comes out where they are read,
    and a reader that stops early leaves no thread behind."""
    import _thread
    import threading

    from batchsim.sim import itl
    from tests.engine_helpers import threads_back_to

    before = _thread._count()
    rng = np.random.default_rng(3)
    pieces = [(rng.gamma(2.0, 0.01, n), rng.integers(1, 5, n)) for n in (50, 3000, 7, 2000, 900, 4000)]
    monkeypatch.setattr(itl, "_FEW", 16)  # (the histogram path: two passes)
    alone = itl.weighted_summary(lambda: iter(pieces), [50, 90, 99])
    monkeypatch.setattr(itl, "_AHEAD", 1000)
    made = []

    def spy():
        for p in pieces:
            made.append(threading.get_ident())
            yield p

    assert itl.weighted_summary(spy, [50, 90, 99]) == alone
    assert set(made) != {threading.get_ident()}  # (the thread did make some)

    def broken():
        yield pieces[1]
        yield pieces[2]
        raise RuntimeError("a piece could not be made")

    with pytest.raises(RuntimeError, match="could not be made"):
        list(itl._ahead(broken()))
    gen = itl._ahead(iter(pieces))
    next(gen), next(gen)
    gen.close()
    assert threads_back_to(before)  # (close() returns once the thread is done)
    made.clear()
    monkeypatch.setattr(itl, "_AHEAD", 10 ** 9)
    assert itl.weighted_summary(spy, [50, 90, 99]) == alone and set(made) == {threading.get_ident()}


@pytest.mark.parametrize("seed", range(6))
def test_pieces_cover_each_gap_as_often_as_runs_do_across_chunks_and_pieces(seed, monkeypatch):
    """The pieces count each step gap once per run covering it (stretches between runs' ends), and
    read the gaps across the chunks the times were kept in: checked against a count made gap by
    gap, with pieces and chunks shorter than the runs, idle stretches no run covers, and runs
    that begin and end at the same places."""
    from batchsim.sim.itl import Times

    monkeypatch.setattr(itl_mod, "_PIECE", [3, 16, 97][seed % 3])
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.random(400))
    chunks = np.split(t, np.sort(rng.integers(1, 399, size=8)))
    times = Times(chunks)
    for lo, hi in ((1, 400), (1, 2), (57, 58), (57, 301), (399, 400)):
        assert np.array_equal(times.gaps(lo, hi), t[lo:hi] - t[lo - 1:hi - 1])
    starts = rng.integers(0, 399, size=30)
    starts[:3] = 120  # (three runs from one place, two of them to one end)
    ends = np.minimum(starts + rng.integers(0, 60, size=30), 399)
    ends[1] = ends[2]
    rec = ItlRecords([times], np.arange(30), np.zeros(30, dtype=np.int64), starts, ends, np.full(30, np.nan))
    cover = np.zeros(400, dtype=np.int64)  # (gap k: t[k] - t[k - 1])
    for s, e in zip(starts, ends):
        cover[s + 1:e + 1] += 1
    got = list(rec.pieces())
    assert all((c > 0).all() and c.dtype == np.int64 for _, c in got)
    v = np.concatenate([v for v, _ in got])
    c = np.concatenate([c for _, c in got])
    keep = np.flatnonzero(cover)
    assert np.array_equal(v, t[keep] - t[keep - 1]) and np.array_equal(c, cover[keep])


ITL_KEYS = ("mean_itl_ms", "std_itl_ms", "median_itl_ms", "p90_itl_ms", "p99_itl_ms")


@pytest.mark.parametrize("policy", ["static", "dynamic", "continuous", "continuous_mixed", "chunked_prefill"])
def test_first_pass_made_as_the_core_runs_gives_the_same_summary(policy, monkeypatch):
    """One replica on the compiled core: the ITL summary's first pass is made as the blocks are
    read (itl.ItlAhead: from the runs the core closed and its frontier), here over pieces of 16
    token steps so that nearly every piece is made so, on runs with preemption (continuous) and
    padding (static, dynamic). The summary's ITL figures are the same bits as a first pass made
    after the run over the same records, and as the SimPy engine's (which makes none ahead)."""
    from batchsim import core
    from batchsim.sim.metrics import measured_gaps, ms_piece, weighted_stats

    if core.library() is None:
        pytest.skip(f"no compiled core here: {core.library_error()}")
    monkeypatch.setattr(itl_mod, "_PIECE", 16)
    got = {}
    for engine in ("core", "python"):
        sc = scenario_from_dict(dict(_scenario(POLICIES[policy]), engine=engine))
        got[engine] = simulate(sc, build_parts(sc))
    result = got["core"]
    ahead = result.itl.ahead
    assert ahead is not None and not ahead.failed and ahead.pieces > 100
    assert len(result.itl.times[0]) - ahead.next_lo < 16  # (every piece but the last made ahead)
    if policy == "continuous":
        assert result.summary["preemptions"] > 0  # (runs of preempted requests held the frontier back)
    gaps = measured_gaps(result.itl, measured_completed(result.requests))
    first, rest = gaps.first_pass(ms_piece)
    assert first is ahead.first
    made_ahead = weighted_stats("itl", gaps.pieces, first, rest)
    made_after = weighted_stats("itl", gaps.pieces)
    assert made_ahead == made_after and {k: result.summary[k] for k in ITL_KEYS} == made_after
    assert weighted_stats("itl", gaps.pieces, first, rest) == made_after  # (the pass made ahead is not used up)
    assert got["python"].itl.ahead is None
    assert {k: got["python"].summary[k] for k in ITL_KEYS} == made_after


def test_first_pass_made_ahead_is_used_only_for_the_runs_it_summed(monkeypatch):
    """The pass made ahead sums every run the core made: a selection that drops a request's runs
    (ItlRecords.select), another unit than the one it was made in, or a failed piece leave the
    summary to a first pass after the run; a run with a warm-up (or several replicas, or a
    horizon) makes none (batchsim.app.runner._summed_ahead)."""
    from batchsim import core
    from batchsim.sim.metrics import ms_piece

    if core.library() is None:
        pytest.skip(f"no compiled core here: {core.library_error()}")
    monkeypatch.setattr(itl_mod, "_PIECE", 16)
    sc = scenario_from_dict(dict(_scenario(POLICIES["static"]), engine="core"))
    itl = simulate(sc, build_parts(sc)).itl
    assert itl.ahead is not None
    every = np.ones(int(itl.rid.max()) + 1, dtype=bool)
    assert itl.select(every).ahead is itl.ahead and itl.select(every).first_pass(ms_piece)[0] is itl.ahead.first
    every[itl.rid[0]] = False
    assert itl.select(every).ahead is None and itl.select(every).first_pass(ms_piece) == (None, None)
    assert itl.first_pass(lambda v, c: (v, c)) == (None, None)
    itl.ahead.failed = True
    assert itl.first_pass(ms_piece) == (None, None)
    for kw in ({"measure": {"warmup_s": 1.0}}, {"replicas": 2}, {"horizon_s": 30.0}):
        sc = scenario_from_dict(dict(_scenario(POLICIES["static"]), engine="core", **kw))
        assert simulate(sc, build_parts(sc)).itl.ahead is None, kw


def test_a_failed_piece_made_ahead_leaves_the_error_to_the_summary(monkeypatch):
    """A piece the first pass refuses (a negative gap) stops the pass made ahead; the summary's
    own first pass then raises, as without one."""
    monkeypatch.setattr(itl_mod, "_PIECE", 2)
    times = np.array([0.0, 1.0, 0.5, 2.0, 3.0])
    ahead = itl_mod.ItlAhead(lambda v, c: (v, c))
    ahead.feed(times, np.array([0]), np.array([4]), frontier=5)
    assert ahead.failed and ahead.pieces == 0
    rec = ItlRecords([times], [0], [0], [0], [4], [np.nan])
    rec.ahead = ahead
    assert rec.first_pass(ahead.transform) == (None, None)
    with pytest.raises(ValueError, match="values >= 0"):
        weighted_summary(rec.pieces, [50])


def _bits(a):
    return np.asarray(a, dtype=np.float64).view(np.int64)


@pytest.mark.parametrize("case", ["clock-hours", "clock-minutes", "clock-days", "idle-gaps", "anything"])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_packed_times_give_back_the_same_bits_in_fewer_bytes(case, monkeypatch):
    """Token-step times are kept packed (itl.Packed: bit-pattern steps in 4 or 5 B): unpacked, sliced,
    differenced and counted they are the floats that went in, bit for bit, whatever they are
    (unordered, NaN, -0.0, inf: the far steps, or the floats kept as they are), and typical clocks
    take 4 to 6 of the floats' 8 B a time. Chunks are split (``_SPLIT``) and read across their edges."""
    monkeypatch.setattr(itl_mod, "_SPLIT", 1000)
    rng = np.random.default_rng(len(case))
    step = rng.exponential(0.02, 5000)
    t = {"clock-hours": 3600 * 9 + np.cumsum(step), "clock-minutes": 120 + np.cumsum(step),
         "clock-days": 86400 * 40 + np.cumsum(step),
         "idle-gaps": np.cumsum(np.where(rng.random(5000) < 0.01, 50.0, step)),
         "anything": np.concatenate([rng.normal(0, 1e6, 4990), [np.nan, -0.0, 0.0, np.inf, -np.inf, 5e-324,
                                                                 -5e-324, 1e308, -1e308, np.nan]])}[case]
    times = itl_mod.Times(np.split(t, [7, 2500, 2501]))
    assert np.array_equal(_bits(times[0:len(t)]), _bits(t)) and len(times) == len(t)
    assert np.array_equal(_bits(times[999:2002]), _bits(t[999:2002]))
    for lo, hi in ((1, len(t)), (1000, 1001), (999, 3001), (2501, 2502)):
        assert np.array_equal(_bits(times.gaps(lo, hi)), _bits(t[lo:hi] - t[lo - 1:hi - 1]))
    if case != "anything":
        for x in (-1.0, t[0], t[999], t[1000], t[2500], t[-1], t[-1] + 1, np.nextafter(t[1500], 0)):
            assert times.count_at_most(x) == int(np.searchsorted(t, x, "right"))
        # (bytes a time: a clock of days spaces its floats ~10^-11 s apart, so a 20 ms step is ~10^9
        # patterns (4 B); of hours, ~10^10 (5 B); of minutes, ~10^12 (6 B); idle gaps kept whole)
        width = {"clock-days": 4, "clock-hours": 5, "clock-minutes": 6, "idle-gaps": 6}[case]
        far = 16 * int((np.diff(t) > 1.0).sum())
        assert times.nbytes <= width * len(t) + far, (case, times.nbytes)
    else:  # (no width packs them smaller: kept as floats; a chunk of one time keeps only its head)
        assert times.nbytes <= t.nbytes


def test_a_core_run_keeps_its_token_steps_packed():
    """The compiled core's token-step times are kept packed as blocks arrive (not packed at the end
    from floats: the floats of a million-request static run are 1.8 GiB), and they are the times the
    SimPy engine's records hold, bit for bit."""
    sc = _scenario(POLICIES["static"])
    got = {e: simulate(scenario_from_dict(dict(sc, engine=e)), build_parts(scenario_from_dict(sc)))
           for e in ("core", "python")}
    core_t, py_t = got["core"].itl.times[0], got["python"].itl.times[0]
    assert all(isinstance(c, itl_mod.Packed) for c in core_t._chunks) and len(core_t) > 100
    assert np.array_equal(_bits(core_t[0:len(core_t)]), _bits(py_t[0:len(py_t)]))
    assert core_t.nbytes <= 6 * len(core_t) + 200 * len(core_t._chunks)  # (a short run: a clock of minutes)


def test_times_made_of_small_blocks_are_packed_together_and_cut_by_whole_chunks(monkeypatch):
    """Many replicas hand over small blocks (a few dozen times each): they are kept as floats and
    packed together, not one pack each (a pack's fixed cost is more than a few dozen floats'); a
    head keeps the whole chunks as they are and packs only the cut one; frame() reads each run's
    gaps in time order but lists them by request."""
    monkeypatch.setattr(itl_mod, "_SPLIT", 1000)
    t = 3600.0 + np.cumsum(np.random.default_rng(3).exponential(0.02, 5000))
    blocks = np.split(t, np.arange(37, 5000, 37))
    times = itl_mod.Times([*blocks[:60], itl_mod.Packed(np.concatenate(blocks[60:70])), *blocks[70:]])
    assert len(times._chunks) <= 8 and np.array_equal(times[0:5000], t)
    assert times.nbytes < 6 * len(t)
    for n in (0, 1, 999, 1000, 2219, 2220, 4999):
        h = times.head(n)
        assert np.array_equal(h[0:n], t[:n]) and len(h) == n
    whole = times._chunks[:2]
    assert all(a is b for a, b in zip(times.head(2300)._chunks, whole))
    # runs of two requests far apart in time, interleaved by rid
    starts = np.array([4000, 10, 4100, 20]), np.array([4050, 60, 4150, 70])
    rec = ItlRecords([times], np.array([0, 1, 2, 3]), np.zeros(4, dtype=np.int64), *starts, np.full(4, np.nan))
    f = rec.frame()
    want = np.concatenate([np.diff(t[s:e + 1]) for s, e in zip(*starts)])
    assert np.array_equal(f["gap"].to_numpy(), want) and f["rid"].tolist() == sorted(f["rid"].tolist())


@pytest.mark.skipif(not hasattr(__import__("signal"), "setitimer"), reason="needs POSIX interval timers")
def test_an_interrupt_while_pieces_are_read_ahead_stops_cleanly():
    """Ctrl-C (here an alarm's exception, twice, every 2 ms) lands while the reader waits for a
    piece made on the thread, while it starts the thread or while it stops it: the interrupt comes
    out, not a lock error, nothing is read once the reader has stopped, and no thread is left
    (a thread launched just before the interrupt exits at once)."""
    import _thread
    import time

    from batchsim.sim import itl
    from tests.engine_helpers import AlarmInterrupts, Interrupt, threads_back_to

    big = (np.zeros(itl._AHEAD), np.ones(itl._AHEAD, np.int64))
    reads = [0]

    def slow():
        yield big
        for _ in range(1000):  # (3 s at most: an interrupt Python swallowed must not hang the test)
            time.sleep(0.003)
            reads[0] += 1
            yield big[0][:10], big[1][:10]

    before = _thread._count()  # (threads running: the reader's among them while one runs)

    interrupted = 0
    with AlarmInterrupts() as alarms:
        for _ in range(10):
            alarms.arm(2)
            gen = itl._ahead(slow())
            try:
                for _ in gen:
                    pass
            except Interrupt:
                interrupted += 1
            finally:
                gen.close()  # (as weighted_summary's closing() does; the second interrupt may land in it)
                alarms.disarm()
            read = reads[0]
            assert threads_back_to(before) and reads[0] == read
    assert interrupted >= 8  # (an alarm Python swallows, in a finalizer the run set off, is rare)
