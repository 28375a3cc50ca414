/* batchsim's compiled core: the step-by-step engine for the built-in
 * iteration-level policies, in C.
 *
 * What it is: batchsim.sim.engine's semantics with fast-forward and the decode cohort
 * OFF (one event per step, every row handled one by one), the policies of
 * batchsim/policies/continuous.py and batchsim/policies/chunked_prefill.py (StepBuilder, FCFS,
 * vLLM's preemption by recompute), the paged KV counter of batchsim/sim/kv.py, the
 * routers round_robin / least_outstanding / least_kv, and the fast path of
 * RooflineCostModel.price. Events are ordered exactly as SimPy orders them
 * (time, priority, insertion id), including the two hops from an arrival's
 * wake-up to an idle replica's resumption (Event.succeed -> AnyOf -> process).
 *
 * Exactness: every floating-point value is computed with the same IEEE
 * operations in the same order as the Python code (libm log/exp, as Python's
 * math module; built with -ffp-contract=off), so records are byte-identical
 * to the Python engine's; tests/test_core.py compares whole runs.
 *
 * What it leaves to Python (batchsim/core/__init__.py): the dense operators' totals per
 * (tokens, sampled) (asked for once per new key: status CORE_NEED_DENSE),
 * the record sinks (step and gap buffers handed over when full:
 * CORE_FLUSH), and everything before and after the run.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CORE_DONE 0
#define CORE_FLUSH 1
#define CORE_NEED_DENSE 2
#define CORE_ERR_ADMIN (-1)     /* no step after 100000 plans */
#define CORE_ERR_INTERNAL (-2)  /* an invariant broke (a bug: the Python engine would have raised) */
#define CORE_ERR_NOMEM (-3)
#define CORE_ERR_IDLE (-4)      /* a policy asked to idle until a time not after now */

/* A built-in policy's recipe (batchsim/policies/recipe.py), as batchsim/core/__init__.py's CoreRecipe hands it over. */
#define MV_DECODES 0
#define MV_PARTIAL_PREFILLS 1
#define MV_ADMIT 2
#define MV_ADMIT_CHUNKS 3
#define UNLESS_ROWS 1
#define UNLESS_PREEMPTED 2
#define UNLESS_STALLED 4
#define ORDER_FCFS 0
#define ORDER_SPF 1
#define VICTIM_LAST_ADMITTED 0
#define VICTIM_FEWEST_DECODED 1
#define ADM_STEP 0        /* IterationRecipe.admission */
#define ADM_SEQUENCE 1
#define ADM_COMPLETION 2
#define ADM_REMAINING 3
#define REMAINING_CLIP 4096  /* batchsim/policies/step.py REMAINING_CLIP */
#define MAX_MOVES 16
#define MAX_PREF 64
#define MAX_GRAPH 2048

typedef struct {
    int64_t padded;                  /* 0: IterationRecipe, 1: PaddedRecipe */
    int64_t n_moves;                 /* IterationRecipe.moves, in order */
    int64_t move_kind[MAX_MOVES];    /* MV_* */
    int64_t move_unless[MAX_MOVES];  /* UNLESS_* bits */
    int64_t order, victim;           /* ORDER_*, VICTIM_* */
    int64_t max_num_seqs;            /* IterationRecipe.max_num_seqs, or PaddedRecipe.max_batch_size */
    int64_t max_num_batched_tokens;  /* 0 for padded recipes */
    int64_t n_pref;                  /* PaddedRecipe.preferred_batch_sizes */
    int64_t pref[MAX_PREF];
    double max_queue_delay_s;
    int64_t batch_end;               /* complete_at == batch_end */
    int64_t admission;               /* ADM_* */
    double watermark;                /* IterationRecipe.watermark: fraction of blocks an admission leaves free */
    int64_t schedule_ahead;          /* IterationRecipe.schedule_ahead: its plans are made ahead */
    int64_t n_gdec, n_gstep;         /* IterationRecipe.cuda_graphs: decode_sizes, step_sizes (0, 0: none) */
    int64_t gdec[MAX_GRAPH], gstep[MAX_GRAPH];
    double g_max_pad;                /* step_max_padding */
    int64_t g_max_ctx;               /* decode_max_context */
} core_recipe_t;

/* The cost model's pricing table (batchsim/calibrate/pricing.py), as batchsim/core/__init__.py's CoreCost hands it over. */
typedef struct {  /* CurveTable: log_x, log_y (n each), slope (n - 1) */
    int64_t n;
    double lo, hi, ylo, yhi;
    const double *lx, *y, *slope;
} core_curve_t;

typedef struct {  /* OperatorTable */
    core_curve_t comp, mem;
    int64_t has_range;
    double range[4];
    double peak;
    int64_t kernels;
} core_op_t;

#define N_DENSE_OPS 10  /* embedding norms qkv_proj rotary kv_cache_write o_proj mlp_up mlp_act mlp_down lm_head */

typedef struct {  /* PricingTable (+ DenseTable when dense_in_c) */
    int64_t layers, heads, head_dim, tp;
    double kv_elt, qo, peak, bw, attn_launch, host_step, host_seq, host_decode_step;
    core_op_t prefill, decode;
    int64_t dense_in_c;
    int64_t hidden, q_heads, kv_heads, qkv_width, rot_width, vocab, mlp_width, up_width;
    double b_w, b_kv, launch, link_lat, link_bw;
    core_op_t ops[N_DENSE_OPS];
} core_cost_t;

/* One run's settings, as batchsim/core/__init__.py's CoreParams hands them over. */
typedef struct {
    int64_t n_req, n_rep, block_size, max_model_len, max_queue_len, router, has_horizon, step_cap, gap_cap;
    double horizon;
    int64_t has_frontend;         /* the cost model's frontend terms (batchsim/sim/frontend.py) */
    double out_step, out_token;   /* delivered_at's per-step and per-token seconds */
} core_params_t;

#define R_ROUND_ROBIN 0
#define R_LEAST_OUTSTANDING 1
#define R_LEAST_KV 2
#define R_POWER_OF_TWO 3

#define EV_INIT_REPLICA 0
#define EV_INIT_ARRIVALS 1
#define EV_ARRIVAL 2
#define EV_STEP 3
#define EV_WAKE 4
#define EV_COND 5
#define EV_IDLE_TIMEOUT 6

#define URGENT 0
#define NORMAL 1

#define PH_SCHEDULE 0
#define PH_PRICE 1
#define PH_STEP 2
#define PH_IDLE 3

#define ST_UNFINISHED 0
#define ST_COMPLETED 1
#define ST_REJECTED 2

#define RS_NONE 0
#define RS_MAX_MODEL_LEN 1
#define RS_KV_CAPACITY 2
#define RS_QUEUE_FULL 3
#define RS_BUDGET 4
#define RS_WATERMARK 5

#define NSTEP_F 9  /* start end flops useful_flops bytes compute_s memory_s network_s overhead_s */
#define NSTEP_I 11 /* replica num_seqs num_rows prefill decode padding oor kv_used waiting running preempted */

#define MEMO_N 65536  /* compute-curve values remembered by token count */

typedef struct {
    int n;
    double lo, hi, ylo, yhi;
    const double *lx, *y, *slope;
    double *memo;  /* [MEMO_N], NaN where not yet evaluated (compute curves only) */
} curve_t;

typedef struct {
    double t;
    int prio;
    int64_t eid;
    int kind;
    int rep;
    int64_t gen;  /* EV_IDLE_TIMEOUT: the idle spell it belongs to */
} event_t;

/* One dense operator (batchsim/calibrate/work.py ShardShape.dense) as _roofline prices it. */
typedef struct {
    curve_t comp, mem;
    int has_rng;
    double rng[4];
    double peak;
    int64_t kernels;
} op_t;

#define N_OPS 10  /* embedding norms qkv_proj rotary kv_cache_write o_proj mlp_up mlp_act mlp_down lm_head */

typedef struct {  /* a step's shape reduced to what pricing reads (RooflineCostModel.price) */
    int64_t n, T, n_dec, ctx_dec, qkv, qq, kv_read, sampled;
    int64_t D;  /* the dense operators' tokens (StepShape.dense_tokens, else T) */
} sums_t;

typedef struct {
    int64_t key;  /* -1: empty */
    double v[7];
} dense_t;

typedef struct {  /* a decode attention's priced time (price_sums) by its shape */
    int64_t key;  /* n_dec << 40 | ctx_dec; -1: empty */
    double t;     /* the larger of its compute and memory times */
    int32_t mem;  /* 1: t is the memory time (added to memory_s), 0: the compute time */
    int32_t oor;  /* 1: out of the measured range */
} attn_t;

/* NOTE: the decode attention's time depends on its shape (decode rows, their summed context)
 * alone, and costs a log, an exp and two divisions to price. A padded batch bills every row the
 * same context, so the shapes of one batch recur in every batch of the same size and prompt
 * length: they are remembered (2^17 entries, 3 MiB), at the slot ctx_dec + n_dec * ATTN_SPREAD,
 * so that a batch's successive steps (ctx_dec grows by n_dec a step) fall in neighbouring slots.
 * A slot holds the last shape priced there; any other shape is priced anew. Padded recipes only:
 * an iteration policy's decode rows have contexts of their own, whose sums seldom recur (the
 * table's misses made 100k continuous requests' core ~5% slower). A 100k static run's core
 * thread: 0.67-0.74x CPU time. */
#define ATTN_N (1 << 17)
#define ATTN_SPREAD 40503

#define DENSE_RECENT 64  /* (a power of two) */

typedef struct {
    /* queue of waiting rids: a ring buffer */
    int64_t *wq;
    int64_t wcap, whead, wlen;
    int64_t hidden;  /* Replica.inbox: the queue's last `hidden` arrived while a step planned ahead ran */
    int ahead;       /* Replica._ahead: a step planned ahead is running */
    int64_t *dfr;    /* Replica._deferred: finished in such a step, KV freed after the next plan */
    int64_t ndfr;
    /* running rids in admission order */
    int64_t *run;
    int64_t nrun;
    /* KV */
    int64_t total_blocks, used, peak;
    int64_t keep;  /* blocks an admission leaves free: int(watermark x total_blocks) */
    int64_t outstanding, admissions, admin_only;
    int phase, wake_triggered, cond_triggered;
    int64_t idle_gen;
    int has_idle_until;
    double idle_until;
    /* the plan in hand */
    int64_t *rows_rid, *rows_q;
    int64_t *scratch;  /* schedule_decodes: the running decodes before any preemption */
    int64_t nrows;
    int64_t *pre;  /* preempted rids, admission order */
    int64_t npre;
    int64_t *rej;  /* rejected rids (waiting order) */
    int64_t nrej;
    int64_t *cand, *keys;  /* shortest_prompt_first: the queue in admission order, sort keys */
    /* padded batches (batchsim/policies/padded.py) */
    int64_t *rel;  /* released rids */
    int64_t nrel;
    int complete_on_release, hold_finished;
    int rows_running;  /* the plan's rows are all running and it releases, rejects and preempts none */
    int64_t reserve;  /* KV tokens reserved per launched member (0: none) */
    double out_free;  /* when the frontend has streamed every earlier step's tokens */
    int64_t billed;   /* decode rows' billed context (-1: none) */
    int64_t nbilled;  /* rows whose billed context differs from their own */
    int64_t *pad_q, *pad_kv, *pad_s;
    int64_t npad;
    /* the step in hand: billed shape (padding rows and billed contexts included) and useful rows */
    sums_t bill, use;
    int64_t rec_decode;  /* useful rows with q == 1 over a billed context > 0 */
    double start, c_useful;
    double c_seconds, c_flops, c_bytes, c_comp, c_mem, c_net, c_over;
    int64_t c_oor;
    /* record buffers (owned by Python) */
    double *sf;   /* [step_cap][NSTEP_F]: a step's record in one place (one stream to write, not 20) */
    int64_t *si;  /* [step_cap][NSTEP_I] */
    int64_t nsteps;
    double *g_t;       /* [gap_cap] delivery times of token steps (batchsim/sim/itl.py) */
    int64_t *g_run;    /* [3][gap_cap] closed runs: rid, start, end */
    double *g_entry;   /* [gap_cap] closed runs: entry gap */
    int64_t nt, nclosed, kt;  /* token steps and closed runs in the buffers; token steps in all */
    int64_t *firsts;   /* the rows of this step that got their first token */
    int64_t wait_open; /* waiting requests with an open run (preempted ones): core_frontier */
} replica_t;

typedef struct {
    /* configuration */
    int64_t n_req, n_rep, max_seqs, cap, bs, max_model_len, max_queue_len, router;
    core_recipe_t rc;  /* the policy's recipe */
    int padded, sfp;   /* rc.padded, rc.order == ORDER_SPF */
    int has_horizon;
    double horizon;
    int has_frontend;
    double out_step, out_token;
    int64_t step_cap, gap_cap;
    int64_t max_rows;  /* most rows a step can have: min(max_num_seqs or max_batch_size, requests) */
    /* cost model */
    int64_t L, h, dh, tp;
    double L4, kv_elt, qo, peak, bw, l_launch, host0, host1, host0d;
    int pre_has_range, dec_has_range;
    double pre_range[4], dec_range[4];
    curve_t pre_c, pre_m, dec_c, dec_m;
    /* the dense operators, when the core prices them itself (else Python answers CORE_NEED_DENSE) */
    int dense_in_c;
    op_t ops[N_OPS];
    int64_t m_d, m_heads, m_kvh, m_qkvw, m_rot, m_vocab, m_f, m_up, t_count;
    double b_w, b_kv, launch, link_lat, link_bw;
    /* dense totals by (tokens, sampled) */
    dense_t *dense;
    int mem_seg[2];  /* the prefill and decode attention memory curves' last segments (curve_eval) */
    dense_t dense_recent[DENSE_RECENT];  /* copies of entries priced lately (key -1: none) */
    attn_t *attn;  /* [ATTN_N] decode attention times by shape (price_sums) */
    int64_t dense_cap, dense_n;
    /* workload */
    const double *arrival;
    const int64_t *prompt, *output;
    const int64_t *pairs;  /* power_of_two: the two replicas drawn for each arrival, drawn in Python */
    /* per request */
    int64_t *num_tokens, *num_computed, *num_generated, *num_preempt, *held, *order, *rep;
    int64_t *status, *reason, *reason_val, *admitted_int;
    int now_is_int;  /* SimPy's clock is still the integer 0 (no timeout has fired yet) */
    double *admitted, *first_token, *last_token, *completion, *max_itl;
    int64_t *run_rep, *run_start, *run_end;  /* each request's open run of tokens (batchsim/sim/itl.py) */
    double *run_entry;
    uint8_t *running, *finished;
    int64_t *mark_sched, *mark_pre;  /* plan epoch in which scheduled / preempted */
    int64_t epoch;
    /* events */
    event_t *heap;
    int64_t nheap, heapcap, eid;
    event_t front;  /* (has_front: the next event, before every one in the heap) */
    int has_front;
    int nomem;  /* an allocation failed (the run stops with CORE_ERR_NOMEM) */
    double now;
    int64_t next_rid;  /* arrivals delivered so far */
    int64_t rr;        /* round robin counter */
    int pending_rep;   /* replica whose loop waits for a dense entry (-1: none) */
    int64_t need_T, need_s;
    replica_t *reps;
    int64_t steps_total;
} core_t;

