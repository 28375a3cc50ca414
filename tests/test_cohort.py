"""The decode cohort (sim.cohort): running decodes kept as columns give the same
records, byte for byte, as one Seq at a time.

Like fast-forward, the cohort is an optimisation with no semantic freedom:
the reference is the same engine with the policies' ``decode_cohort`` off.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import policies
from policies.chunked_prefill import ChunkedPrefillPolicy
from policies.continuous import ContinuousPolicy
from sim.cohort import Cohort
from sim.engine import Replica
from sim.kv import PagedKVCache
from sim.state import Seq
from tests.engine_helpers import run_engine, workload
from tests.test_fast_forward import _TINY_COST, POLICIES, _outputs, _scenario
from tests.test_properties import workloads


@pytest.fixture
def cohort_off(monkeypatch):
    def off():
        monkeypatch.setattr(ContinuousPolicy, "decode_cohort", False)
        monkeypatch.setattr(ChunkedPrefillPolicy, "decode_cohort", False)
    return off


@pytest.fixture
def cohort_steps(monkeypatch):
    """Counts steps applied through the cohort's columns."""
    seen = [0]
    real = Replica._advance_cohort

    def counted(self, *a):
        seen[0] += 1
        return real(self, *a)
    monkeypatch.setattr(Replica, "_advance_cohort", counted)
    return seen


CASES = [
    ("continuous", {}), ("continuous_mixed", {}), ("chunked_prefill", {}),
    ("continuous", {"fast_forward": False}), ("chunked_prefill", {"fast_forward": False}),
    ("continuous", {"replicas": 3, "router": "least_kv"}),
    ("chunked_prefill", {"replicas": 2, "router": "least_outstanding"}),
    ("continuous", {"horizon_s": 14.0}), ("chunked_prefill", {"horizon_s": 9.0}),
]


@pytest.mark.parametrize("policy,extra", CASES, ids=[f"{p}-{'-'.join(e) or 'r1'}" for p, e in CASES])
def test_cohort_on_and_off_write_identical_outputs(policy, extra, tmp_path, cohort_off, cohort_steps):
    raw = _scenario(POLICIES[policy], **{k: v for k, v in extra.items() if k != "fast_forward"})
    ff = extra.get("fast_forward", True)
    on, r_on = _outputs(raw, ff, tmp_path, "on")
    used = cohort_steps[0]
    cohort_off()
    off, r_off = _outputs(raw, ff, tmp_path, "off")
    assert cohort_steps[0] == used  # off really is off
    rounds = r_on.engine["steps"] - r_on.engine["fast_forward_steps"]  # (a run ends in one _advance)
    assert used > 0.3 * rounds, (used, r_on.engine)  # and on was exercised
    assert set(on) == set(off)
    for name in off:
        assert on[name] == off[name], name
    if not extra:
        assert r_on.summary["preemptions"] > 0  # KV pressure was real (preempted members)