/* ---------------------------------------------------------------- curves --- */
static double curve_eval(const curve_t *c, double size, int *hint) {
    /* batchsim.calibrate.curves.Curve.__call__ (hint: where the segment was found last time, or NULL) */
    if (size <= c->lo) return c->ylo;
    if (size >= c->hi) return c->yhi;
    double lx = log(size);
    int i = hint ? *hint : -1;
    if (!(i >= 0 && i <= c->n - 2 && c->lx[i] <= lx && lx < c->lx[i + 1])) {
        /* bisect_right(lx, x) - 1 */
        int lo = 0, hi = c->n;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (lx < c->lx[mid]) hi = mid; else lo = mid + 1;
        }
        i = lo - 1;
        if (i < 0) i = 0;
        if (i > c->n - 2) i = c->n - 2;
        if (hint) *hint = i;
    }
    return exp(c->y[i] + (lx - c->lx[i]) * c->slope[i]);
}

/* A compute curve at a token count: evaluated once per count (the same double every time). */
static double curve_tokens(const curve_t *c, int64_t tokens) {
    if (tokens >= 0 && tokens < MEMO_N) {
        double v = c->memo[tokens];
        if (v == v) return v;
        v = curve_eval(c, (double)tokens, NULL);
        c->memo[tokens] = v;
        return v;
    }
    return curve_eval(c, (double)tokens, NULL);
}


/* ----------------------------------------------------------------- dense --- */
static uint64_t hash64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
    return x;
}

static dense_t *dense_find(core_t *s, int64_t key) {
    uint64_t mask = (uint64_t)s->dense_cap - 1, i = hash64((uint64_t)key) & mask;
    for (;;) {
        dense_t *d = &s->dense[i];
        if (d->key == key || d->key == -1) return d;
        i = (i + 1) & mask;
    }
}

/* Where dense_recent keeps a copy of the entry for (T, sampled). */
static dense_t *dense_slot(core_t *s, int64_t T, int64_t sampled) {
    return &s->dense_recent[(uint64_t)(T * 7 + sampled) & (DENSE_RECENT - 1)];
}

static int dense_grow(core_t *s) {
    int64_t old_cap = s->dense_cap;
    dense_t *old = s->dense, *grown = (dense_t *)malloc(sizeof(dense_t) * old_cap * 2);
    if (!grown) return -1;  /* (the table stays as it was, freed with the state) */
    s->dense = grown;
    s->dense_cap = old_cap * 2;
    for (int64_t i = 0; i < s->dense_cap; i++) s->dense[i].key = -1;
    for (int64_t i = 0; i < old_cap; i++)
        if (old[i].key != -1) *dense_find(s, old[i].key) = old[i];
    free(old);
    return 0;
}

static int64_t dense_key(int64_t T, int64_t sampled) { return T * 1048576 + sampled; }

/* ---------------------------------------------------------------- events --- */
static int heap_less(const event_t *a, const event_t *b) {
    if (a->t != b->t) return a->t < b->t;
    if (a->prio != b->prio) return a->prio < b->prio;
    return a->eid < b->eid;
}

static void heap_push(core_t *s, event_t e) {
    if (s->nheap == s->heapcap) {  /* (deadline timeouts of earlier idle spells wait in the heap too) */
        event_t *h = (event_t *)realloc(s->heap, sizeof(event_t) * s->heapcap * 2);
        if (!h) {
            s->nomem = 1;
            return;
        }
        s->heap = h;
        s->heapcap *= 2;
    }
    int64_t i = s->nheap++;
    s->heap[i] = e;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!heap_less(&s->heap[i], &s->heap[p])) break;
        event_t tmp = s->heap[p]; s->heap[p] = s->heap[i]; s->heap[i] = tmp;
        i = p;
    }
}

/* The events in order: the heap, and in front of it (has_front) an event before every event in
 * the heap. A step that ends before anything else is scheduled goes there and is the next one
 * popped, as from the heap (heap_less is a total order: eids are unique), without the heap's
 * push and pop on each step. */
static void schedule_gen(core_t *s, double t, int prio, int kind, int rep, int64_t gen) {
    /* simpy.Environment.schedule: heappush((now + delay, priority, eid, event)) */
    event_t e = {t, prio, s->eid++, kind, rep, gen};
    if (!s->has_front) {
        if (s->nheap == 0 || heap_less(&e, &s->heap[0])) {
            s->front = e;
            s->has_front = 1;
        } else {
            heap_push(s, e);
        }
    } else if (heap_less(&e, &s->front)) {
        heap_push(s, s->front);
        s->front = e;
    } else {
        heap_push(s, e);
    }
}

static void schedule(core_t *s, double t, int prio, int kind, int rep) {
    schedule_gen(s, t, prio, kind, rep, 0);
}

static int64_t n_events(const core_t *s) { return s->nheap + s->has_front; }

static const event_t *next_event(const core_t *s) { return s->has_front ? &s->front : &s->heap[0]; }

static event_t heap_pop(core_t *s) {
    if (s->has_front) {
        s->has_front = 0;
        return s->front;
    }
    event_t top = s->heap[0];
    s->heap[0] = s->heap[--s->nheap];
    int64_t i = 0, n = s->nheap;
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && heap_less(&s->heap[l], &s->heap[m])) m = l;
        if (r < n && heap_less(&s->heap[r], &s->heap[m])) m = r;
        if (m == i) break;
        event_t tmp = s->heap[m]; s->heap[m] = s->heap[i]; s->heap[i] = tmp;
        i = m;
    }
    return top;
}

/* ------------------------------------------------------------ the queue --- */
static int64_t wq_at(replica_t *r, int64_t i) { return r->wq[(r->whead + i) & (r->wcap - 1)]; }

/* the part of the queue the policy sees (Replica.waiting; the inbox is the rest) */
static int64_t wq_seen(replica_t *r) { return r->wlen - r->hidden; }

static void wq_push_back(replica_t *r, int64_t rid) {
    r->wq[(r->whead + r->wlen) & (r->wcap - 1)] = rid;
    r->wlen++;
}

static void wq_push_front(replica_t *r, int64_t rid) {
    r->whead = (r->whead - 1) & (r->wcap - 1);
    r->wq[r->whead] = rid;
    r->wlen++;
}

static void wq_remove_at(replica_t *r, int64_t i) {
    for (int64_t j = i; j + 1 < r->wlen; j++)
        r->wq[(r->whead + j) & (r->wcap - 1)] = r->wq[(r->whead + j + 1) & (r->wcap - 1)];
    r->wlen--;
}

/* ------------------------------------------------------------------- KV --- */
static int64_t blocks_for(int64_t tokens, int64_t bs) {
    /* -(-tokens // bs) for tokens >= 0 */
    return (tokens + bs - 1) / bs;
}

static void kv_free(core_t *s, replica_t *r, int64_t rid) {
    r->used -= s->held[rid];
    s->held[rid] = 0;
}

/* ------------------------------------------------------- the policies --- */
typedef struct {
    int64_t budget, free, slots;
} builder_t;

static int64_t need_blocks(core_t *s, int64_t rid, int64_t total) {
    int64_t need = blocks_for(total, s->bs) - s->held[rid];
    return need > 0 ? need : 0;
}

static int try_sched(core_t *s, replica_t *r, builder_t *b, int64_t rid, int64_t q, int64_t hold, int64_t keep) {
    int64_t total = s->num_computed[rid] + q;
    int64_t need = need_blocks(s, rid, hold > total ? hold : total);
    if (need + keep > b->free) return 0;
    b->free -= need;
    b->budget -= q;
    r->rows_rid[r->nrows] = rid;
    r->rows_q[r->nrows] = q;
    r->nrows++;
    s->mark_sched[rid] = s->epoch;
    return 1;
}

static int is_sched(core_t *s, int64_t rid) { return s->mark_sched[rid] == s->epoch; }
static int is_pre(core_t *s, int64_t rid) { return s->mark_pre[rid] == s->epoch; }

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* batchsim/policies/ordering.py shortest_prompt_first: preempted sequences first in queue order, then the
 * others by prompt length, ties by queue position (a stable sort); into r->cand. */
static void order_sfp(core_t *s, replica_t *r) {
    int64_t k = 0, m = 0;
    for (int64_t i = 0; i < wq_seen(r); i++) {
        int64_t rid = wq_at(r, i);
        if (s->num_preempt[rid] > 0) r->cand[k++] = rid;
        else r->keys[m++] = (s->prompt[rid] << 40) | i;  /* (prompts < 2^20, positions < 2^40) */
    }
    qsort(r->keys, (size_t)m, sizeof(int64_t), cmp_i64);
    for (int64_t j = 0; j < m; j++) r->cand[k++] = wq_at(r, r->keys[j] & (((int64_t)1 << 40) - 1));
}

static int64_t future_blocks(core_t *s, int64_t rid, int64_t q) {
    /* StepBuilder._future: admission 'remaining', the blocks rid still needs for its remaining output
     * (clipped) beyond this step's q tokens, once its prompt is in */
    int64_t now = s->num_computed[rid] + q;
    int in_prefill = !s->num_generated[rid] || s->num_tokens[rid] - s->num_computed[rid] > 1;
    if (in_prefill && now < s->num_tokens[rid]) return 0;  /* (a recompute's prompt too) */
    int64_t left = s->output[rid] - s->num_generated[rid];
    if (left > REMAINING_CLIP) left = REMAINING_CLIP;
    return need_blocks(s, rid, s->num_tokens[rid] + left) - need_blocks(s, rid, now);
}

static int64_t whole_tokens(core_t *s, int64_t rid) {
    /* StepBuilder._whole: the tokens the admission rule asks the KV to hold */
    if (s->rc.admission == ADM_COMPLETION) return s->prompt[rid] + s->output[rid];
    if (s->rc.admission == ADM_REMAINING) {
        int64_t left = s->output[rid] - s->num_generated[rid];
        return s->num_tokens[rid] + (left > REMAINING_CLIP ? REMAINING_CLIP : left);
    }
    return s->num_tokens[rid];
}

static void admit(core_t *s, replica_t *r, builder_t *b, int chunked) {
    /* StepBuilder.admit over the queue in the policy's order */
    int64_t adm = s->rc.admission, promised = 0;
    if (adm == ADM_REMAINING) {
        /* the running sequences not preempted: the plan's rows (all running here) and the unscheduled */
        for (int64_t j = 0; j < r->nrows; j++) promised += future_blocks(s, r->rows_rid[j], r->rows_q[j]);
        for (int64_t i = 0; i < r->nrun; i++) {
            int64_t rid = r->run[i];
            if (!is_pre(s, rid) && !is_sched(s, rid) && !s->finished[rid]) promised += future_blocks(s, rid, 0);
        }
    }
    if (s->sfp) order_sfp(s, r);
    for (int64_t i = 0; i < wq_seen(r); i++) {
        int64_t rid = s->sfp ? r->cand[i] : wq_at(r, i);
        int64_t pending = s->num_tokens[rid] - s->num_computed[rid];
        if (!chunked && pending > s->cap) {
            r->rej[r->nrej++] = rid;
            s->reason[rid] = RS_BUDGET;
            s->reason_val[rid] = pending;
            continue;
        }
        int64_t whole = whole_tokens(s, rid);  /* what the rule asks the KV to hold */
        int64_t keep = s->held[rid] ? 0 : r->keep;  /* (KV that arrived by transfer is not allocated here) */
        if (keep && need_blocks(s, rid, whole) > r->total_blocks - keep) {
            /* vLLM V0 can_allocate's NEVER: it could never leave the watermark free */
            r->rej[r->nrej++] = rid;
            s->reason[rid] = RS_WATERMARK;
            s->reason_val[rid] = whole;
            continue;
        }
        if (b->slots < 1 || b->budget < 1) return;
        int64_t q = chunked ? (pending < b->budget ? pending : b->budget) : pending;
        if (q > b->budget) return;
        /* the recipe's admission rule: this step's tokens, the whole known sequence, or prompt + max_tokens held;
         * each leaving the watermark's blocks free */
        if ((adm == ADM_SEQUENCE || adm == ADM_REMAINING) && need_blocks(s, rid, whole) + promised + keep > b->free)
            return;
        if (!try_sched(s, r, b, rid, q, adm == ADM_COMPLETION ? whole : 0, keep)) return;
        if (adm == ADM_REMAINING) promised += future_blocks(s, rid, q);
        b->slots -= 1;
    }
}

static int is_decode(core_t *s, int64_t rid) {
    return s->num_generated[rid] && s->num_tokens[rid] - s->num_computed[rid] == 1;
}

static int fewer_decoded(core_t *s, int64_t x, int64_t v) {
    /* ordering.fewest_decoded's key: (generated, -prompt) of x below v's */
    return s->num_generated[x] < s->num_generated[v] ||
           (s->num_generated[x] == s->num_generated[v] && s->prompt[x] > s->prompt[v]);
}

static void schedule_decodes(core_t *s, replica_t *r, builder_t *b) {
    /* StepBuilder.schedule_decodes without a cohort: _all_decodes_fit, else _decode_or_preempt */
    int64_t nd = 0, need = 0;
    for (int64_t i = 0; i < r->nrun; i++) {
        int64_t rid = r->run[i];
        if (is_decode(s, rid)) {
            nd++;
            need += need_blocks(s, rid, s->num_computed[rid] + 1);
        }
    }
    if (r->npre == 0 && b->budget >= nd && need <= b->free) {
        b->free -= need;
        b->budget -= nd;
        for (int64_t i = 0; i < r->nrun; i++) {
            int64_t rid = r->run[i];
            if (is_decode(s, rid)) {
                r->rows_rid[r->nrows] = rid;
                r->rows_q[r->nrows] = 1;
                r->nrows++;
                s->mark_sched[rid] = s->epoch;
            }
        }
        return;
    }
    /* the decodes as they were before any preemption (a preempted one is skipped) */
    int64_t *dec = r->scratch;
    int64_t k = 0;
    for (int64_t i = 0; i < r->nrun; i++)
        if (is_decode(s, r->run[i])) dec[k++] = r->run[i];
    if (s->rc.victim == VICTIM_FEWEST_DECODED) {
        /* RETRACT_FIRST (SGLang retract_decode): while the decodes cannot all grow and more than one is
         * left, preempt the victim among them all: the least (generated, -prompt), the newest on ties */
        int64_t need_k = need;  /* (every decode's growth, summed above: nothing is preempted yet) */
        while (k > 1 && need_k > b->free) {
            int64_t vi = k - 1;
            for (int64_t j = k - 2; j >= 0; j--)
                if (fewer_decoded(s, dec[j], dec[vi])) vi = j;
            int64_t v = dec[vi];
            need_k -= need_blocks(s, v, s->num_computed[v] + 1);
            r->pre[r->npre++] = v;
            s->mark_pre[v] = s->epoch;
            b->free += s->held[v];
            b->slots += 1;
            for (int64_t j = vi; j < k - 1; j++) dec[j] = dec[j + 1];
            k--;
        }
    }
    for (int64_t j = 0; j < k; j++) {
        int64_t rid = dec[j];
        if (is_pre(s, rid)) continue;
        if (b->budget < 1) break;
        while (!try_sched(s, r, b, rid, 1, 0, 0)) {
            /* the victim rule over _unscheduled(), the live ones neither preempted nor scheduled:
             * last_admitted the newest; fewest_decoded the least (generated, -prompt), the newest on ties */
            int64_t v = -1;
            for (int64_t i = r->nrun - 1; i >= 0; i--) {
                int64_t x = r->run[i];
                if (is_pre(s, x) || is_sched(s, x)) continue;
                if (v < 0) {
                    v = x;
                    if (s->rc.victim == VICTIM_LAST_ADMITTED) break;
                } else if (fewer_decoded(s, x, v)) {
                    v = x;
                }
            }
            if (v < 0) return;  /* (cannot happen: rid itself is unscheduled) */
            r->pre[r->npre++] = v;
            s->mark_pre[v] = s->epoch;
            b->free += s->held[v];
            b->slots += 1;
            if (v == rid) return;
        }
    }
}

static int schedule_partial_prefills(core_t *s, replica_t *r, builder_t *b) {
    for (int64_t i = 0; i < r->nrun; i++) {
        int64_t rid = r->run[i];
        int64_t pending = s->num_tokens[rid] - s->num_computed[rid];
        int in_prefill = s->num_generated[rid] == 0 || pending > 1;
        if (!in_prefill || is_pre(s, rid)) continue;
        if (b->budget < 1 || !try_sched(s, r, b, rid, pending < b->budget ? pending : b->budget, 0, 0)) return 0;
    }
    return 1;
}

/* batchsim/policies/padded.py launch_size: the PaddedRecipe's launch rule */
static int64_t launch_size(core_t *s, replica_t *r, int *has_until, double *until) {
    int64_t n = wq_seen(r), B = s->max_seqs;
    *has_until = 0;
    if (n == 0) return 0;
    if (n >= B) return B;
    int64_t best = 0;
    for (int64_t i = 0; i < s->rc.n_pref; i++)
        if (s->rc.pref[i] <= n && s->rc.pref[i] > best) best = s->rc.pref[i];
    if (best) return best;
    if (s->rc.max_queue_delay_s == 0.0) return n;
    double deadline = s->arrival[wq_at(r, 0)] + s->rc.max_queue_delay_s;
    if (s->now >= deadline) return n;
    *has_until = 1;
    *until = deadline;
    return 0;
}

static void padded_launch(core_t *s, replica_t *r, int64_t free) {
    /* PaddedBatchPolicy._launch: the longest FCFS prefix whose padded reservation fits (fit_prefix) */
    int has_until;
    double until = 0.0;
    int64_t n = launch_size(s, r, &has_until, &until);
    int64_t k = 0, longest = 0, target = 0;
    if (n > wq_seen(r)) n = wq_seen(r);
    {
        int64_t mp = 0, mo = 0;
        for (int64_t j = 1; j <= n; j++) {
            int64_t rid = wq_at(r, j - 1);
            if (s->prompt[rid] > mp) mp = s->prompt[rid];
            if (s->output[rid] > mo) mo = s->output[rid];
            int64_t t = mp + mo, need = 0;
            for (int64_t i = 0; i < j; i++) need += need_blocks(s, wq_at(r, i), t);
            if (need > free) break;
            k = j;
            longest = mp;
            target = t;
        }
    }
    if (!k) {
        r->has_idle_until = has_until;
        r->idle_until = until;
        return;
    }
    for (int64_t j = 0; j < k; j++) {
        int64_t rid = wq_at(r, j);
        r->rows_rid[r->nrows] = rid;
        r->rows_q[r->nrows] = s->num_tokens[rid] - s->num_computed[rid];
        r->nrows++;
        if (s->prompt[rid] < longest) {
            r->pad_q[r->npad] = longest - s->prompt[rid];
            r->pad_kv[r->npad] = s->prompt[rid];
            r->pad_s[r->npad] = 0;
            r->npad++;
        }
    }
    r->reserve = target;
    r->hold_finished = 1;
}

static void padded_plan(core_t *s, replica_t *r) {
    /* batchsim/policies/padded.py run_padded */
    int any_live = 0;
    for (int64_t i = 0; i < r->nrun; i++)
        if (!s->finished[r->run[i]]) { any_live = 1; break; }
    if (any_live) {  /* _decode: live rows one token over the padded context, dead slots as padding */
        int64_t longest = 0, g = 0;
        for (int64_t i = 0; i < r->nrun; i++) {
            int64_t rid = r->run[i];
            if (s->prompt[rid] > longest) longest = s->prompt[rid];
            if (s->num_generated[rid] > g) g = s->num_generated[rid];
        }
        int64_t ctx = longest + g - 1;
        for (int64_t i = 0; i < r->nrun; i++) {
            int64_t rid = r->run[i];
            if (s->finished[rid]) {
                r->pad_q[r->npad] = 1;
                r->pad_kv[r->npad] = ctx;
                r->pad_s[r->npad] = 1;
                r->npad++;
            } else {
                r->rows_rid[r->nrows] = rid;
                r->rows_q[r->nrows] = 1;
                r->nrows++;
                if (s->num_computed[rid] != ctx) r->nbilled++;
            }
        }
        r->billed = ctx;
        r->hold_finished = 1;
        r->rows_running = 1;
        return;
    }
    if (!r->nrun) {
        padded_launch(s, r, r->total_blocks - r->used);
        return;
    }
    int64_t freed = 0;
    for (int64_t i = 0; i < r->nrun; i++) {
        freed += s->held[r->run[i]];
        r->rel[r->nrel++] = r->run[i];
    }
    padded_launch(s, r, r->total_blocks - r->used + freed);
    r->complete_on_release = (int)s->rc.batch_end;
}

static void plan(core_t *s, replica_t *r) {
    /* batchsim/policies/rules.py interpret: run_padded, or run_iteration's moves in order under their guards */
    builder_t b;
    s->epoch++;
    r->nrows = r->npre = r->nrej = r->nrel = r->npad = r->nbilled = 0;
    r->complete_on_release = r->hold_finished = r->has_idle_until = r->rows_running = 0;
    r->reserve = 0;
    r->billed = -1;
    if (s->padded) {
        padded_plan(s, r);
        return;
    }
    b.budget = s->cap;
    b.free = r->total_blocks - r->used;
    b.slots = s->max_seqs - r->nrun;
    int stalled = 0;
    for (int64_t m = 0; m < s->rc.n_moves; m++) {
        int64_t unless = s->rc.move_unless[m];
        if (((unless & UNLESS_ROWS) && r->nrows) || ((unless & UNLESS_PREEMPTED) && r->npre)
            || ((unless & UNLESS_STALLED) && stalled))
            continue;
        switch (s->rc.move_kind[m]) {
        case MV_DECODES: schedule_decodes(s, r, &b); break;
        case MV_PARTIAL_PREFILLS: if (!schedule_partial_prefills(s, r, &b)) stalled = 1; break;
        case MV_ADMIT: admit(s, r, &b, 0); break;
        default: admit(s, r, &b, 1); break;
        }
    }
    /* victims in admission order (StepBuilder.plan): running is in admission order */
    if (r->npre > 1) {
        int64_t k = 0;
        for (int64_t i = 0; i < r->nrun; i++)
            if (is_pre(s, r->run[i])) r->pre[k++] = r->run[i];
    }
}

/* ---------------------------------------------------- applying a plan --- */
static void remove_running(replica_t *r, int64_t rid) {
    for (int64_t i = 0; i < r->nrun; i++) {
        if (r->run[i] == rid) {
            memmove(r->run + i, r->run + i + 1, sizeof(int64_t) * (r->nrun - i - 1));
            r->nrun--;
            return;
        }
    }
}

static int apply_admission(core_t *s, replica_t *r) {
    /* Replica._admit: release, reject, preempt, admit */
    if (r->rows_running) return 0;  /* (a padded batch's decode: nothing to release, reject or admit) */
    for (int64_t j = 0; j < r->nrel; j++) {
        int64_t rid = r->rel[j];
        if (!s->finished[rid]) return CORE_ERR_INTERNAL;
        remove_running(r, rid);
        s->running[rid] = 0;
        kv_free(s, r, rid);
        if (r->complete_on_release)  /* (the frontend may still be streaming its last token) */
            s->completion[rid] = s->last_token[rid] > s->now ? s->last_token[rid] : s->now;
        r->outstanding--;
    }
    for (int64_t j = 0; j < r->nrej; j++) {
        int64_t rid = r->rej[j];
        for (int64_t i = 0; i < r->wlen; i++)
            if (wq_at(r, i) == rid) { wq_remove_at(r, i); break; }
        s->status[rid] = ST_REJECTED;  /* (its reason set by the plan: RS_BUDGET or RS_WATERMARK) */
        r->outstanding--;
        if (s->run_rep[rid] >= 0) r->wait_open--;  /* (its run stays open, and is no longer waiting) */
    }
    for (int64_t j = 0; j < r->npre; j++) {
        int64_t rid = r->pre[j];
        if (!s->running[rid]) return CORE_ERR_INTERNAL;
        s->running[rid] = 0;
        remove_running(r, rid);
        kv_free(s, r, rid);
        s->num_computed[rid] = 0;
        s->num_preempt[rid]++;
        if (s->run_rep[rid] >= 0) r->wait_open++;
    }
    for (int64_t j = r->npre - 1; j >= 0; j--) wq_push_front(r, r->pre[j]);
    /* admitted: plan rows not running, in row order; FCFS makes them a prefix of the queue
     * (Replica._take_from_waiting), any other order takes them out keeping the rest in order */
    int64_t k = 0, prefix = 1;
    for (int64_t j = 0; j < r->nrows; j++) {
        int64_t rid = r->rows_rid[j];
        if (s->running[rid]) continue;
        if (k >= r->wlen || wq_at(r, k) != rid) prefix = 0;
        k++;
    }
    if (prefix) {
        for (int64_t j = 0; j < k; j++) {
            r->whead = (r->whead + 1) & (r->wcap - 1);
            r->wlen--;
        }
    } else {
        int64_t w = 0, n0 = r->wlen;
        for (int64_t i = 0; i < n0; i++) {
            int64_t rid = wq_at(r, i);
            if (is_sched(s, rid) && !s->running[rid]) continue;
            r->wq[(r->whead + w) & (r->wcap - 1)] = rid;
            w++;
        }
        if (n0 - w != k) return CORE_ERR_INTERNAL;
        r->wlen = w;
    }
    for (int64_t j = 0; j < r->nrows; j++) {
        int64_t rid = r->rows_rid[j];
        if (s->running[rid]) continue;
        s->running[rid] = 1;
        if (s->run_rep[rid] >= 0) r->wait_open--;
        s->order[rid] = r->admissions++;
        if (isnan(s->admitted[rid])) {
            s->admitted[rid] = s->now;
            s->admitted_int[rid] = s->now_is_int;
        }
        r->run[r->nrun++] = rid;
    }
    return 0;
}

static int64_t graph_tokens(const core_recipe_t *g, int64_t tokens, int decode_only, int64_t longest) {
    /* batchsim/policies/step.py graph_tokens: the smallest capture size >= tokens, or tokens (eager) */
    const int64_t *sizes = decode_only ? g->gdec : g->gstep;
    int64_t n = decode_only ? g->n_gdec : g->n_gstep;
    if (!n || tokens > sizes[n - 1]) return tokens;
    if (decode_only && g->g_max_ctx && longest > g->g_max_ctx) return tokens;
    int64_t lo = 0, hi = n - 1;  /* bisect_left */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (sizes[mid] < tokens) lo = mid + 1; else hi = mid;
    }
    int64_t padded = sizes[lo];
    if (!decode_only && g->g_max_pad != 0.0 && (double)padded > g->g_max_pad * (double)tokens) return tokens;
    return padded;
}