CONTINUOUS_SPECS = st.one_of(
    st.builds(lambda n, t, m: {"name": "continuous", "max_num_seqs": n, "max_num_batched_tokens": max(t, n),
                               "prefill_mode": m},
              st.integers(1, 12), st.integers(8, 600), st.sampled_from(["separate", "mixed"])),
    st.builds(lambda n, t: {"name": "chunked_prefill", "max_num_seqs": n, "max_num_batched_tokens": max(t, n)},
              st.integers(1, 12), st.integers(4, 300)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=CONTINUOUS_SPECS, wl=workloads(), blocks=st.integers(8, 120), bs=st.sampled_from([4, 8, 16]),
       horizon=st.sampled_from([None, None, 0.7, 3.0]), replicas=st.sampled_from([1, 1, 2]),
       router=st.sampled_from(["round_robin", "least_kv", "least_outstanding"]), ff=st.booleans())
def test_cohort_is_exact_on_random_workloads(spec, wl, blocks, bs, horizon, replicas, router, ff):
    outs = []
    for on in (True, False):
        ContinuousPolicy.decode_cohort = ChunkedPrefillPolicy.decode_cohort = on
        try:
            req, steps, itl, _ = run_engine(
                lambda: policies.create_policy(spec), wl, cost=_TINY_COST, kv_blocks=blocks, block_size=bs,
                horizon=horizon, replicas=replicas, router=router, fast_forward=ff)
        finally:
            ContinuousPolicy.decode_cohort = ChunkedPrefillPolicy.decode_cohort = True
        outs.append(_per_replica_order(req, steps, itl))
    assert outs[0] == outs[1]


def _per_replica_order(req, steps, itl):
    """Records in each replica's own engine order (what the per-replica aggregate sinks
    reduce, gap by gap). Across replicas the order differs by design: a run through
    completions appends its steps when it ends, where step by step each completion
    ended a run; outputs are put in one canonical order (sim.runner)."""
    replica_of = dict(zip(req["rid"], req["replica"]))
    steps = steps.iloc[np.argsort(steps["replica"].to_numpy(), kind="stable")]
    itl = itl.iloc[np.argsort(itl["rid"].map(replica_of).to_numpy(), kind="stable")]
    return req.to_csv(), steps.to_csv(index=False), itl.to_csv(index=False)


class AdmitFirst(ContinuousPolicy):
    """Opts in, but admits before it decodes: its decode plans name members one by one
    whenever it admits, which dissolves the cohort (then decodes rejoin)."""

    def schedule(self, view):
        from policies.step import StepBuilder

        cfg = self.config
        step = StepBuilder(view, cfg.max_num_batched_tokens, cfg.max_num_seqs)
        step.admit(list(view.waiting), chunked=False)
        step.schedule_decodes()
        return step.plan(steady=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wl=workloads(), blocks=st.integers(8, 120), bs=st.sampled_from([4, 8, 16]), ff=st.booleans(),
       seqs=st.integers(2, 10))
def test_a_cohort_dissolved_by_a_plan_rejoins_exactly(wl, blocks, bs, ff, seqs):
    outs = []
    cleared = [0]
    real = Cohort.clear

    def counted(self):
        cleared[0] += 1
        return real(self)
    Cohort.clear = counted
    try:
        for on in (True, False):
            AdmitFirst.decode_cohort = on
            req, steps, itl, _ = run_engine(
                lambda: AdmitFirst(AdmitFirst.Config(name="continuous", max_num_seqs=seqs, prefill_mode="mixed")),
                wl, cost=_TINY_COST, kv_blocks=blocks, block_size=bs, fast_forward=ff)
            # (one replica: records in engine order, so a row order within a step counts too)
            outs.append((req.to_csv(), steps.to_csv(), itl.to_csv()))
    finally:
        Cohort.clear = real
        AdmitFirst.decode_cohort = True
    assert outs[0] == outs[1]


def test_the_dissolving_policy_does_dissolve():
    wl = workload(np.arange(12) * 0.05, [40 + 7 * i for i in range(12)], [30 - i for i in range(12)])
    real, cleared = Cohort.clear, [0]

    def counted(self):
        cleared[0] += 1
        return real(self)
    Cohort.clear = counted
    try:
        run_engine(lambda: AdmitFirst(AdmitFirst.Config(name="continuous", max_num_seqs=6, prefill_mode="mixed")),
                   wl, cost=_TINY_COST, kv_blocks=200, block_size=8)
    finally:
        Cohort.clear = real
    assert cleared[0] > 0


# -- the columns themselves --------------------------------------------------------------------------

def _decoder(kv: PagedKVCache, rid: int, order: int, computed: int, generated: int = 1, out: int = 50) -> Seq:
    s = Seq(rid, 0.0, computed + 1 - generated, out)
    s.num_computed, s.num_tokens, s.num_generated = computed, computed + 1, generated
    s.last_token, s.max_itl, s.order = 0.5 + rid, 0.01 * rid, order
    kv.grow(rid, computed)
    return s


def test_members_keep_admission_order_and_sync_back():
    kv = PagedKVCache(1000, 4)
    co = Cohort(kv)
    a, b, c = _decoder(kv, 10, 0, 7), _decoder(kv, 11, 1, 8), _decoder(kv, 12, 2, 9)
    co.join([c])
    co.join([a, b])  # admitted earlier, finished their prompts later
    assert co.rids == [10, 11, 12] and co.rid.tolist() == [10, 11, 12]
    assert all(s.in_cohort for s in (a, b, c))
    # growth for one more token: the member at 8 tokens (a multiple of 4) needs a block
    assert co.growth(1) == kv.growth_needed([a, b, c], 1) == 1
    assert co.growth(3) == kv.growth_needed([a, b, c], 3)
    used = kv.used_blocks
    co.grant_step()
    assert kv.used_blocks == used + 1
    co.advance(1)
    assert co.stale and a.num_computed == 7  # the Seq lags until synced
    co.sync()
    assert (a.num_computed, a.num_tokens, a.num_generated) == (8, 9, 2)
    assert [kv.blocks_held(s) for s in (a, b, c)] == [2, 3, 3]
    assert kv.used_blocks == sum(kv.blocks_held(s) for s in (a, b, c))


def test_joining_out_of_order_into_an_empty_cohort_sorts_by_admission():
    # after a dissolve, a plan lists decodes before an older row finishing its chunked prompt
    kv = PagedKVCache(1000, 4)
    co = Cohort(kv)
    co.join([_decoder(kv, 7, 5, 9), _decoder(kv, 3, 2, 6), _decoder(kv, 4, 3, 6)])
    assert co.rids == [3, 4, 7] and co.ints[1].tolist() == [2, 3, 5]
    assert [s.rid for s in co.seqs] == [3, 4, 7]


def test_remove_returns_members_synced_and_updates_phases():
    kv = PagedKVCache(1000, 4)
    co = Cohort(kv)
    seqs = [_decoder(kv, r, r, 4 + r, out=3 + r) for r in range(6)]
    co.join(seqs)
    assert co.min_end == 2  # rid 0 has 2 tokens left
    co.grant_step()
    co.advance(1)
    out = co.remove(np.isin(co.rid, [0, 3]))
    assert [s.rid for s in out] == [0, 3] and not out[0].in_cohort
    assert out[0].num_computed == 5 and out[0].num_generated == 2
    assert co.rids == [1, 2, 4, 5] and co.min_end == 3
    rest = [s for s in seqs if s.in_cohort]
    co.sync()
    assert co.growth(1) == kv.growth_needed(rest, 1)


def test_a_sequence_holding_extra_kv_stays_outside():
    kv = PagedKVCache(1000, 4)
    co = Cohort(kv)
    s = _decoder(kv, 1, 0, 5)
    kv.grow(1, 40)  # a reservation beyond its tokens
    assert co.join([s]) == [s]
    assert len(co) == 0 and not s.in_cohort


def test_a_policy_reading_running_sees_current_counters():
    """A policy that reads ``view.running`` gets synced sequences mid-run."""
    seen = []

    class Peeking(ContinuousPolicy):
        def schedule(self, view):
            plan = super().schedule(view)
            for s in view.running:
                seen.append((s.num_computed, s.num_tokens, s.num_generated))
                assert s.num_tokens - s.num_computed >= 1
            return plan

    wl = workload([0.0, 0.0, 0.01], [30, 50, 20], [40, 12, 25])
    run_engine(lambda: Peeking(Peeking.Config(name="continuous")), wl, cost=_TINY_COST, kv_blocks=64,
               block_size=8)
    assert max(g for _, _, g in seen) >= 39  # counters advanced while in the cohort


@pytest.mark.parametrize("model,hw,tp", [("llama-3.1-8b", "h100-sxm", 1), ("llama-3-70b", "h200", 4),
                                         ("mixtral-8x7b", "a100-80gb", 2), ("tiny-llama", "l4", 1)])
def test_step_sums_price_like_the_rows(model, hw, tp):
    """StepShape.sums (what the engine knows of a cohort step) prices bit for bit like the rows."""
    from calibrate.costmodel import RooflineCostModel
    from calibrate.hardware import load_hardware
    from calibrate.models import load_model
    from sim.types import StepShape

    cm = RooflineCostModel(load_model(model), load_hardware(hw), tp=tp)
    rng = np.random.default_rng(11)
    for rows in (1, 3, 40, 257):
        for _ in range(25):
            dec = rng.integers(0, rows + 1)
            q = np.ones(rows, dtype=np.int64)
            q[dec:] = rng.integers(1, 600, rows - dec)  # prefill chunks (some of one token)
            kv = rng.integers(0, 5000, rows).astype(np.int64)
            kv[:dec] = np.maximum(kv[:dec], 1)
            d = (q == 1) & (kv > 0)
            sums = (int(q.sum()), int(d.sum()), int(kv[d].sum() + d.sum()), int(q @ kv), int(q @ q),
                    int(kv.sum()))
            plain = StepShape(q=q, kv=kv, sampled=int(rng.integers(0, rows + 1)))
            known = StepShape(q=q, kv=kv, sampled=plain.sampled, sums=sums)
            assert cm.price(known) == cm.price(plain), (rows, dec)


# -- preemption from the columns (StepBuilder._cohort_preempt) ---------------------------------------

class _FakeView:
    def __init__(self, kv, running, cohort=None, others=None):
        self.kv, self.running, self.cohort, self.others = kv, running, cohort, others
        self.waiting, self.now, self.max_model_len = [], 0.0, 1 << 20


def _preempting_state(rng: np.random.Generator):
    """A cohort of decodes and other running sequences (prefills), interleaved in admission
    order, in a cache too small for the next step's growth."""
    bs = int(rng.choice([2, 4, 8, 16]))
    n_mem, n_oth = int(rng.integers(1, 40)), int(rng.integers(0, 6))
    kind = rng.permutation([True] * n_mem + [False] * n_oth)
    kv = PagedKVCache(1 << 20, bs)
    members, others = [], []
    for order, is_member in enumerate(kind.tolist()):
        rid = 1000 + 3 * order
        if is_member:  # computed lengths that often sit on a block boundary
            computed = int(rng.integers(1, 6)) * bs if rng.random() < 0.6 else int(rng.integers(1, 6 * bs))
            members.append(_decoder(kv, rid, order, computed))
        else:  # a prompt part-computed (or not started): not a decode
            s = Seq(rid, 0.0, int(rng.integers(bs, 8 * bs)), 20)
            s.num_computed, s.order = int(rng.integers(0, s.prompt_tokens)), order
            kv.grow(rid, s.num_computed + int(rng.integers(0, 2 * bs)))
            others.append(s)
    need = kv.growth_needed(members, 1)
    kv.total_blocks = kv.used_blocks + int(rng.integers(0, max(need, 1)))  # short of the growth
    return kv, members, others


def test_preemption_from_the_columns_plans_as_one_by_one():
    """The cohort's preemption loop gives vLLM's one-by-one plan: the same rows, victims,
    and budget, KV and slots left, on random states (many victims, others as victims,
    and the member that is its own victim)."""
    from policies.step import StepBuilder

    class OneByOne(StepBuilder):  # notes when a sequence is its own victim
        def _try(self, seq, q):
            self.trying = seq.rid
            return super()._try(seq, q)

        def _preempt(self, seq):
            self.own_victim = getattr(self, "own_victim", False) or seq.rid == self.trying
            super()._preempt(seq)

    rng = np.random.default_rng(11)
    seen = {"fast": 0, "several": 0, "other": 0, "self": 0}
    short = 0
    for _ in range(600):
        kv, members, others = _preempting_state(rng)
        short += kv.growth_needed(members, 1) > kv.free_blocks
        co = Cohort(kv)
        co.join(members)
        running = sorted(members + others, key=lambda s: s.order)
        fast = StepBuilder(_FakeView(kv, running, co, others), 1 << 16, 512)
        fast.schedule_decodes()
        slow = OneByOne(_FakeView(kv, running), 1 << 16, 512)
        slow.schedule_decodes()
        a, b = fast.plan(), slow.plan()
        assert list(a.num_tokens.items()) == list(b.num_tokens.items())
        assert a.preempt == b.preempt
        assert (fast.free, fast.budget, fast.slots) == (slow.free, slow.budget, slow.slots)
        assert a.decode_cohort == bool(a.num_tokens)
        seen["fast"] += fast._victims is not None
        seen["several"] += len(a.preempt) > 1
        seen["other"] += any(r in {s.rid for s in others} for r in a.preempt)
        seen["self"] += getattr(slow, "own_victim", False)
    assert seen["fast"] == short > 500 and min(seen.values()) > 20, seen


# -- runs through completions (Replica._cohort_run) ----------------------------------------------

def test_runs_through_completions_are_exact(monkeypatch):
    """Bursts of requests then quiet: a cohort decodes with nothing waiting, its members
    finish one after another inside fast-forwarded runs, and KV is tight enough that
    some steps only fit thanks to the blocks an earlier finisher freed. Records must
    equal step-by-step ones byte for byte; the test checks those cases did occur."""
    seen = {"runs": 0, "inside": 0, "frees_used": 0, "peak_used": 0}
    real_run, real_apply = Replica._cohort_run, Replica._apply_cohort_run

    def counted_apply(self, run):
        seen["runs"] += 1
        inside = run.done < run.k - 1
        seen["inside"] += int(inside.sum())
        # a finisher's blocks served a later step: used fell, then rose past where it was
        used = run.used[0]  # (blocks used after each step, relative to the run's start)
        fell = np.flatnonzero(np.diff(used) < 0)
        seen["frees_used"] += bool(len(fell)) and int(used[fell[0] + 1:].max()) > int(used[fell[0]])
        seen["peak_used"] += self.kv.peak_used == self.kv.total_blocks
        return real_apply(self, run)

    monkeypatch.setattr(Replica, "_apply_cohort_run", counted_apply)
    real_outstanding = Replica.outstanding.fget
    seen["routed_mid_run"] = 0

    def outstanding(self):  # a router read it while finishers of a run were counted done
        fin = self._fin_ends
        seen["routed_mid_run"] += fin is not None and fin[0] <= self.env.now
        return real_outstanding(self)

    monkeypatch.setattr(Replica, "outstanding", property(outstanding))
    rng = np.random.default_rng(4)
    for case in range(200):
        n = int(rng.integers(3, 20))
        if case % 3:  # bursts, or arrivals spread thin (other replicas' arrive mid-run)
            arrivals = np.sort(rng.choice([0.0, 5.0, 10.0], n) + rng.uniform(0, 0.05, n))
        else:
            arrivals = np.sort(rng.uniform(0, 8, n))
        wl = workload(arrivals, rng.integers(1, 40, n), rng.integers(1, 60, n))
        bs = int(rng.choice([2, 4, 8]))
        blocks = int(rng.integers(1 + 100 // bs, 400 // bs))
        spec = ({"name": "continuous", "max_num_seqs": 16, "max_num_batched_tokens": 64}
                if case % 2 else {"name": "chunked_prefill", "max_num_seqs": 16, "max_num_batched_tokens": 32})
        # several replicas: routers that read outstanding counts (which a run's finishers
        # leave at their own steps' ends) or KV, or neither
        replicas, router = [(1, "round_robin"), (2, "least_outstanding"), (3, "least_outstanding"),
                            (2, "least_kv"), (2, "round_robin")][case % 5]
        outs = []
        for ff in (True, False):
            req, steps, itl, cluster = run_engine(lambda: policies.create_policy(spec), wl, cost=_TINY_COST,
                                                  kv_blocks=blocks, block_size=bs, fast_forward=ff,
                                                  replicas=replicas, router=router)
            outs.append((_per_replica_order(req, steps, itl),
                         [(r.kv.used_blocks, r.kv.peak_used, r.busy_s) for r in cluster.replicas]))
        assert outs[0] == outs[1], (case, spec, blocks, bs, replicas, router)
    assert (seen["runs"] > 100 and seen["inside"] > 100 and seen["frees_used"] > 5
            and seen["routed_mid_run"] > 20), seen


def test_runs_of_prefill_chunks_are_exact(monkeypatch):
    """Chunked prefill with long prompts and a small budget: each prompt's chunks ride with
    the cohort's decodes in runs (Replica._chunk_run), on 1-3 replicas, cut by arrivals,
    completions, KV and horizons. Records must equal step-by-step ones byte for byte."""
    seen = {"runs": 0, "steps": 0, "cut": 0}
    real = Replica._apply_chunk_run

    def counted(self, run, plan):
        seen["runs"] += 1
        seen["steps"] += run.k
        seen["cut"] += run.k < len(run.chunk[1])  # an arrival routed here cut it (_truncate)
        return real(self, run, plan)

    monkeypatch.setattr(Replica, "_apply_chunk_run", counted)
    rng = np.random.default_rng(6)
    for case in range(150):
        n = int(rng.integers(3, 16))
        arrivals = np.sort(rng.uniform(0, 6, n))
        wl = workload(arrivals, rng.integers(1, 200, n), rng.integers(1, 40, n))
        bs = int(rng.choice([2, 4, 8]))
        blocks = int(rng.integers(300 // bs, 1200 // bs))
        seqs = int(rng.integers(2, 10))
        spec = {"name": "chunked_prefill", "max_num_seqs": seqs, "max_num_batched_tokens": seqs + int(rng.integers(1, 40))}
        replicas, router = [(1, "round_robin"), (2, "least_outstanding"), (3, "least_outstanding"),
                            (2, "least_kv"), (1, "round_robin")][case % 5]
        horizon = [None, None, 2.5][case % 3]
        outs = []
        for ff in (True, False):
            req, steps, itl, cluster = run_engine(lambda: policies.create_policy(spec), wl, cost=_TINY_COST,
                                                  kv_blocks=blocks, block_size=bs, fast_forward=ff,
                                                  replicas=replicas, router=router, horizon=horizon)
            outs.append((_per_replica_order(req, steps, itl),
                         [(r.kv.used_blocks, r.kv.peak_used, r.busy_s) for r in cluster.replicas]))
        assert outs[0] == outs[1], (case, spec, blocks, bs, replicas, router, horizon)
    assert seen["runs"] > 100 and seen["steps"] > 3 * seen["runs"] and seen["cut"] > 5, seen