static int grow_and_shape(core_t *s, replica_t *r) {
    /* Replica._grow_and_shape: grow each row's KV (to its reservation), then the billed and useful
     * shapes' sums (scalars, not a struct through a pointer: the loop is the hot path) */
    int64_t bT = 0, bqkv = 0, bqq = 0, bkv = 0, bnd = 0, bcd = 0, bs_ = 0;  /* billed */
    int64_t uT = 0, uqkv = 0, uqq = 0, ukv = 0, und = 0, ucd = 0, us_ = 0;  /* useful */
    int64_t rec_decode = 0, billed = r->billed, reserve = r->reserve, longest = 0, not_decodes = 0;
    int completion = !s->padded && s->rc.admission == ADM_COMPLETION;
    for (int64_t j = 0; j < r->nrows; j++) {
        int64_t rid = r->rows_rid[j], q = r->rows_q[j];
        int64_t c = s->num_computed[rid], total = c + q;
        if (q < 1 || total > s->num_tokens[rid]) return CORE_ERR_INTERNAL;
        if (total > longest) longest = total;  /* (StepBuilder.longest, .not_decodes) */
        if (q != 1 || !is_decode(s, rid)) not_decodes++;
        if (reserve > total) total = reserve;
        /* admission 'completion': an admission's plan reserve (a running row already holds as much) */
        if (completion && s->prompt[rid] + s->output[rid] > total) total = s->prompt[rid] + s->output[rid];
        int64_t have = s->held[rid];
        if (total > have * s->bs) {  /* (blocks_for(total) > have, without a division per row) */
            int64_t want = blocks_for(total, s->bs), extra = want - have;
            if (extra > r->total_blocks - r->used) return CORE_ERR_INTERNAL;
            s->held[rid] = want;
            r->used += extra;
            if (r->used > r->peak) r->peak = r->used;
        }
        if (c + q == s->num_tokens[rid]) { bs_++; us_++; }
        int64_t kv = billed >= 0 ? billed : c;
        uT += q; uqkv += q * c; uqq += q * q; ukv += c;
        if (q == 1 && c != 0) { und++; ucd += c; }
        bT += q; bqkv += q * kv; bqq += q * q; bkv += kv;
        if (q == 1 && kv != 0) { bnd++; bcd += kv; }
        if (q == 1 && kv > 0) rec_decode++;
    }
    for (int64_t j = 0; j < r->npad; j++) {
        int64_t q = r->pad_q[j], kv = r->pad_kv[j];
        bT += q; bqkv += q * kv; bqq += q * q; bkv += kv;
        if (q == 1 && kv != 0) { bnd++; bcd += kv; }
        if (r->pad_s[j]) bs_++;
    }
    sums_t *b = &r->bill, *u = &r->use;
    b->n = r->nrows + r->npad; b->T = bT; b->n_dec = bnd; b->ctx_dec = bcd + bnd; b->qkv = bqkv; b->qq = bqq;
    b->kv_read = bkv; b->sampled = bs_;
    u->n = r->nrows; u->T = uT; u->n_dec = und; u->ctx_dec = ucd + und; u->qkv = uqkv; u->qq = uqq;
    u->kv_read = ukv; u->sampled = us_;
    b->D = bT; u->D = uT;
    if (!s->padded && (s->rc.n_gdec || s->rc.n_gstep) && r->nrows)  /* StepBuilder.plan's graph_tokens */
        b->D = graph_tokens(&s->rc, uT, !not_decodes, longest);
    r->rec_decode = rec_decode;
    return 0;
}


typedef struct {
    double seconds, flops, bytes, comp, mem, net, over;
    int64_t oor;
} cost_t;

/* RooflineCostModel._roofline + _fold of one Work item onto the totals. */
static void fold(const core_t *s, const op_t *o, double flops, double nbytes, double tokens, double *t) {
    double per = nbytes / (double)o->kernels;
    double tc = flops != 0.0 ? flops / (o->peak * curve_eval(&o->comp, tokens, NULL)) : 0.0;
    double tm = nbytes != 0.0 ? nbytes / (s->bw * curve_eval(&o->mem, per, NULL)) : 0.0;
    if (tc >= tm) t[0] += tc; else t[1] += tm;
    t[2] += (double)o->kernels * s->launch;
    t[3] += flops;
    t[4] += nbytes;
    if (o->has_rng && !(o->rng[0] <= tokens && tokens <= o->rng[1] && o->rng[2] <= per && per <= o->rng[3]))
        t[5] += 1.0;
}

/* RooflineCostModel._dense for a dense (non-MoE) model: ShardShape.dense's Work items with their
 * float operations in Python's order, then the LM head, then the all-reduces. */
static void dense_compute(const core_t *s, int64_t tokens, int64_t sampled, double *v) {
    const double B = 2.0;  /* B_ACT */
    double T = (double)tokens, L = (double)s->L, d = (double)s->m_d;
    double t[6] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0};  /* comp mem over flops bytes oor */
    const op_t *o = s->ops;
    int64_t Li = s->L;
    double w;
    /* embedding */
    fold(s, &o[0], 0.0, T * d * B * 2.0 + T * 4.0, T, t);
    /* norms: (2L+1) fused add+RMSNorm */
    fold(s, &o[1], (double)((2 * Li + 1) * 5) * T * d, (double)((2 * Li + 1) * 4) * T * d * B, T, t);
    /* qkv_proj: gemm(L, T, d, qkv) */
    w = (double)(s->m_d * s->m_qkvw) * s->b_w;
    fold(s, &o[2], L * 2.0 * T * d * (double)s->m_qkvw, L * (w + (T * d + T * (double)s->m_qkvw) * B), T, t);
    /* rotary */
    fold(s, &o[3], (double)(Li * 3) * T * (double)s->m_rot, (double)(Li * 2) * T * (double)s->m_rot * B, T, t);
    /* kv_cache_write */
    fold(s, &o[4], 0.0, L * T * 2.0 * (double)s->m_kvh * (double)s->dh * (B + s->b_kv), T, t);
    /* o_proj: gemm(L, T, heads * dh, d) */
    {
        double k = (double)(s->m_heads * s->dh);
        w = (double)(s->m_heads * s->dh * s->m_d) * s->b_w;
        fold(s, &o[5], L * 2.0 * T * k * d, L * (w + (T * k + T * d) * B), T, t);
    }
    /* mlp: gemm(L, T, d, up), act, gemm(L, T, f, d) */
    {
        double up = (double)s->m_up, f = (double)s->m_f;
        w = (double)(s->m_d * s->m_up) * s->b_w;
        fold(s, &o[6], L * 2.0 * T * d * up, L * (w + (T * d + T * up) * B), T, t);
        fold(s, &o[7], (double)(Li * 5) * T * f, L * T * (double)(s->m_up + s->m_f) * B, T, t);
        w = (double)(s->m_f * s->m_d) * s->b_w;
        fold(s, &o[8], L * 2.0 * T * f * d, L * (w + (T * f + T * d) * B), T, t);
    }
    /* lm_head over the sampled rows, fp32 logits written */
    if (sampled > 0) {
        double S = (double)sampled, V = (double)s->m_vocab;
        w = (double)(s->m_d * s->m_vocab) * B;
        double nbytes = 1.0 * (w + (S * d + S * V) * B);
        nbytes = nbytes + S * V * (4.0 - B);
        fold(s, &o[9], 2.0 * S * d * V, nbytes, S, t);
    }
    double net = 0.0, sent = 0.0;
    if (s->tp > 1) {  /* _allreduce: 2 per layer, ring */
        double count = (double)(2 * Li);
        double msg = (double)(tokens * s->m_d) * B;
        double one = 2.0 * (double)(s->tp - 1) / (double)s->tp * msg;
        net = count * (s->link_lat + one / s->link_bw);
        sent = count * one;
    }
    v[0] = t[0]; v[1] = t[1]; v[2] = net; v[3] = t[2]; v[4] = t[3]; v[5] = t[4] + sent; v[6] = t[5];
}

/* One attention class's (k: 0 prefill, 1 decode) time as _price_fast prices it, into a: the larger
 * of its compute and memory times, which of them, and whether it is out of the measured range. */
static void attention(core_t *s, int k, int64_t tokens, double wf, double wb, attn_t *a) {
    const curve_t *cc = k ? &s->dec_c : &s->pre_c, *mc = k ? &s->dec_m : &s->pre_m;
    const double *rng = k ? s->dec_range : s->pre_range;
    int has_rng = k ? s->dec_has_range : s->pre_has_range;
    double per = wb / (double)s->L;
    double tc = wf != 0.0 ? wf / (s->peak * curve_tokens(cc, tokens)) : 0.0;
    double tm = wb != 0.0 ? wb / (s->bw * curve_eval(mc, per, &s->mem_seg[k])) : 0.0;
    a->mem = !(tc >= tm);
    a->t = a->mem ? tm : tc;
    a->oor = has_rng && !(rng[0] <= (double)tokens && (double)tokens <= rng[1] && rng[2] <= per && per <= rng[3]);
}

static int price_sums(core_t *s, const sums_t *m, cost_t *out, int flops_only) {
    /* RooflineCostModel.price -> _price_fast, operation for operation */
    int64_t n = m->n, T = m->T, n_dec = m->n_dec, ctx_dec = m->ctx_dec, D = m->D, key = dense_key(D, m->sampled);
    /* (an entry never changes once made: a recent copy of it is as good) */
    dense_t *recent = dense_slot(s, D, m->sampled), *d = recent;
    if (recent->key != key) {
        d = dense_find(s, key);
        if (d->key == -1) {
            if (!s->dense_in_c) {
                s->need_T = D;
                s->need_s = m->sampled;
                return CORE_NEED_DENSE;
            }
            double v[7];
            dense_compute(s, D, m->sampled, v);
            if (2 * (s->dense_n + 1) > s->dense_cap) {
                if (dense_grow(s)) return CORE_ERR_NOMEM;
            }
            d = dense_find(s, key);
            d->key = key;
            memcpy(d->v, v, sizeof(v));
            s->dense_n++;
        }
        *recent = *d;
        d = recent;
    }
    double pairs, pre_kv;
    if (T == n && m->qq == n) {  /* every row one token */
        pairs = pre_kv = (double)(n - n_dec);
    } else {
        pairs = (double)(2 * m->qkv + m->qq + T) / 2.0 - (double)ctx_dec;
        pre_kv = (double)(m->kv_read + T - ctx_dec);  /* (every row computes: q >= 1) */
    }
    double comp = d->v[0], mem = d->v[1], net = d->v[2], over = d->v[3], flops = d->v[4], nbytes = d->v[5];
    int64_t oor = (int64_t)d->v[6];
    double L = (double)s->L;
    for (int k = 0; k < 2; k++) {
        int64_t tokens = k == 0 ? T - n_dec : n_dec;
        if (!tokens) continue;  /* (before the products: a padded decode step has no prefill class) */
        double wf, wb;
        if (k == 0) {
            wf = s->L4 * pairs * (double)s->h * (double)s->dh;
            wb = L * (pre_kv * s->kv_elt + (double)(T - n_dec) * s->qo);
        } else {
            wf = s->L4 * (double)ctx_dec * (double)s->h * (double)s->dh;
            wb = L * ((double)ctx_dec * s->kv_elt + (double)n_dec * s->qo);
        }
        flops += wf;
        if (flops_only) continue;
        attn_t got, *a = &got;
        if (k == 1 && s->padded) {  /* (its shape is (n_dec, ctx_dec): a remembered one is as good) */
            int64_t akey = (n_dec << 40) | ctx_dec;
            a = &s->attn[(uint64_t)(ctx_dec + n_dec * ATTN_SPREAD) & (ATTN_N - 1)];
            if (a->key != akey) {
                attention(s, k, tokens, wf, wb, a);
                a->key = akey;
            }
        } else {
            attention(s, k, tokens, wf, wb, a);
        }
        if (a->mem) mem += a->t; else comp += a->t;
        over += s->l_launch;
        nbytes += wb;
        oor += a->oor;
    }
    double t = (double)s->tp;
    out->flops = flops * t;
    if (flops_only) return 0;
    over += (n_dec ? s->host0d : s->host0) + s->host1 * (double)n;
    out->seconds = comp + mem + net + over;
    out->bytes = nbytes * t;
    out->comp = comp;
    out->mem = mem;
    out->net = net;
    out->over = over;
    out->oor = oor;
    return 0;
}

static int price(core_t *s, replica_t *r) {
    cost_t c, u;
    int st = price_sums(s, &r->bill, &c, 0);
    if (st) return st;
    if (r->npad || r->nbilled || r->bill.D != r->bill.T) {  /* useful_flops: the useful rows priced on their own */
        st = price_sums(s, &r->use, &u, 1);
        if (st) return st;
    } else {
        u.flops = c.flops;
    }
    r->c_seconds = c.seconds;
    r->c_flops = c.flops;
    r->c_useful = u.flops;
    r->c_bytes = c.bytes;
    r->c_comp = c.comp;
    r->c_mem = c.mem;
    r->c_net = c.net;
    r->c_over = c.over;
    r->c_oor = c.oor;
    return 0;
}

/* A request's open run of tokens, handed over as closed (batchsim/sim/itl.py: which runs are
 * closed and which open at the end makes no difference to the records, sorted by request). */
static void close_run(core_t *s, replica_t *r, int64_t rid) {
    int64_t j = r->nclosed++, cap = s->gap_cap;
    r->g_run[j] = rid;
    r->g_run[cap + j] = s->run_start[rid];
    r->g_run[2 * cap + j] = s->run_end[rid];
    r->g_entry[j] = s->run_entry[rid];
    s->run_rep[rid] = -1;
}

static void advance_and_record(core_t *s, replica_t *r, int ri) {
    /* Replica._advance then Replica._record; tokens are stamped when their clients have them
     * (batchsim/sim/frontend.py delivered_at) */
    double now = s->now, end = now;
    int64_t ndone = 0, kstep = r->kt, emitted = 0, nfirst = 0;
    if (s->has_frontend && r->use.sampled) {
        double start = now > r->out_free ? now : r->out_free;
        now = r->out_free = start + s->out_step + s->out_token * (double)r->use.sampled;
    }
    for (int64_t j = 0; j < r->nrows; j++) {
        int64_t rid = r->rows_rid[j], q = r->rows_q[j];
        int64_t c = s->num_computed[rid] + q;
        s->num_computed[rid] = c;
        if (c != s->num_tokens[rid]) continue;
        int64_t g = s->num_generated[rid] + 1;
        s->num_generated[rid] = g;
        s->num_tokens[rid] = c + 1;
        double last = s->last_token[rid];
        if (isnan(last)) {
            s->first_token[rid] = now;
            r->firsts[nfirst++] = rid;
        } else {
            double gap = now - last;
            if (gap > s->max_itl[rid]) s->max_itl[rid] = gap;
            if (!emitted) {
                r->g_t[r->nt++] = now;
                r->kt++;
                emitted = 1;
            }
            if (s->run_rep[rid] == ri && s->run_end[rid] == kstep - 1) {
                s->run_end[rid] = kstep;
            } else {
                if (s->run_rep[rid] >= 0) close_run(s, r, rid);
                s->run_rep[rid] = ri;
                s->run_start[rid] = s->run_end[rid] = kstep;
                s->run_entry[rid] = gap;
            }
        }
        s->last_token[rid] = now;
        if (g >= s->output[rid]) {
            s->finished[rid] = 1;
            s->status[rid] = ST_COMPLETED;
            s->completion[rid] = now;
            ndone++;
        }
    }
    if (nfirst && emitted) {  /* first tokens in a token step: their runs start with it */
        for (int64_t j = 0; j < nfirst; j++) {
            int64_t rid = r->firsts[j];
            s->run_rep[rid] = ri;
            s->run_start[rid] = s->run_end[rid] = kstep;
            s->run_entry[rid] = NAN;
        }
    }
    if (ndone) {  /* a finished request's run is closed (core_frontier: open runs are of unfinished ones) */
        for (int64_t j = 0; j < r->nrows; j++) {
            int64_t rid = r->rows_rid[j];
            if (s->finished[rid] && s->run_rep[rid] >= 0) close_run(s, r, rid);
        }
    }
    if (ndone && !r->hold_finished) {
        int64_t k = 0;
        for (int64_t i = 0; i < r->nrun; i++) {
            int64_t rid = r->run[i];
            if (s->finished[rid]) {
                s->running[rid] = 0;
                if (s->rc.schedule_ahead) r->dfr[r->ndfr++] = rid;  /* (the next step was planned with its KV held) */
                else kv_free(s, r, rid);
            } else {
                r->run[k++] = rid;
            }
        }
        r->nrun = k;
        r->outstanding -= ndone;
    }
    int64_t i = r->nsteps++;
    double *f = r->sf + i * NSTEP_F;
    int64_t *n = r->si + i * NSTEP_I;
    f[0] = r->start;
    f[1] = end;
    f[2] = r->c_flops;
    f[3] = r->c_useful;
    f[4] = r->c_bytes;
    f[5] = r->c_comp;
    f[6] = r->c_mem;
    f[7] = r->c_net;
    f[8] = r->c_over;
    n[0] = ri;
    n[1] = r->nrows;
    n[2] = r->nrows + r->npad;
    n[3] = r->use.T - r->rec_decode;
    n[4] = r->rec_decode;
    n[5] = r->bill.T - r->use.T;
    n[6] = r->c_oor;
    n[7] = r->used;
    n[8] = r->wlen;
    n[9] = r->nrun;
    n[10] = r->npre;
    s->steps_total++;
}

/* Replica._loop from wherever it stopped, until it yields (a step's timeout,
 * or idling) or needs a dense entry. */
static int replica_loop(core_t *s, int ri) {
    replica_t *r = &s->reps[ri];
    for (;;) {
        if (r->phase == PH_SCHEDULE) {
            plan(s, r);
            int err = apply_admission(s, r);
            if (err) return err;
            /* Replica._free_deferred */
            int freed = r->ndfr > 0;
            for (int64_t j = 0; j < r->ndfr; j++) kv_free(s, r, r->dfr[j]);
            r->ndfr = 0;
            if (!r->nrows) {
                if (r->nrel || r->nrej || r->npre) {
                    if (++r->admin_only > 100000) return CORE_ERR_ADMIN;
                    continue;
                }
                if (freed || r->hidden) {  /* nothing planned: the host takes them now, plans again */
                    r->hidden = 0;
                    continue;
                }
                /* Replica._idle: AnyOf(wake[, timeout(idle_until - now)]) */
                r->phase = PH_IDLE;
                r->wake_triggered = r->cond_triggered = 0;
                r->idle_gen++;
                if (r->has_idle_until) {
                    if (r->idle_until <= s->now) return CORE_ERR_IDLE;
                    schedule_gen(s, s->now + (r->idle_until - s->now), NORMAL, EV_IDLE_TIMEOUT, ri, r->idle_gen);
                }
                return 0;
            }
            r->admin_only = 0;
            err = grow_and_shape(s, r);
            if (err) return err;
            r->start = s->now;
            if (s->rc.schedule_ahead) {  /* the next step is planned from what has arrived so far */
                r->hidden = 0;
                r->ahead = 1;
            }
            r->phase = PH_PRICE;
        }
        if (r->phase == PH_PRICE) {
            int st = price(s, r);
            if (st) {
                s->pending_rep = ri;
                return st;
            }
            schedule(s, s->now + r->c_seconds, NORMAL, EV_STEP, ri);
            r->phase = PH_STEP;
            return 0;
        }
        return CORE_ERR_INTERNAL;
    }
}

static int step_done(core_t *s, int ri) {
    replica_t *r = &s->reps[ri];
    r->ahead = 0;
    advance_and_record(s, r, ri);
    r->phase = PH_SCHEDULE;
    return replica_loop(s, ri);
}

/* ------------------------------------------------------------ arrivals --- */
static int route(core_t *s, int64_t rid) {
    if (s->n_rep == 1) {
        if (s->router == R_ROUND_ROBIN) s->rr++;
        return 0;
    }
    if (s->router == R_ROUND_ROBIN) return (int)(s->rr++ % s->n_rep);
    if (s->router == R_POWER_OF_TWO) {  /* min((outstanding, index)) of the two drawn */
        int64_t a = s->pairs[2 * rid], b = s->pairs[2 * rid + 1];
        replica_t *ra = &s->reps[a], *rb = &s->reps[b];
        if (ra->outstanding < rb->outstanding || (ra->outstanding == rb->outstanding && a < b)) return (int)a;
        return (int)b;
    }
    int best = 0;
    for (int i = 1; i < s->n_rep; i++) {
        replica_t *a = &s->reps[i], *b = &s->reps[best];
        if (s->router == R_LEAST_OUTSTANDING) {
            if (a->outstanding < b->outstanding) best = i;
        } else {
            double fa = (double)a->used / (double)a->total_blocks, fb = (double)b->used / (double)b->total_blocks;
            if (fa < fb || (fa == fb && a->wlen < b->wlen)) best = i;
        }
    }
    return best;
}

static void deliver(core_t *s, int64_t rid) {
    int ri = route(s, rid);
    replica_t *r = &s->reps[ri];
    s->rep[rid] = ri;
    if (s->max_queue_len >= 0 && r->wlen >= s->max_queue_len) {
        s->status[rid] = ST_REJECTED;
        s->reason[rid] = RS_QUEUE_FULL;
        return;
    }
    int64_t total = s->prompt[rid] + s->output[rid];
    if (total > s->max_model_len) {
        s->status[rid] = ST_REJECTED;
        s->reason[rid] = RS_MAX_MODEL_LEN;
        s->reason_val[rid] = total;
        return;
    }
    if (blocks_for(total, s->bs) > r->total_blocks) {
        s->status[rid] = ST_REJECTED;
        s->reason[rid] = RS_KV_CAPACITY;
        s->reason_val[rid] = total;
        return;
    }
    wq_push_back(r, rid);
    if (r->ahead) r->hidden++;  /* (into the inbox) */
    r->outstanding++;
    if (r->phase == PH_IDLE && !r->wake_triggered) {
        /* (also after a deadline made the spell's condition succeed, before the replica resumed:
         * Replica._wake is still that spell's event; its wake-up then changes nothing) */
        r->wake_triggered = 1;
        schedule_gen(s, s->now, NORMAL, EV_WAKE, ri, r->idle_gen);
    }
}

static void arrivals(core_t *s) {
    /* Cluster._arrivals, from the request after the last delivered */
    while (s->next_rid < s->n_req) {
        double t = s->arrival[s->next_rid];
        if (t > s->now) {
            schedule(s, s->now + (t - s->now), NORMAL, EV_ARRIVAL, -1);
            return;
        }
        deliver(s, s->next_rid++);
    }
}

/* ---------------------------------------------------------------- API --- */
void core_free(core_t *s) {
    if (!s) return;
    free(s->num_tokens); free(s->num_computed);
    free(s->held); free(s->order); free(s->running); free(s->finished);
    free(s->mark_sched); free(s->mark_pre);
    free(s->heap); free(s->dense); free(s->attn); free(s->pre_c.memo); free(s->dec_c.memo);
    if (s->reps) {
        for (int64_t i = 0; i < s->n_rep; i++) {
            replica_t *r = &s->reps[i];
            free(r->wq); free(r->run); free(r->rows_rid); free(r->rows_q); free(r->scratch);
            free(r->pre); free(r->rej); free(r->rel); free(r->cand); free(r->keys); free(r->pad_q); free(r->pad_kv); free(r->pad_s); free(r->firsts); free(r->dfr);
        }
        free(s->reps);
    }
    free(s);
}

static void curve_from(curve_t *c, const core_curve_t *t) {
    c->n = (int)t->n;
    c->lo = t->lo; c->hi = t->hi; c->ylo = t->ylo; c->yhi = t->yhi;
    c->lx = t->lx; c->y = t->y; c->slope = t->slope;
}

/* Where the replicas write their step records, token-step times and closed runs from now on
 * (one block per replica, as core_new's): the caller hands over a second set while it reads
 * the first, so the run goes on as the records are read (batchsim/core/__init__.py run_core). */
void core_buffers(core_t *s, double *sf, int64_t *si, double *g_t, int64_t *g_run, double *g_entry) {
    for (int64_t i = 0; i < s->n_rep; i++) {
        replica_t *r = &s->reps[i];
        r->sf = sf + i * NSTEP_F * s->step_cap;
        r->si = si + i * NSTEP_I * s->step_cap;
        r->g_t = g_t + i * s->gap_cap;
        r->g_run = g_run + i * 3 * s->gap_cap;
        r->g_entry = g_entry + i * s->gap_cap;
    }
}

/* The run's settings, the policy's recipe and the cost model's pricing table (named structs),
 * workload arrays, per-request outputs (int64 [10][n] and double [6][n]),
 * record buffers per replica (double [R][step_cap][NSTEP_F], int64 [R][step_cap][NSTEP_I],
 * double [R][gap_cap] token-step times, int64 [R][3][gap_cap] and double [R][gap_cap] closed runs). */
core_t *core_new(const core_params_t *pa, const core_recipe_t *recipe, const core_cost_t *co,
                 const double *arrival, const int64_t *prompt, const int64_t *output,
                 int64_t *req_i, double *req_f, const int64_t *blocks,
                 double *sf, int64_t *si, double *g_t, int64_t *g_run, double *g_entry, const int64_t *pairs) {
    if (recipe->n_moves < 0 || recipe->n_moves > MAX_MOVES || recipe->n_pref < 0 || recipe->n_pref > MAX_PREF)
        return NULL;
    core_t *s = (core_t *)calloc(1, sizeof(core_t));
    if (!s) return NULL;
    s->rc = *recipe;
    s->padded = (int)recipe->padded;
    s->sfp = recipe->order == ORDER_SPF;
    s->max_seqs = recipe->max_num_seqs;
    s->cap = recipe->max_num_batched_tokens;
    s->n_req = pa->n_req; s->n_rep = pa->n_rep; s->bs = pa->block_size; s->max_model_len = pa->max_model_len;
    s->max_queue_len = pa->max_queue_len; s->router = pa->router; s->has_horizon = (int)pa->has_horizon;
    s->horizon = pa->horizon; s->step_cap = pa->step_cap; s->gap_cap = pa->gap_cap;
    s->has_frontend = (int)pa->has_frontend; s->out_step = pa->out_step; s->out_token = pa->out_token;
    s->L = co->layers; s->h = co->heads; s->dh = co->head_dim; s->tp = co->tp;
    s->L4 = (double)co->layers * 4.0; s->kv_elt = co->kv_elt; s->qo = co->qo; s->peak = co->peak; s->bw = co->bw;
    s->l_launch = co->attn_launch; s->host0 = co->host_step; s->host1 = co->host_seq; s->host0d = co->host_decode_step;
    s->pre_has_range = (int)co->prefill.has_range; s->dec_has_range = (int)co->decode.has_range;
    for (int i = 0; i < 4; i++) { s->pre_range[i] = co->prefill.range[i]; s->dec_range[i] = co->decode.range[i]; }
    curve_from(&s->pre_c, &co->prefill.comp);
    curve_from(&s->pre_m, &co->prefill.mem);
    curve_from(&s->dec_c, &co->decode.comp);
    curve_from(&s->dec_m, &co->decode.mem);
    s->dense_in_c = (int)co->dense_in_c;
    if (s->dense_in_c) {
        s->m_d = co->hidden; s->m_heads = co->q_heads; s->m_kvh = co->kv_heads; s->m_qkvw = co->qkv_width;
        s->m_rot = co->rot_width; s->m_vocab = co->vocab; s->m_f = co->mlp_width; s->m_up = co->up_width;
        s->b_w = co->b_w; s->b_kv = co->b_kv; s->launch = co->launch; s->link_lat = co->link_lat; s->link_bw = co->link_bw;
        for (int i = 0; i < N_OPS; i++) {
            op_t *o = &s->ops[i];
            const core_op_t *t = &co->ops[i];
            o->kernels = t->kernels;
            o->has_rng = (int)t->has_range;
            o->peak = t->peak;
            for (int j = 0; j < 4; j++) o->rng[j] = t->range[j];
            curve_from(&o->comp, &t->comp);
            curve_from(&o->mem, &t->mem);
        }
    }
    s->pre_c.memo = (double *)malloc(sizeof(double) * MEMO_N);
    s->dec_c.memo = (double *)malloc(sizeof(double) * MEMO_N);
    if (!s->pre_c.memo || !s->dec_c.memo) {
        core_free(s);
        return NULL;
    }
    for (int64_t i = 0; i < MEMO_N; i++) s->pre_c.memo[i] = s->dec_c.memo[i] = NAN;
    int64_t n = s->n_req;
    s->arrival = arrival; s->prompt = prompt; s->output = output; s->pairs = pairs;
    s->rep = req_i + 0 * n; s->status = req_i + 1 * n; s->reason = req_i + 2 * n; s->reason_val = req_i + 3 * n;
    s->num_generated = req_i + 4 * n; s->num_preempt = req_i + 5 * n; s->admitted_int = req_i + 6 * n;
    s->now_is_int = 1;
    s->admitted = req_f + 0 * n; s->first_token = req_f + 1 * n; s->last_token = req_f + 2 * n;
    s->completion = req_f + 3 * n; s->max_itl = req_f + 4 * n;
    s->run_rep = req_i + 7 * n; s->run_start = req_i + 8 * n; s->run_end = req_i + 9 * n;
    s->run_entry = req_f + 5 * n;
    int64_t m = n > 0 ? n : 1;
    s->num_tokens = (int64_t *)malloc(sizeof(int64_t) * m);
    s->num_computed = (int64_t *)calloc(m, sizeof(int64_t));
    s->held = (int64_t *)calloc(m, sizeof(int64_t));
    s->order = (int64_t *)malloc(sizeof(int64_t) * m);
    s->running = (uint8_t *)calloc(m, 1);
    s->finished = (uint8_t *)calloc(m, 1);
    s->mark_sched = (int64_t *)calloc(m, sizeof(int64_t));
    s->mark_pre = (int64_t *)calloc(m, sizeof(int64_t));
    s->heapcap = 4 * s->n_rep + 16;
    s->heap = (event_t *)malloc(sizeof(event_t) * s->heapcap);
    s->dense_cap = 4096;
    s->dense = (dense_t *)malloc(sizeof(dense_t) * s->dense_cap);
    s->attn = (attn_t *)malloc(sizeof(attn_t) * (s->padded ? ATTN_N : 1));
    s->reps = (replica_t *)calloc(s->n_rep, sizeof(replica_t));
    if (!s->num_tokens || !s->num_computed || !s->held || !s->order || !s->running || !s->finished
        || !s->mark_sched || !s->mark_pre || !s->heap || !s->dense || !s->attn || !s->reps) {
        core_free(s);
        return NULL;
    }
    for (int64_t i = 0; i < s->dense_cap; i++) s->dense[i].key = -1;
    for (int i = 0; i < DENSE_RECENT; i++) s->dense_recent[i].key = -1;
    for (int64_t i = 0; i < (s->padded ? ATTN_N : 1); i++) s->attn[i].key = -1;
    for (int64_t i = 0; i < n; i++) {
        s->num_tokens[i] = prompt[i];
        s->order[i] = -1;
        s->rep[i] = -1;
        s->status[i] = ST_UNFINISHED;
        s->reason[i] = RS_NONE;
        s->reason_val[i] = 0;
        s->num_generated[i] = 0;
        s->num_preempt[i] = 0;
        s->admitted_int[i] = 0;
        s->admitted[i] = s->first_token[i] = s->last_token[i] = s->completion[i] = NAN;
        s->max_itl[i] = 0.0;
        s->run_rep[i] = -1;
        s->run_start[i] = s->run_end[i] = 0;
        s->run_entry[i] = NAN;
    }
    s->max_rows = s->max_seqs < n ? s->max_seqs : n;
    if (s->gap_cap < 2 * s->max_rows + 2) {  /* (Python sizes the gap buffers above this) */
        core_free(s);
        return NULL;
    }
    int64_t wcap = 16;
    while (wcap < n + 1) wcap *= 2;
    for (int64_t i = 0; i < s->n_rep; i++) {
        replica_t *r = &s->reps[i];
        r->total_blocks = blocks[i];
        r->keep = (int64_t)(s->rc.watermark * (double)blocks[i]);
        r->wcap = wcap;
        r->wq = (int64_t *)malloc(sizeof(int64_t) * wcap);
        int64_t rc = (s->max_seqs < n ? s->max_seqs : n) + 1;  /* (running never exceeds the requests) */
        r->run = (int64_t *)malloc(sizeof(int64_t) * rc);
        r->rows_rid = (int64_t *)malloc(sizeof(int64_t) * rc);
        r->rows_q = (int64_t *)malloc(sizeof(int64_t) * rc);
        r->scratch = (int64_t *)malloc(sizeof(int64_t) * rc);
        r->pre = (int64_t *)malloc(sizeof(int64_t) * rc);
        r->rej = (int64_t *)malloc(sizeof(int64_t) * m);
        r->rel = (int64_t *)malloc(sizeof(int64_t) * rc);
        if (s->sfp) {
            r->cand = (int64_t *)malloc(sizeof(int64_t) * wcap);
            r->keys = (int64_t *)malloc(sizeof(int64_t) * wcap);
            if (!r->cand || !r->keys) {
                core_free(s);
                return NULL;
            }
        }
        r->pad_q = (int64_t *)malloc(sizeof(int64_t) * rc);
        r->pad_kv = (int64_t *)malloc(sizeof(int64_t) * rc);
        r->pad_s = (int64_t *)malloc(sizeof(int64_t) * rc);
        r->firsts = (int64_t *)malloc(sizeof(int64_t) * rc);
        r->dfr = (int64_t *)malloc(sizeof(int64_t) * rc);
        if (!r->wq || !r->run || !r->rows_rid || !r->rows_q || !r->scratch || !r->pre || !r->rej || !r->rel
            || !r->pad_q || !r->pad_kv || !r->pad_s || !r->firsts || !r->dfr) {
            core_free(s);
            return NULL;
        }
        r->phase = PH_SCHEDULE;
    }
    core_buffers(s, sf, si, g_t, g_run, g_entry);
    s->pending_rep = -1;
    /* env.process(): each replica's Initialize, then the arrivals' (URGENT, at 0) */
    for (int64_t i = 0; i < s->n_rep; i++) schedule(s, 0.0, URGENT, EV_INIT_REPLICA, (int)i);
    schedule(s, 0.0, URGENT, EV_INIT_ARRIVALS, -1);
    if (s->has_horizon) s->eid++;  /* env.run(until=...): its stop event */
    return s;
}

/* BEGIN RULES FINGERPRINT (python -m batchsim.core.rules --update) */
/* The rules this core implements: one hash per function (batchsim/core/rules.py). */
static const char CORE_RULES[] =
    "batchsim.calibrate.costmodel.RooflineCostModel.__init__ cd3d8b05f38b\n"
    "batchsim.calibrate.costmodel.RooflineCostModel._allreduce 0e8beb5fdfda\n"
    "batchsim.calibrate.costmodel.RooflineCostModel._dense 095d6eaf860b\n"
    "batchsim.calibrate.costmodel.RooflineCostModel._dense_table 94d98d6facbf\n"
    "batchsim.calibrate.costmodel.RooflineCostModel._fold 662612abcdef\n"
    "batchsim.calibrate.costmodel.RooflineCostModel._merge aeff9b3ce4a6\n"
    "batchsim.calibrate.costmodel.RooflineCostModel._op 0a36da40a096\n"
    "batchsim.calibrate.costmodel.RooflineCostModel._precompute 40eb6a0e9ede\n"
    "batchsim.calibrate.costmodel.RooflineCostModel._price_fast a54840d860b8\n"
    "batchsim.calibrate.costmodel.RooflineCostModel._price_slow 62d247370e69\n"
    "batchsim.calibrate.costmodel.RooflineCostModel._priced_breakdown c4d62e0d7289\n"
    "batchsim.calibrate.costmodel.RooflineCostModel._roofline b9b00c306a04\n"
    "batchsim.calibrate.costmodel.RooflineCostModel.dense_totals 4c1c40a27807\n"
    "batchsim.calibrate.costmodel.RooflineCostModel.gemm_seconds 871fc4f69c7b\n"
    "batchsim.calibrate.costmodel.RooflineCostModel.kv_capacity_blocks b71e2e48ad95\n"
    "batchsim.calibrate.costmodel.RooflineCostModel.kv_capacity_tokens eba19e0771b7\n"
    "batchsim.calibrate.costmodel.RooflineCostModel.price ed6399918bec\n"
    "batchsim.calibrate.costmodel.RooflineCostModel.pricing_table 4fa7c0e6b22d\n"
    "batchsim.calibrate.costmodel._denominator 54f69c7d7444\n"
    "batchsim.calibrate.costmodel._make_step_cost 3e36dadb65c8\n"
    "batchsim.calibrate.costmodel._ones 65c843ac32dc\n"
    "batchsim.calibrate.costmodel._step_cost 0a126dd769bd\n"
    "batchsim.calibrate.curves.ClassEfficiency.__init__ 8850ef63eac3\n"
    "batchsim.calibrate.curves.ClassEfficiency.measured.get 84237e706870\n"
    "batchsim.calibrate.curves.ClassEfficiency.out_of_range 8c0675652fdc\n"
    "batchsim.calibrate.curves.Curve.__call__ 094c3e37aec6\n"
    "batchsim.calibrate.curves.Curve.__init__ 5d8492106078\n"
    "batchsim.calibrate.curves.Curve.table f676ed994af9\n"
    "batchsim.calibrate.work.ShardShape._mlp 6085c007020d\n"
    "batchsim.calibrate.work.ShardShape._moe 3e0d8ffb2057\n"
    "batchsim.calibrate.work.ShardShape.activation_bytes a36e2ab65191\n"
    "batchsim.calibrate.work.ShardShape.allreduce_bytes 0b7c72726e1b\n"
    "batchsim.calibrate.work.ShardShape.attention be4e7c3fa6c2\n"
    "batchsim.calibrate.work.ShardShape.dense 63371f79708e\n"
    "batchsim.calibrate.work.ShardShape.gemm 7e843e310822\n"
    "batchsim.calibrate.work.ShardShape.heads.get c78da37d998c\n"
    "batchsim.calibrate.work.ShardShape.kv_bytes_per_token.get 0f81bd5f0e3e\n"
    "batchsim.calibrate.work.ShardShape.kv_heads.get c623dff4f55a\n"
    "batchsim.calibrate.work.ShardShape.lm_head c506c3c2d2bf\n"
    "batchsim.calibrate.work.ShardShape.mlp_width.get 22b83ac47c7a\n"
    "batchsim.calibrate.work.ShardShape.of f63cf8c4e044\n"
    "batchsim.calibrate.work.ShardShape.qkv_width.get 172dd9bafc0b\n"
    "batchsim.calibrate.work.ShardShape.touched_experts 0d0f4e0fa1ce\n"
    "batchsim.calibrate.work.ShardShape.vocab.get 97203093a679\n"
    "batchsim.calibrate.work.ShardShape.weight_bytes 8c684e82968f\n"
    "batchsim.policies.base.PolicyBase.__init__ d619400d54df\n"
    "batchsim.policies.base.PolicyBase.__repr__ 7f816b2bfa2f\n"
    "batchsim.policies.base.blocks_for 5018db29fe49\n"
    "batchsim.policies.base.held_blocks fc430b999db0\n"
    "batchsim.policies.ordering.QUEUE_ORDERS[fcfs] 3a680781d8d8\n"
    "batchsim.policies.ordering.QUEUE_ORDERS[shortest_prompt_first] f34aea5ac454\n"
    "batchsim.policies.ordering.VICTIM_RULES[fewest_decoded] b5291db325fd\n"
    "batchsim.policies.ordering.VICTIM_RULES[last_admitted] d22a48bbf70c\n"
    "batchsim.policies.ordering.fcfs 3a680781d8d8\n"
    "batchsim.policies.ordering.fewest_decoded b5291db325fd\n"
    "batchsim.policies.ordering.last_admitted d22a48bbf70c\n"
    "batchsim.policies.ordering.shortest_prompt_first f34aea5ac454\n"
    "batchsim.policies.padded._decode c488e0a56ede\n"
    "batchsim.policies.padded._launch 2e7c98f1e4fa\n"
    "batchsim.policies.padded.fit_prefix b54350b8829b\n"
    "batchsim.policies.padded.launch_size 053c8f9dfc21\n"
    "batchsim.policies.padded.reserve_tokens 91b498b574bd\n"
    "batchsim.policies.padded.run_padded 301f2dacef6d\n"
    "batchsim.policies.recipe.CudaGraphs.__post_init__ d97bc6c40650\n"
    "batchsim.policies.recipe.IterationRecipe.__post_init__ eca2f1675d8d\n"
    "batchsim.policies.recipe.Move.__post_init__ 77a804de13dc\n"
    "batchsim.policies.recipe.PaddedRecipe.__post_init__ fede5fb47de3\n"
    "batchsim.policies.recipe._one_of 4807f029c567\n"
    "batchsim.policies.recipe._positive_int 2fc0431fea59\n"
    "batchsim.policies.recipe.check_capture_sizes 47b9597cee5e\n"
    "batchsim.policies.recipe.check_graphs_budget da882c73c337\n"
    "batchsim.policies.recipe.check_max_context 66143bfe7117\n"
    "batchsim.policies.recipe.check_max_padding 27d7a8bd47c6\n"
    "batchsim.policies.rules.RecipePolicy.__init__ d2276e39bfe6\n"
    "batchsim.policies.rules.RecipePolicy.make_recipe 9a0a8dadd801\n"
    "batchsim.policies.rules.RecipePolicy.schedule 2c354dc0661b\n"
    "batchsim.policies.rules.interpret 3a8b138511a5\n"
    "batchsim.policies.step.CudaGraphsConfig._context f4edbf7c59cb\n"
    "batchsim.policies.step.CudaGraphsConfig._factor 3c050eb19c47\n"
    "batchsim.policies.step.CudaGraphsConfig._sizes aa2ab2ba0a5e\n"
    "batchsim.policies.step.CudaGraphsConfig.value 72147a1a50ab\n"
    "batchsim.policies.step.IterationConfig._budget_covers_decodes b4f4625fe70b\n"
    "batchsim.policies.step.IterationConfig._graphs_within_budget 334423d3f8b5\n"
    "batchsim.policies.step.IterationConfig.recipe 40311d9b80f4\n"
    "batchsim.policies.step.QUEUE_ORDERS[fcfs] 3a680781d8d8\n"
    "batchsim.policies.step.QUEUE_ORDERS[shortest_prompt_first] f34aea5ac454\n"
    "batchsim.policies.step.StepBuilder.__init__ 59fe57fd0784\n"
    "batchsim.policies.step.StepBuilder._future 821a3f0cb7f9\n"
    "batchsim.policies.step.StepBuilder._preempt 0344c4a94cde\n"
    "batchsim.policies.step.StepBuilder._try 5a247d16479d\n"
    "batchsim.policies.step.StepBuilder._unscheduled 4f3faed685d3\n"
    "batchsim.policies.step.StepBuilder._whole 1ce602732704\n"
    "batchsim.policies.step.StepBuilder.admit 750b7109e1b3\n"
    "batchsim.policies.step.StepBuilder.plan 7dc8038a2890\n"
    "batchsim.policies.step.StepBuilder.schedule_decodes f19d2a558de2\n"
    "batchsim.policies.step.StepBuilder.schedule_partial_prefills e0b1461266e4\n"
    "batchsim.policies.step.VICTIM_RULES[fewest_decoded] b5291db325fd\n"
    "batchsim.policies.step.VICTIM_RULES[last_admitted] d22a48bbf70c\n"
    "batchsim.policies.step._is_decode 258da729e47b\n"
    "batchsim.policies.step.graph_tokens 6999fa43ccca\n"
    "batchsim.policies.step.over_budget ea39c77b4d54\n"
    "batchsim.policies.step.over_watermark c8364d4bb38a\n"
    "batchsim.policies.step.run_iteration 470712bcaf43\n"
    "batchsim.sim.engine.Cluster.__init__ 6dd05058d515\n"
    "batchsim.sim.engine.Cluster._arrivals a884ce4b6c0b\n"
    "batchsim.sim.engine.Cluster._client b640776e8788\n"
    "batchsim.sim.engine.Cluster._end 2fedc2ec967d\n"
    "batchsim.sim.engine.Cluster._send 946234429161\n"
    "batchsim.sim.engine.Replica.__init__ e653bf541f49\n"
    "batchsim.sim.engine.Replica._admit d8cec4172862\n"
    "batchsim.sim.engine.Replica._advance d3c5015d3955\n"
    "batchsim.sim.engine.Replica._check_names 7e4e20bd1ce3\n"
    "batchsim.sim.engine.Replica._free_deferred b53953a84a55\n"
    "batchsim.sim.engine.Replica._grow_and_shape 376a9ddd9e53\n"
    "batchsim.sim.engine.Replica._idle f5ada59026bc\n"
    "batchsim.sim.engine.Replica._let_go dada3ee995ca\n"
    "batchsim.sim.engine.Replica._loop 21f2908de765\n"
    "batchsim.sim.engine.Replica._peek f05a35a4f760\n"
    "batchsim.sim.engine.Replica._record 52abaad18375\n"
    "batchsim.sim.engine.Replica._take_from_waiting 7868674d9ab0\n"
    "batchsim.sim.engine.Replica._take_inbox 45358eb3dfef\n"
    "batchsim.sim.engine.Replica._wake_up f286c8ec44b9\n"
    "batchsim.sim.engine.Replica.enqueue e28b6d19c46d\n"
    "batchsim.sim.engine.Replica.price 2975229b1248\n"
    "batchsim.sim.engine.Replica.queued.get 3e3519e632c1\n"
    "batchsim.sim.engine.Replica.refusal 1f9451575148\n"
    "batchsim.sim.engine.Replica.reject 00cb549acc0f\n"
    "batchsim.sim.engine.Replica.release_kv 2c73f7840ffa\n"
    "batchsim.sim.engine._View.__init__ 8f4c63efc521\n"
    "batchsim.sim.engine._View.now.get 92b77f3accfa\n"
    "batchsim.sim.engine.over_kv 32adf1714e6d\n"
    "batchsim.sim.engine.queue_full 8e4b1697f65d\n"
    "batchsim.sim.engine.too_long ff5880705a2a\n"
    "batchsim.sim.frontend.InServers.__init__ e3bff9affd7c\n"
    "batchsim.sim.frontend.InServers.take 430520ea6387\n"
    "batchsim.sim.frontend.delivered_at e0f2dbde6378\n"
    "batchsim.sim.frontend.engine_arrivals 71be92e41736\n"
    "batchsim.sim.frontend.tokenized_at 1a7a2034f0b2\n"
    "batchsim.sim.kv.PagedKVCache.__init__ 132f3c854e92\n"
    "batchsim.sim.kv.PagedKVCache.blocks_held 5ebdd9f0383f\n"
    "batchsim.sim.kv.PagedKVCache.blocks_needed daee28452576\n"
    "batchsim.sim.kv.PagedKVCache.free ff5ae33c85f0\n"
    "batchsim.sim.kv.PagedKVCache.free_blocks.get 8c8cc98b1b58\n"
    "batchsim.sim.kv.PagedKVCache.grow 7f20e5173318\n"
    "batchsim.sim.kv.PagedKVCache.growth_needed 210e22c00c30\n"
    "batchsim.sim.kv.PagedKVCache.held 19ff0a9bfd77\n"
    "batchsim.sim.kv.PagedKVCache.peek 93e2776162ec\n"
    "batchsim.sim.kv.PagedKVCache.pin 2c27184c27cc\n"
    "batchsim.sim.kv.PagedKVCache.register b0044beb859a\n"
    "batchsim.sim.kv.PagedKVCache.resident_units 7489e1c84bcb\n"
    "batchsim.sim.kv.PagedKVCache.used_blocks.get a1c43f54f0fe\n"
    "batchsim.sim.kv.blocks_for_tokens a852f7969700\n"
    "batchsim.sim.router.ROUTERS[cache_aware] 58dbb80dbe69\n"
    "batchsim.sim.router.ROUTERS[least_kv] d6439e166556\n"
    "batchsim.sim.router.ROUTERS[least_outstanding] de76340b3497\n"
    "batchsim.sim.router.ROUTERS[power_of_two] fa9a65daf992\n"
    "batchsim.sim.router.ROUTERS[round_robin] 5d39de898559\n"
    "batchsim.sim.router._cache_aware 58dbb80dbe69\n"
    "batchsim.sim.router._least_kv d6439e166556\n"
    "batchsim.sim.router._least_outstanding de76340b3497\n"
    "batchsim.sim.router._load d7636f60a3bf\n"
    "batchsim.sim.router._power_of_two fa9a65daf992\n"
    "batchsim.sim.router._round_robin 5d39de898559\n"
    "batchsim.sim.router.make_router 5a48ce78dd6e\n"
    "batchsim.sim.state.Seq.__init__ 89b44e8a57c3\n"
    "batchsim.sim.state.Seq.__repr__ 56b2ea9d9ef7\n"
    "batchsim.sim.state.Seq.in_prefill.get ef6c7afb986e\n"
    "batchsim.sim.state.Seq.pending.get 67bb2374dcaa\n"
    "batchsim.sim.types.BatchPlan.total_tokens.get 333a01874c9c\n"
    "batchsim.sim.types.ClosedLoop.__post_init__ 4217061f5fa9\n"
    "batchsim.sim.types.StepShape.num_rows.get 8c8ccc908897\n"
    "batchsim.sim.types.StepShape.num_tokens.get b44d58a3d0d8\n"
    "batchsim.sim.types.StepShape.of e31b74dda7c0\n"
    "batchsim.sim.types.Workload.__len__ 4815d8eb716e\n"
    "batchsim.sim.types.Workload.__post_init__ 334ed30b4036\n"
    "bind:batchsim.calibrate.costmodel.ClassEfficiency f477450b2d38\n"
    "bind:batchsim.calibrate.costmodel.DenseTable c8d554a510ce\n"
    "bind:batchsim.calibrate.costmodel.HardwareProfile 91ba5e3173f1\n"
    "bind:batchsim.calibrate.costmodel.InputError c37b31e3db20\n"
    "bind:batchsim.calibrate.costmodel.ModelSpec 48c04dc40650\n"
    "bind:batchsim.calibrate.costmodel.OpCost 146c8641b9c5\n"
    "bind:batchsim.calibrate.costmodel.OperatorTable 27743017c96c\n"
    "bind:batchsim.calibrate.costmodel.PricingTable 661ef2b186ed\n"
    "bind:batchsim.calibrate.costmodel.RooflineCostModel 3a96afd65cf5\n"
    "bind:batchsim.calibrate.costmodel.ShardShape ab997dfcdd2a\n"
    "bind:batchsim.calibrate.costmodel.StepCost eed8f0ab85f8\n"
    "bind:batchsim.calibrate.costmodel.StepShape 5ae1a1c2ee95\n"
    "bind:batchsim.calibrate.costmodel.Work 5a4166d0e8e0\n"
    "bind:batchsim.calibrate.costmodel._denominator 1c84ed0fa707\n"
    "bind:batchsim.calibrate.costmodel._make_step_cost 7f1c9af14073\n"
    "bind:batchsim.calibrate.costmodel._ones a9f6597664e4\n"
    "bind:batchsim.calibrate.costmodel._step_cost d448d854ffcc\n"
    "bind:batchsim.calibrate.costmodel.check_dtype 539ffc231ad5\n"
    "bind:batchsim.calibrate.curves.ClassEfficiency f477450b2d38\n"
    "bind:batchsim.calibrate.curves.Curve 93cb5aa2e9b4\n"
    "bind:batchsim.calibrate.curves.Efficiency 908e3d630e32\n"
    "bind:batchsim.calibrate.work.InputError c37b31e3db20\n"
    "bind:batchsim.calibrate.work.ModelSpec 48c04dc40650\n"
    "bind:batchsim.calibrate.work.ShardShape ab997dfcdd2a\n"
    "bind:batchsim.calibrate.work.Work 5a4166d0e8e0\n"
    "bind:batchsim.policies.base.KVView 1e1bf10339c8\n"
    "bind:batchsim.policies.base.PolicyBase cc691b0f4229\n"
    "bind:batchsim.policies.base.PolicyConfig 0fe50ffab79a\n"
    "bind:batchsim.policies.base.SeqView 024e7eaf38aa\n"
    "bind:batchsim.policies.base.blocks_for 40d24bc64791\n"
    "bind:batchsim.policies.base.held_blocks 9286315e6093\n"
    "bind:batchsim.policies.ordering.SeqView 024e7eaf38aa\n"
    "bind:batchsim.policies.ordering.fcfs 21c6dda4f8ef\n"
    "bind:batchsim.policies.ordering.fewest_decoded f2e5ad1f6d46\n"
    "bind:batchsim.policies.ordering.last_admitted fa5bcbf237ff\n"
    "bind:batchsim.policies.ordering.shortest_prompt_first 0d1bf77b7709\n"
    "bind:batchsim.policies.padded.BatchPlan 3c1194a5cf8f\n"
    "bind:batchsim.policies.padded.KVView 1e1bf10339c8\n"
    "bind:batchsim.policies.padded.PaddedBatchConfig 592570437ebe\n"
    "bind:batchsim.policies.padded.PaddedRecipe 672df04bd32b\n"
    "bind:batchsim.policies.padded.PolicyConfig 0fe50ffab79a\n"
    "bind:batchsim.policies.padded.ReplicaView 0e32e5ca79c7\n"
    "bind:batchsim.policies.padded.SeqView 024e7eaf38aa\n"
    "bind:batchsim.policies.padded._decode f379c8cc6861\n"
    "bind:batchsim.policies.padded._launch 0ce6e3fb2ffc\n"
    "bind:batchsim.policies.padded.fit_prefix 20cc5d921a90\n"
    "bind:batchsim.policies.padded.held_blocks 9286315e6093\n"
    "bind:batchsim.policies.padded.launch_size a604d059b6ac\n"
    "bind:batchsim.policies.padded.reserve_tokens 449b52e4333c\n"
    "bind:batchsim.policies.padded.run_padded 7167052d01fe\n"
    "bind:batchsim.policies.recipe.CudaGraphs cbbadf10314e\n"
    "bind:batchsim.policies.recipe.IterationRecipe cdc568c1fb14\n"
    "bind:batchsim.policies.recipe.Move 090ac9ed9e53\n"
    "bind:batchsim.policies.recipe.PaddedRecipe 672df04bd32b\n"
    "bind:batchsim.policies.recipe._one_of b6c870d3d92f\n"
    "bind:batchsim.policies.recipe._positive_int 94d7f62a1fb9\n"
    "bind:batchsim.policies.recipe.check_capture_sizes c088c9466917\n"
    "bind:batchsim.policies.recipe.check_graphs_budget 8dd353ae094b\n"
    "bind:batchsim.policies.recipe.check_max_context 8942f4c68d02\n"
    "bind:batchsim.policies.recipe.check_max_padding 3b7ad32f871a\n"
    "bind:batchsim.policies.rules.BatchPlan 3c1194a5cf8f\n"
    "bind:batchsim.policies.rules.IterationRecipe cdc568c1fb14\n"
    "bind:batchsim.policies.rules.PaddedRecipe 672df04bd32b\n"
    "bind:batchsim.policies.rules.PolicyBase cc691b0f4229\n"
    "bind:batchsim.policies.rules.PolicyConfig 0fe50ffab79a\n"
    "bind:batchsim.policies.rules.RecipePolicy 9f1282d77621\n"
    "bind:batchsim.policies.rules.ReplicaView 0e32e5ca79c7\n"
    "bind:batchsim.policies.rules.interpret 0bfb91ec20df\n"
    "bind:batchsim.policies.rules.run_iteration 332338ad6440\n"
    "bind:batchsim.policies.rules.run_padded 7167052d01fe\n"
    "bind:batchsim.policies.step.BatchPlan 3c1194a5cf8f\n"
    "bind:batchsim.policies.step.CudaGraphs cbbadf10314e\n"
    "bind:batchsim.policies.step.CudaGraphsConfig b994e5ff7809\n"
    "bind:batchsim.policies.step.IterationConfig 72174a647d59\n"
    "bind:batchsim.policies.step.IterationRecipe cdc568c1fb14\n"
    "bind:batchsim.policies.step.Move 090ac9ed9e53\n"
    "bind:batchsim.policies.step.PolicyConfig 0fe50ffab79a\n"
    "bind:batchsim.policies.step.ReplicaView 0e32e5ca79c7\n"
    "bind:batchsim.policies.step.SeqView 024e7eaf38aa\n"
    "bind:batchsim.policies.step.StepBuilder 10395b3bd777\n"
    "bind:batchsim.policies.step._is_decode ab392c62ec92\n"
    "bind:batchsim.policies.step.check_capture_sizes c088c9466917\n"
    "bind:batchsim.policies.step.check_graphs_budget 8dd353ae094b\n"
    "bind:batchsim.policies.step.check_max_context 8942f4c68d02\n"
    "bind:batchsim.policies.step.check_max_padding 3b7ad32f871a\n"
    "bind:batchsim.policies.step.graph_tokens a165786380d8\n"
    "bind:batchsim.policies.step.held_blocks 9286315e6093\n"
    "bind:batchsim.policies.step.last_admitted fa5bcbf237ff\n"
    "bind:batchsim.policies.step.over_budget 45df49487b3f\n"
    "bind:batchsim.policies.step.over_watermark 084a1504860d\n"
    "bind:batchsim.policies.step.run_iteration 332338ad6440\n"
    "bind:batchsim.sim.engine.BatchPlan 3c1194a5cf8f\n"
    "bind:batchsim.sim.engine.Cluster 3137a4f96439\n"
    "bind:batchsim.sim.engine.CostModel a39cd6b306e4\n"
    "bind:batchsim.sim.engine.InServers bbb63a1c8ffe\n"
    "bind:batchsim.sim.engine.PagedKVCache 0748130da1c1\n"
    "bind:batchsim.sim.engine.Policy dedf5c5d2e21\n"
    "bind:batchsim.sim.engine.PolicyError 2e521b6d93b2\n"
    "bind:batchsim.sim.engine.Replica c2bbf5ca8b10\n"
    "bind:batchsim.sim.engine.Seq 98bfdc48bd10\n"
    "bind:batchsim.sim.engine.StepShape 5ae1a1c2ee95\n"
    "bind:batchsim.sim.engine.StepStream c32b645eefe5\n"
    "bind:batchsim.sim.engine.TokenSteps b606a180eea7\n"
    "bind:batchsim.sim.engine.Workload 0b6e6dc837fe\n"
    "bind:batchsim.sim.engine._View 5c88918de13b\n"
    "bind:batchsim.sim.engine.delivered_at 44af6fc830b7\n"
    "bind:batchsim.sim.engine.over_kv 1b1d49467bab\n"
    "bind:batchsim.sim.engine.queue_full 1144ca15bc74\n"
    "bind:batchsim.sim.engine.too_long 5561bfe3c984\n"
    "bind:batchsim.sim.frontend.InServers bbb63a1c8ffe\n"
    "bind:batchsim.sim.frontend.delivered_at 44af6fc830b7\n"
    "bind:batchsim.sim.frontend.engine_arrivals 3cf79822ad44\n"
    "bind:batchsim.sim.frontend.tokenized_at 7fc6e82ca0c8\n"
    "bind:batchsim.sim.kv.InputError c37b31e3db20\n"
    "bind:batchsim.sim.kv.KVExhausted b1114f48a8a0\n"
    "bind:batchsim.sim.kv.PagedKVCache 0748130da1c1\n"
    "bind:batchsim.sim.kv.blocks_for_tokens e6c915a27391\n"
    "bind:batchsim.sim.router.InputError c37b31e3db20\n"
    "bind:batchsim.sim.router._cache_aware 54f6b6097a54\n"
    "bind:batchsim.sim.router._least_kv 1f98cbdd0e32\n"
    "bind:batchsim.sim.router._least_outstanding c35769512374\n"
    "bind:batchsim.sim.router._load 6c99cc046ba9\n"
    "bind:batchsim.sim.router._power_of_two bfa930e5b1a9\n"
    "bind:batchsim.sim.router._round_robin 7e5ba5bac6a5\n"
    "bind:batchsim.sim.router.make_router e4317656a750\n"
    "bind:batchsim.sim.state.Seq 98bfdc48bd10\n"
    "bind:batchsim.sim.types.BatchPlan 3c1194a5cf8f\n"
    "bind:batchsim.sim.types.ClosedLoop 8c888cc5396d\n"
    "bind:batchsim.sim.types.OpCost 146c8641b9c5\n"
    "bind:batchsim.sim.types.StepCost eed8f0ab85f8\n"
    "bind:batchsim.sim.types.StepShape 5ae1a1c2ee95\n"
    "bind:batchsim.sim.types.Workload 0b6e6dc837fe\n"
    "const:batchsim.calibrate.costmodel.B_ACT d84bdb34d4ee\n"
    "const:batchsim.calibrate.costmodel.KV_DTYPES 91aa17c466e1\n"
    "const:batchsim.calibrate.costmodel.WEIGHT_DTYPES 1c59d451d149\n"
    "const:batchsim.calibrate.costmodel._CACHE_LIMIT 0f255ec16482\n"
    "const:batchsim.calibrate.work.B_ACT d84bdb34d4ee\n"
    "const:batchsim.policies.ordering.RETRACT_FIRST f71d36f9a9ca\n"
    "const:batchsim.policies.recipe.ADMISSIONS a1f2afd3ee9f\n"
    "const:batchsim.policies.recipe.GUARDS 47136d6471eb\n"
    "const:batchsim.policies.recipe.MAX_GRAPH_CONTEXT 2aae49a91708\n"
    "const:batchsim.policies.recipe.MAX_GRAPH_SIZES bfa0ec8bdf29\n"
    "const:batchsim.policies.recipe.MOVES dc7bfba81d3f\n"
    "const:batchsim.policies.recipe.ORDERS 28cfbea2e65d\n"
    "const:batchsim.policies.recipe.VICTIMS 3c08df52c6b9\n"
    "const:batchsim.policies.step.REMAINING_CLIP 8b926d75599a\n"
    "const:batchsim.policies.step.RETRACT_FIRST f71d36f9a9ca\n"
    "const:batchsim.sim.engine.COMPLETED a3b605a665d1\n"
    "const:batchsim.sim.engine.REJECTED d5feaf829c44\n"
    "const:batchsim.sim.router.CACHE_AWARE_ABS e29c9c180c62\n"
    "const:batchsim.sim.router.CACHE_AWARE_REL b05e244762b1\n"
    "const:batchsim.sim.state.COMPLETED a3b605a665d1\n"
    "const:batchsim.sim.state.REJECTED d5feaf829c44\n"
    "const:batchsim.sim.state.UNFINISHED b73f78205341\n"
    "entry:batchsim.policies.ordering.QUEUE_ORDERS[fcfs] 21c6dda4f8ef\n"
    "entry:batchsim.policies.ordering.QUEUE_ORDERS[shortest_prompt_first] 0d1bf77b7709\n"
    "entry:batchsim.policies.ordering.VICTIM_RULES[fewest_decoded] f2e5ad1f6d46\n"
    "entry:batchsim.policies.ordering.VICTIM_RULES[last_admitted] fa5bcbf237ff\n"
    "entry:batchsim.policies.step.QUEUE_ORDERS[fcfs] 21c6dda4f8ef\n"
    "entry:batchsim.policies.step.QUEUE_ORDERS[shortest_prompt_first] 0d1bf77b7709\n"
    "entry:batchsim.policies.step.VICTIM_RULES[fewest_decoded] f2e5ad1f6d46\n"
    "entry:batchsim.policies.step.VICTIM_RULES[last_admitted] fa5bcbf237ff\n"
    "entry:batchsim.sim.router.ROUTERS[cache_aware] 54f6b6097a54\n"
    "entry:batchsim.sim.router.ROUTERS[least_kv] 1f98cbdd0e32\n"
    "entry:batchsim.sim.router.ROUTERS[least_outstanding] c35769512374\n"
    "entry:batchsim.sim.router.ROUTERS[power_of_two] bfa930e5b1a9\n"
    "entry:batchsim.sim.router.ROUTERS[round_robin] 7e5ba5bac6a5\n"
    "file:batchsim.calibrate.costmodel cec3c58229c2\n"
    "file:batchsim.calibrate.curves 088d0215b6d7\n"
    "file:batchsim.calibrate.work 0e7711d20b35\n"
    "file:batchsim.policies.base 3ab778e584ef\n"
    "file:batchsim.policies.ordering 71898a807d46\n"
    "file:batchsim.policies.padded c5589f2000ce\n"
    "file:batchsim.policies.recipe 743ab410c5f1\n"
    "file:batchsim.policies.rules 1eb5a46266d9\n"
    "file:batchsim.policies.step 6faa50423993\n"
    "file:batchsim.sim.engine 55f303ade718\n"
    "file:batchsim.sim.frontend 63d99c48c977\n"
    "file:batchsim.sim.kv 6c2b0855f1e3\n"
    "file:batchsim.sim.router c8d4b350074a\n"
    "file:batchsim.sim.state 3d3da7e3b7af\n"
    "file:batchsim.sim.types 4e580928468f\n";
/* END RULES FINGERPRINT */

/* Which source this library was built from (batchsim/core/build.py source_key). */
#ifndef CORE_SOURCE_KEY
#define CORE_SOURCE_KEY "unknown"
#endif
const char *core_source_key(void) { return CORE_SOURCE_KEY; }

/* The rules this core implements (batchsim/core/rules.py compares them with the loaded Python). */
const char *core_rules(void) { return CORE_RULES; }

/* The dense totals the core computes itself (tests compare them with Python's). */
void core_dense(core_t *s, int64_t T, int64_t sampled, double *v) { dense_compute(s, T, sampled, v); }

int core_put_dense(core_t *s, int64_t T, int64_t sampled, const double *v) {
    if (2 * (s->dense_n + 1) > s->dense_cap && dense_grow(s)) return CORE_ERR_NOMEM;
    dense_t *d = dense_find(s, dense_key(T, sampled));
    if (d->key == -1) s->dense_n++;
    d->key = dense_key(T, sampled);
    memcpy(d->v, v, sizeof(double) * 7);
    dense_t *recent = dense_slot(s, T, sampled);
    if (recent->key == d->key) *recent = *d;  /* (a copy made before is not left stale) */
    return 0;
}

/* Run until done, a buffer needs flushing, or a dense entry is needed. */
int core_run(core_t *s) {
    int st;
    if (s->pending_rep >= 0) {
        int ri = s->pending_rep;
        s->pending_rep = -1;
        st = replica_loop(s, ri);
        if (st) return st;
    }
    while (n_events(s)) {
        for (int64_t i = 0; i < s->n_rep; i++) {
            replica_t *r = &s->reps[i];
            if (r->nsteps + 1 > s->step_cap || r->nt + 1 > s->gap_cap
                || r->nclosed + 2 * s->max_rows > s->gap_cap) return CORE_FLUSH;  /* (a row closes up to 2 runs a step) */
        }
        if (s->has_horizon && !(next_event(s)->t < s->horizon)) break;
        event_t e = heap_pop(s);
        s->now = e.t;
        if (e.kind == EV_ARRIVAL || e.kind == EV_STEP || e.kind == EV_IDLE_TIMEOUT)
            s->now_is_int = 0;  /* now + a float delay */
        switch (e.kind) {
        case EV_INIT_REPLICA:
            st = replica_loop(s, e.rep);
            break;
        case EV_INIT_ARRIVALS:
        case EV_ARRIVAL:
            if (e.kind == EV_ARRIVAL) deliver(s, s->next_rid++);
            arrivals(s);
            st = 0;
            break;
        case EV_STEP:
            st = step_done(s, e.rep);
            break;
        case EV_WAKE:
        case EV_IDLE_TIMEOUT: {
            /* AnyOf's check: the first of its events makes the condition succeed (scheduled now);
             * the process resumes when that is processed. An event of an earlier idle spell, or
             * one after the condition succeeded, changes nothing. */
            replica_t *r = &s->reps[e.rep];
            if (r->phase == PH_IDLE && !r->cond_triggered && e.gen == r->idle_gen) {
                r->cond_triggered = 1;
                schedule(s, s->now, NORMAL, EV_COND, e.rep);
            }
            st = 0;
            break;
        }
        case EV_COND:
            s->reps[e.rep].phase = PH_SCHEDULE;
            st = replica_loop(s, e.rep);
            break;
        default:
            st = CORE_ERR_INTERNAL;
        }
        if (st) return st;
        if (s->nomem) return CORE_ERR_NOMEM;
    }
    if (s->has_horizon) s->now = s->horizon;
    return CORE_DONE;
}

/* Scalars Python reads back: [now, steps, need_T, need_s, delivered], then per
 * replica [nsteps, token steps, peak, closed runs]. */
void core_info(core_t *s, double *out) {
    out[0] = s->now;
    out[1] = (double)s->steps_total;
    out[2] = (double)s->need_T;
    out[3] = (double)s->need_s;
    out[4] = (double)s->next_rid;
    for (int64_t i = 0; i < s->n_rep; i++) {
        replica_t *r = &s->reps[i];
        out[5 + 4 * i + 0] = (double)r->nsteps;
        out[5 + 4 * i + 1] = (double)r->nt;
        out[5 + 4 * i + 2] = (double)r->peak;
        out[5 + 4 * i + 3] = (double)r->nclosed;
    }
}

/* Unfinished requests queued or running on some replica (a padded batch also holds finished ones). */
int64_t core_held(core_t *s) {
    int64_t held = 0;
    for (int64_t i = 0; i < s->n_rep; i++) {
        replica_t *r = &s->reps[i];
        for (int64_t j = 0; j < r->wlen; j++) held += s->status[wq_at(r, j)] == ST_UNFINISHED;
        for (int64_t j = 0; j < r->nrun; j++) held += s->status[r->run[j]] == ST_UNFINISHED;
    }
    return held;
}

/* Per replica, the first token step an open run began at (its token steps so far when none is
 * open): every run that covers an earlier step gap is closed, and handed over (batchsim/sim/itl.py
 * ItlAhead). Open runs are of unfinished requests, running or waiting (preempted); a rejected
 * request's run, left open, is not counted (a run with one makes ItlAhead's pieces unusable). */
void core_frontier(core_t *s, int64_t *out) {
    for (int64_t i = 0; i < s->n_rep; i++) {
        replica_t *r = &s->reps[i];
        int64_t f = r->kt;
        for (int64_t j = 0; j < r->nrun; j++) {
            int64_t rid = r->run[j];
            if (s->run_rep[rid] >= 0 && s->run_start[rid] < f) f = s->run_start[rid];
        }
        for (int64_t j = 0, found = 0; j < r->wlen && found < r->wait_open; j++) {
            int64_t rid = wq_at(r, j);  /* (preempted requests wait at the queue's front) */
            if (s->run_rep[rid] >= 0) {
                found++;
                if (s->run_start[rid] < f) f = s->run_start[rid];
            }
        }
        out[i] = f;
    }
}

void core_flushed(core_t *s) {
    for (int64_t i = 0; i < s->n_rep; i++) {
        s->reps[i].nsteps = 0;
        s->reps[i].nt = 0;
        s->reps[i].nclosed = 0;
    }
}

/* A block of step records as columns: dst[c * dst_stride + r] = src[r * cols + c] for r < rows
 * (8-byte values: the doubles of sf or the int64s of si), a few rows at a time so that reads and
 * writes both stay in cache. Python reads the columns (batchsim/core/__init__.py _flush). */
void core_columns(const int64_t *src, int64_t *dst, int64_t rows, int64_t cols, int64_t dst_stride) {
    enum { BLOCK = 64 };
    for (int64_t r0 = 0; r0 < rows; r0 += BLOCK) {
        int64_t r1 = r0 + BLOCK < rows ? r0 + BLOCK : rows;
        for (int64_t c = 0; c < cols; c++) {
            int64_t *to = dst + c * dst_stride;
            for (int64_t r = r0; r < r1; r++) to[r] = src[r * cols + c];
        }
    }
}

/* A block of step records into the columns of their rows: dst[c] + offset (c < cols) gets field c
 * of rows 0..rows-1, as int32 where width[c] is 4 (an int64 cast as numpy casts it, C's
 * conversion) and as the 8 bytes themselves otherwise, a few rows at a time (core_columns). The
 * step stream's own arrays (batchsim/sim/records.py Columns.reserve): no copy in between. */
void core_columns_to(const int64_t *src, int64_t rows, int64_t cols, const int64_t *dst, const int64_t *width,
                     int64_t offset) {
    enum { BLOCK = 64 };
    for (int64_t r0 = 0; r0 < rows; r0 += BLOCK) {
        int64_t r1 = r0 + BLOCK < rows ? r0 + BLOCK : rows;
        for (int64_t c = 0; c < cols; c++) {
            if (width[c] == 4) {
                int32_t *to = (int32_t *)(intptr_t)dst[c] + offset;
                for (int64_t r = r0; r < r1; r++) to[r] = (int32_t)src[r * cols + c];
            } else {
                int64_t *to = (int64_t *)(intptr_t)dst[c] + offset;
                for (int64_t r = r0; r < r1; r++) to[r] = src[r * cols + c];
            }
        }
    }
}
