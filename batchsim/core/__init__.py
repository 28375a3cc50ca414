"""The compiled core: batchsim/core/_core.c, built with the package and driven through ctypes.

The SimPy engine (batchsim.sim.engine) runs any policy, router, cost model and KV
cache, and is the reference. For a policy whose rules are a recipe
(batchsim/policies/recipe.py: the four built-ins, or any ``RecipePolicy``) without a
prefix cache, any built-in router and the roofline cost model,
``batchsim/core/_core.c`` interprets the same recipe with the same step-by-step
semantics in C, 10-40x faster (docs/performance.md). Its records are
byte-identical to the SimPy engine's (tests/test_core.py compares whole
runs); around the run (workload, cost model set-up, the power_of_two
router's draws, MoE models' dense costs, record sinks, summary) Python does
the rest.

The core runs a scenario only when it can show it runs the same rules
(:func:`unsupported`): the policy's ``schedule`` is the shipped recipe
interpreter, its recipe uses only moves, guards, orders and victim rules the
core knows, and the loaded rules (batchsim.core.rules: interpreter, engine, KV,
routers, cost model, monkeypatches included) match the fingerprint the core
was written for. Which engine runs: ``Scenario.engine`` (``auto``: the core
when it can, else the SimPy engine, with the reason in the summary;
``python``; ``core``: fail with the reason when it cannot).

Where the library comes from (:func:`library`): the one built with the
package (setup.py: ``batchsim/core/_native*.so`` in a wheel or an editable
install), if it was built from this ``_core.c``; else, in a checkout whose
C source changed since, the user's own cache (``$BATCHSIM_CACHE``, default
``~/.cache/batchsim``), compiled there once per source with ``$CC`` and
checked to be the user's and private before it is loaded; never a shared
temporary folder. Flags (batchsim/core/build.py) include
``-ffp-contract=off``, so the compiler never fuses a multiply and an add
(results must round exactly as Python's).
"""

from __future__ import annotations

import ctypes
import os
import queue
import platform
import stat
import sys
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Callable
from pathlib import Path

import numpy as np

from batchsim.sim.handover import Handover
from batchsim.core.build import GCC_FLAGS, source_key
from batchsim.sim.protocols import PolicyError
from batchsim.sim.records import REQUEST_COLUMNS, add_latencies, empty_requests
from batchsim.sim.table import Table
from batchsim.sim.itl import ItlAhead, ItlRecords, Packed, Times
from batchsim.sim.state import COMPLETED, REJECTED, UNFINISHED

__all__ = ["CoreRun", "unsupported", "run_core", "library", "library_error", "library_path", "packaged_libraries"]

_SOURCE = Path(__file__).with_name("_core.c")

_DONE, _FLUSH, _NEED_DENSE = 0, 1, 2
_ERR_ADMIN, _ERR_INTERNAL, _ERR_NOMEM, _ERR_IDLE = -1, -2, -3, -4
_MOVES = {"decodes": 0, "partial_prefills": 1, "admit": 2, "admit_chunks": 3}
_UNLESS = {"rows": 1, "preempted": 2, "stalled": 4}
_ORDERS = {"fcfs": 0, "shortest_prompt_first": 1}
_VICTIMS = {"last_admitted": 0, "fewest_decoded": 1}
_ADMISSIONS = {"step": 0, "sequence": 1, "completion": 2, "remaining": 3}
_MAX_MOVES, _MAX_PREF = 16, 64
_MAX_GRAPH = 2048  # core_recipe_t's capture-size arrays (batchsim.policies.recipe.MAX_GRAPH_SIZES)


class CoreRecipe(ctypes.Structure):
    """A policy's recipe as the core reads it (``core_recipe_t`` in batchsim/core/_core.c)."""

    _fields_ = [("padded", ctypes.c_int64), ("n_moves", ctypes.c_int64),
                ("move_kind", ctypes.c_int64 * _MAX_MOVES), ("move_unless", ctypes.c_int64 * _MAX_MOVES),
                ("order", ctypes.c_int64), ("victim", ctypes.c_int64), ("max_num_seqs", ctypes.c_int64),
                ("max_num_batched_tokens", ctypes.c_int64), ("n_pref", ctypes.c_int64),
                ("pref", ctypes.c_int64 * _MAX_PREF), ("max_queue_delay_s", ctypes.c_double),
                ("batch_end", ctypes.c_int64), ("admission", ctypes.c_int64), ("watermark", ctypes.c_double),
                ("schedule_ahead", ctypes.c_int64), ("n_gdec", ctypes.c_int64), ("n_gstep", ctypes.c_int64),
                ("gdec", ctypes.c_int64 * _MAX_GRAPH), ("gstep", ctypes.c_int64 * _MAX_GRAPH),
                ("g_max_pad", ctypes.c_double), ("g_max_ctx", ctypes.c_int64)]
_ROUTERS = {"round_robin": 0, "least_outstanding": 1, "least_kv": 2, "power_of_two": 3}
_STATUS = (UNFINISHED, COMPLETED, REJECTED)  # by the core's status codes
_COMPLETED, _REJECTED = 1, 2


def _rep_info(i: int) -> int:
    """Where replica ``i``'s scalars start in core_info's output: [nsteps, token steps, KV peak,
    closed runs]."""
    return 5 + 4 * i
_STEP_CAP = 16384  # step records per replica handed over at a time (fewer with many replicas)
_GAP_CAP = 1 << 17  # token steps and closed runs per replica likewise (at least twice a step's rows)
_PACK_MIN = 4096  # token-step times of a block packed as it arrives (fewer: packed at the end)
_SETS, _SETS_BYTES = 16, 64 << 20  # sets of record buffers the core fills in turn (run_core), and their most bytes

_lib: ctypes.CDLL | None = None
_lib_path: Path | None = None  # where the loaded library came from
_active: tuple | None = None  # (library, state, arrays) of the run in progress (see progress)
_lib_error: str | None = None
_loaded = False


def _cache_dir() -> Path:
    """``$BATCHSIM_CACHE``, else ``$XDG_CACHE_HOME/batchsim``, else ``~/.cache/batchsim``
    (a relative XDG_CACHE_HOME is ignored, as the XDG spec says)."""
    env = os.environ.get("BATCHSIM_CACHE")
    if env:
        return Path(env).absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "batchsim"


def packaged_libraries() -> list[Path]:
    """The core built with the package (setup.py), next to this file."""
    here = Path(__file__).parent
    return [p for p in (here / "_native.so", here / "_native.dll") if p.exists()]


_UID = os.getuid() if hasattr(os, "getuid") else None


def _mine(st) -> bool:
    return _UID is None or st.st_uid == _UID


def _unsafe_path(folder: Path) -> str | None:
    """Why ``folder`` is not a safe place for the user's libraries (None when it is).

    The folder must be the user's, a real folder (not a symlink) and writable by nobody
    else; every folder above it must be writable only by its owner or be sticky (like
    /tmp), and every symlink on the way must be the user's or root's, so that no other
    local user can swap in a folder of their own between the check and the load.
    """
    try:
        st = os.lstat(folder)
    except OSError as exc:
        return f"cache folder {folder}: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"cache folder {folder} is not a folder of its own (a symlink or a file)"
    if not _mine(st):
        return f"cache folder {folder} belongs to uid {st.st_uid}, not to this user ({_UID})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"cache folder {folder} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    for parent in folder.parents:
        try:
            pst = os.lstat(parent)
        except OSError as exc:
            return f"{parent}: {exc.strerror or exc}"
        if stat.S_ISLNK(pst.st_mode) and not (_mine(pst) or pst.st_uid == 0):
            return f"{parent} (above the cache folder) is a symlink of uid {pst.st_uid}"
        if (stat.S_ISDIR(pst.st_mode) and pst.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
                and not pst.st_mode & stat.S_ISVTX):
            return f"{parent} (above the cache folder) is writable by others and not sticky"
    return None


def _user_cache(key: str) -> Path:
    """The core built from this checkout's source into the user's own cache (created private,
    checked before every load), compiling it with ``$CC`` when it is not there yet."""
    d = _cache_dir()
    try:
        d.mkdir(parents=True, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise RuntimeError(f"cannot create the cache folder {d}: {exc.strerror or exc}") from None
    why = _unsafe_path(d)
    if why:
        raise RuntimeError(why)
    # (per machine and OS: a home folder shared by an x86 and an arm machine keeps both)
    lib = d / f"core-{key}-{platform.machine() or 'any'}-{sys.platform}.so"
    if os.path.lexists(lib):
        return lib
    cc = os.environ.get("CC", "cc")
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=d)
    os.close(fd)
    try:
        try:
            proc = subprocess.run([cc, *GCC_FLAGS, "-shared", f'-DCORE_SOURCE_KEY="{key}"', "-o", tmp,
                                   str(_SOURCE), "-lm"], capture_output=True, text=True, timeout=120)
        except OSError as exc:
            raise RuntimeError(f"C compiler {cc!r} not runnable: {exc}") from None
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed (exit status {proc.returncode}): "
                               f"{proc.stderr.strip()[:500] or 'no output'}")
        os.chmod(tmp, 0o700)
        os.replace(tmp, lib)  # atomic: concurrent builds of the same source agree
        return lib
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load_private(path: Path):
    """Load a library of the user's cache without following a symlink to it, checking the very
    file that is loaded (on Linux through /proc/self/fd, so nothing can swap it in between)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise RuntimeError(f"library {path}: {exc.strerror or exc} (a symlink is not loaded)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RuntimeError(f"library {path} is not a regular file")
        if not _mine(st):
            raise RuntimeError(f"library {path} belongs to uid {st.st_uid}, not to this user ({_UID})")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise RuntimeError(f"library {path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})")
        via = f"/proc/self/fd/{fd}"
        return ctypes.CDLL(via if os.path.exists(via) else str(path))
    finally:
        os.close(fd)


def _open(path: Path, key: str, private: bool = False) -> ctypes.CDLL | str:
    """The library at ``path`` if it was built from this source, else why not (``private``:
    a library of the user's cache, loaded by :func:`_load_private`)."""
    try:
        lib = _load_private(path) if private else ctypes.CDLL(str(path))
    except OSError as exc:
        return f"{path} does not load: {exc}"
    try:
        fn = lib.core_source_key
    except AttributeError:
        return f"{path} is not a batchsim core"
    fn.restype, fn.argtypes = ctypes.c_char_p, []
    built = fn().decode()
    return lib if built == key else f"{path} was built from another source ({built}, this one is {key})"


def library() -> ctypes.CDLL | None:
    """The compiled core (None, see :func:`library_error`, when there is none to use).

    Loaded from inside the installed package (built with it: setup.py), or,
    in a checkout whose ``_core.c`` changed since it was built, from the
    user's own cache (built there with ``$CC``, its folder and file checked
    to be the user's and private). Never from a shared temporary folder.
    """
    global _lib, _lib_error, _loaded, _lib_path
    if _loaded:
        return _lib
    _loaded = True
    key = source_key(_SOURCE.read_bytes())
    notes = []
    lib = None
    for path in packaged_libraries():
        got = _open(path, key)
        if isinstance(got, str):
            notes.append(got)
        else:
            lib, _lib_path = got, path
            break
    if lib is None:
        if not packaged_libraries():
            notes.append("the package was installed without its compiled core")
        try:
            path = _user_cache(key)
            got = _open(path, key, private=True)
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            got = str(exc) or type(exc).__name__
        if isinstance(got, str):
            _lib_error = "; ".join(notes + [got])
            return None
        lib, _lib_path = got, path
    vp = ctypes.c_void_p
    lib.core_new.restype = vp
    lib.core_new.argtypes = [vp] * 15
    lib.core_rules.restype = ctypes.c_char_p
    lib.core_rules.argtypes = []
    lib.core_run.restype = ctypes.c_int
    lib.core_run.argtypes = [vp]
    lib.core_put_dense.restype = ctypes.c_int
    lib.core_put_dense.argtypes = [vp, ctypes.c_int64, ctypes.c_int64, vp]
    lib.core_info.restype = None
    lib.core_info.argtypes = [vp, vp]
    lib.core_dense.restype = None
    lib.core_dense.argtypes = [vp, ctypes.c_int64, ctypes.c_int64, vp]
    lib.core_held.restype = ctypes.c_int64
    lib.core_held.argtypes = [vp]
    lib.core_flushed.restype = None
    lib.core_flushed.argtypes = [vp]
    lib.core_frontier.restype = None
    lib.core_frontier.argtypes = [vp, vp]
    lib.core_buffers.restype = None
    lib.core_buffers.argtypes = [vp] * 6
    lib.core_columns.restype = None
    lib.core_columns.argtypes = [vp, vp, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    lib.core_columns_to.restype = None
    lib.core_columns_to.argtypes = [vp, ctypes.c_int64, ctypes.c_int64, vp, vp, ctypes.c_int64]
    lib.core_free.restype = None
    lib.core_free.argtypes = [vp]
    _lib = lib
    return lib


def library_path() -> Path | None:
    """Where the loaded core came from (after :func:`library` returned one)."""
    return _lib_path


def library_error() -> str | None:
    """Why :func:`library` returned None (after it was called)."""
    return _lib_error


_BIG = 1 << 40  # integer knobs the core takes
_TOKENS = 1 << 20  # tokens per request (prompt + output) and rows per step the core takes


def recipe_struct(recipe) -> CoreRecipe | str:
    """The recipe as the core reads it, or why the core cannot interpret it."""
    from batchsim.policies.recipe import IterationRecipe, PaddedRecipe

    rc = CoreRecipe()
    if isinstance(recipe, PaddedRecipe):
        if len(recipe.preferred_batch_sizes) > _MAX_PREF:
            return f"more than {_MAX_PREF} preferred batch sizes"
        rc.padded, rc.max_num_seqs, rc.n_pref = 1, recipe.max_batch_size, len(recipe.preferred_batch_sizes)
        for i, b in enumerate(recipe.preferred_batch_sizes):
            rc.pref[i] = b
        rc.max_queue_delay_s = float(recipe.max_queue_delay_s)
        rc.batch_end = int(recipe.complete_at == "batch_end")
        return rc
    if not isinstance(recipe, IterationRecipe):
        return f"a recipe of type {type(recipe).__name__} (the core reads IterationRecipe and PaddedRecipe)"
    if len(recipe.moves) > _MAX_MOVES:
        return f"a recipe of {len(recipe.moves)} moves (the core takes {_MAX_MOVES})"
    for i, move in enumerate(recipe.moves):
        unknown = [g for g in move.unless if g not in _UNLESS]
        if move.kind not in _MOVES or unknown:
            return f"recipe move {move!r} (the core knows {', '.join(_MOVES)} unless {', '.join(_UNLESS)})"
        rc.move_kind[i] = _MOVES[move.kind]
        rc.move_unless[i] = sum({_UNLESS[g] for g in move.unless})
    if recipe.order not in _ORDERS:
        return f"queue order {recipe.order!r} (the core runs {', '.join(_ORDERS)})"
    if recipe.victim not in _VICTIMS:
        return f"victim rule {recipe.victim!r} (the core runs {', '.join(_VICTIMS)})"
    if recipe.admission not in _ADMISSIONS:
        return f"admission rule {recipe.admission!r} (the core runs {', '.join(_ADMISSIONS)})"
    rc.n_moves, rc.order, rc.victim = len(recipe.moves), _ORDERS[recipe.order], _VICTIMS[recipe.victim]
    rc.admission = _ADMISSIONS[recipe.admission]
    rc.watermark = float(recipe.watermark)
    rc.schedule_ahead = int(recipe.schedule_ahead)
    g = recipe.cuda_graphs
    if g is not None:
        if max(len(g.decode_sizes), len(g.step_sizes)) > _MAX_GRAPH:
            return f"more than {_MAX_GRAPH} CUDA-graph capture sizes"
        rc.n_gdec, rc.n_gstep = len(g.decode_sizes), len(g.step_sizes)
        for i, v in enumerate(g.decode_sizes):
            rc.gdec[i] = v
        for i, v in enumerate(g.step_sizes):
            rc.gstep[i] = v
        rc.g_max_pad, rc.g_max_ctx = float(g.step_max_padding), g.decode_max_context
    rc.max_num_seqs, rc.max_num_batched_tokens = recipe.max_num_seqs, recipe.max_num_batched_tokens
    return rc


def rules_differ() -> list[str]:
    """The rules (batchsim.core.rules names) whose loaded code differs from what the core implements
    (empty when they agree; call after :func:`library` returned a library)."""
    from batchsim.core import rules

    lib = library()
    if lib is None:  # pragma: no cover - callers check first
        return []
    return rules.differences(rules.parse_table(lib.core_rules().decode()))


def _recipe_of(policy) -> tuple[object | None, str | None]:
    """The policy's recipe when its ``schedule`` is the shipped interpreter, else why not."""
    from batchsim.policies.rules import RecipePolicy

    name = getattr(policy, "name", type(policy).__name__)
    if not isinstance(policy, RecipePolicy):
        return None, f"policy {name!r} is not a recipe policy (its own schedule runs on the SimPy engine)"
    if type(policy).schedule is not RecipePolicy.schedule or "schedule" in vars(policy):
        return None, f"policy {name!r} overrides schedule (its own rules run on the SimPy engine)"
    if any("recipe" in vars(c) for c in type(policy).__mro__) or "recipe" not in vars(policy):
        return None, f"policy {name!r} computes its recipe as it runs (the core reads it once)"
    return policy.recipe, None


def unsupported(policy, cost, router: str, replica_factory, kv_type, workload=None,
                max_queue_len: int | None = None, others=()) -> str | None:
    """Why the compiled core cannot run this scenario, or None when it can (with the same rules).
    ``others``: the other replicas' policies (the core runs one recipe on every replica)."""
    from batchsim.calibrate.costmodel import RooflineCostModel
    from batchsim.sim.engine import Replica
    from batchsim.sim.kv import PagedKVCache

    if replica_factory is not Replica:
        return "a custom replica (the reference executor times real steps)"
    if workload is not None and getattr(workload, "closed", None) is not None:
        return "a closed-loop workload (its arrivals come from completions; the core replays fixed arrival times)"
    recipe, why = _recipe_of(policy)
    if why is not None:
        return why
    if any(type(p) is not type(policy) or _recipe_of(p) != (recipe, None) for p in others):
        return "replicas whose policies or recipes differ (the core runs one recipe on every replica)"
    rc = recipe_struct(recipe)
    if isinstance(rc, str):
        return rc
    cfg = policy.config
    if getattr(cfg, "enable_prefix_caching", False) or kv_type is not PagedKVCache:
        return "a prefix cache"
    knobs = {k: getattr(recipe, k, None) for k in ("max_num_seqs", "max_num_batched_tokens", "max_batch_size")}
    knobs.update(block_size=getattr(cfg, "block_size", None), max_model_len=getattr(cfg, "max_model_len", None),
                 max_queue_len=max_queue_len)
    for k, v in knobs.items():
        if v is not None and v >= _BIG:
            return f"{k} {v} (the core takes integers below 2^40)"
    if workload is not None and len(workload):
        # NOTE: the row sums Python keeps as unbounded integers (sum of q*q, q*kv) must fit int64:
        # with requests below 2^20 tokens and below 2^20 rows a step, they stay below 2^61
        if int(workload.prompt_tokens.min()) < 1:
            return "a request with an empty prompt"
        top = int((workload.prompt_tokens + workload.output_tokens).max())
        if top >= _TOKENS:
            return f"a request of {top} tokens (the core takes fewer than 2^20)"
        rows = min(len(workload), rc.max_num_seqs)
        if rows >= _TOKENS:
            return f"{rows} sequences a step (the core takes fewer than 2^20)"
    if router not in _ROUTERS:
        return f"router {router!r} (the core runs {', '.join(_ROUTERS)})"
    if type(cost) is not RooflineCostModel or cost.pricing_table() is None:
        return "a cost model other than the roofline model's fast path"
    return None


def rules_mismatch() -> str | None:
    """Why the core's rules are not the loaded ones (None when they agree)."""
    diff = rules_differ()
    if not diff:
        return None
    shown = ", ".join(diff[:3]) + (f" and {len(diff) - 3} more" if len(diff) > 3 else "")
    return (f"the loaded rules differ from those the compiled core implements ({shown}): "
            "edited or monkeypatched code runs on the SimPy engine")


class CoreCurve(ctypes.Structure):
    """batchsim.calibrate.pricing.CurveTable (``core_curve_t``)."""

    _fields_ = [("n", ctypes.c_int64), ("lo", ctypes.c_double), ("hi", ctypes.c_double),
                ("ylo", ctypes.c_double), ("yhi", ctypes.c_double), ("lx", ctypes.c_void_p),
                ("y", ctypes.c_void_p), ("slope", ctypes.c_void_p)]


class CoreOp(ctypes.Structure):
    """batchsim.calibrate.pricing.OperatorTable (``core_op_t``)."""

    _fields_ = [("comp", CoreCurve), ("mem", CoreCurve), ("has_range", ctypes.c_int64),
                ("range", ctypes.c_double * 4), ("peak", ctypes.c_double), ("kernels", ctypes.c_int64)]


# The dense operators the core prices itself, in batchsim.calibrate.work.ShardShape.dense's order then the LM head.
_DENSE_OPS = ("embedding", "norms", "qkv_proj", "rotary", "kv_cache_write", "o_proj", "mlp_up", "mlp_act",
              "mlp_down", "lm_head")


class CoreCost(ctypes.Structure):
    """batchsim.calibrate.pricing.PricingTable and its DenseTable (``core_cost_t``)."""

    _fields_ = ([(k, ctypes.c_int64) for k in ("layers", "heads", "head_dim", "tp")]
                + [(k, ctypes.c_double) for k in ("kv_elt", "qo", "peak", "bw", "attn_launch", "host_step",
                                                  "host_seq", "host_decode_step")]
                + [("prefill", CoreOp), ("decode", CoreOp), ("dense_in_c", ctypes.c_int64)]
                + [(k, ctypes.c_int64) for k in ("hidden", "q_heads", "kv_heads", "qkv_width", "rot_width",
                                                 "vocab", "mlp_width", "up_width")]
                + [(k, ctypes.c_double) for k in ("b_w", "b_kv", "launch", "link_lat", "link_bw")]
                + [("ops", CoreOp * len(_DENSE_OPS))])


class CoreParams(ctypes.Structure):
    """One run's settings (``core_params_t``)."""

    _fields_ = ([(k, ctypes.c_int64) for k in ("n_req", "n_rep", "block_size", "max_model_len", "max_queue_len",
                                              "router", "has_horizon", "step_cap", "gap_cap")]
                + [("horizon", ctypes.c_double), ("has_frontend", ctypes.c_int64), ("out_step", ctypes.c_double),
                   ("out_token", ctypes.c_double)])


def _fill_curve(c: CoreCurve, t, keep: list) -> None:
    arrays = [np.array(v, dtype=np.float64) for v in (t.log_x, t.log_y, t.slope if t.slope else (0.0,))]
    keep += arrays
    c.n, c.lo, c.hi, c.ylo, c.yhi = len(t.log_x), t.lo, t.hi, t.y_lo, t.y_hi
    c.lx, c.y, c.slope = (a.ctypes.data for a in arrays)


def _fill_op(o: CoreOp, t, keep: list) -> None:
    _fill_curve(o.comp, t.compute, keep)
    _fill_curve(o.mem, t.memory, keep)
    o.has_range = int(t.measured is not None)
    for i, v in enumerate(t.measured or (0.0, 0.0, 0.0, 0.0)):
        o.range[i] = float(v)
    o.peak, o.kernels = t.peak_flops, t.kernels


def _dense_in_c(dense) -> bool:
    """Whether the core prices these dense operators itself (the ten of a dense model, in its order)."""
    if dense is None:
        return False
    names = tuple("mlp_up" if o.name == "mlp_gate_up" else o.name for o in dense.operators)
    return names == _DENSE_OPS


def cost_struct(table, keep: list) -> CoreCost:
    """The cost model's pricing table as the core reads it; ``keep`` holds the curve arrays alive."""
    c = CoreCost()
    c.layers, c.heads, c.head_dim, c.tp = table.layers, table.q_heads, table.head_dim, table.tp
    c.kv_elt, c.qo, c.peak, c.bw = (table.kv_bytes_per_token_layer, table.qo_bytes_per_token_layer,
                                    table.attention_peak_flops, table.bandwidth)
    c.attn_launch, c.host_step, c.host_seq, c.host_decode_step = (table.attention_launch_s, table.host_step_s,
                                                                  table.host_seq_s, table.host_decode_step_s)
    _fill_op(c.prefill, table.prefill, keep)
    _fill_op(c.decode, table.decode, keep)
    d = table.dense
    c.dense_in_c = int(_dense_in_c(d))
    if c.dense_in_c:
        c.hidden, c.q_heads, c.kv_heads, c.qkv_width = d.hidden_size, d.q_heads, d.kv_heads, d.qkv_width
        c.rot_width, c.vocab, c.mlp_width, c.up_width = d.rotary_width, d.vocab, d.mlp_width, d.mlp_up_width
        c.b_w, c.b_kv, c.launch, c.link_lat, c.link_bw = (d.weight_bytes, d.kv_bytes, d.launch_s, d.link_latency_s,
                                                          d.link_bandwidth)
        for i, op in enumerate(d.operators):
            _fill_op(c.ops[i], op, keep)
    return c


@dataclass
class CoreRun:
    """What a core run leaves for the runner: the request records, the clock, KV peaks."""

    requests: Table
    itl: ItlRecords
    now: float
    kv_peak: list[int]
    steps: int
    held: int  # requests still queued or running on some replica at the end


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def run_core(workload, policy, cost, kv_blocks: list[int], block_size: int, max_model_len: int,
             router: str, horizon: float | None, max_queue_len: int | None, steps,
             router_rng: np.random.Generator | None = None, itl_ahead: ItlAhead | None = None) -> CoreRun:
    """Run the scenario in the compiled core, writing step records into ``steps`` exactly as the
    Python engine would; the run's gaps come back as ``CoreRun.itl`` (batchsim.sim.itl). ``router_rng`` is the router's
    generator (``power_of_two`` draws its pairs from it, as batchsim.sim.router does). ``itl_ahead``
    (one replica): the ITL summary's first pass, made as the blocks are read and kept with the gaps
    (batchsim.sim.itl.ItlAhead)."""
    lib = library()
    if lib is None:  # pragma: no cover - callers check first
        raise RuntimeError(f"the compiled core is unavailable: {_lib_error}")
    st, a = _start(lib, workload, policy, cost, kv_blocks, block_size, max_model_len, router, horizon, max_queue_len,
                   router_rng)
    try:  # (an interrupt before the run's own try lets go of the core's state too)
        reps = len(kv_blocks)
        info, dense, req_i, req_f = (a[k] for k in ("info", "dense", "req_i", "req_f"))
        first = tuple(a[k] for k in _BUFFERS)
        per_set = sum(b.nbytes for b in first)
        # NOTE: the core fills one set of record buffers after another while Python reads the filled
        # ones: with two, a block whose reading takes long (a timeline chunk every 2^18 steps, ~9 ms; a
        # piece of gaps every 2^20 token steps, ~23 ms; against ~2 ms of the core's per block) kept the
        # core waiting as long; a 1M static run's core thread ran 31 s of its 48 s. Up to _SETS sets
        # (as many as fit in _SETS_BYTES: two with many replicas, whose sets are large) let it run on.
        nsets = max(2, min(_SETS, _SETS_BYTES // max(per_set, 1)))
        sets = [first] + [tuple(np.empty_like(b) for b in first) for _ in range(nsets - 1)]
        cols = (np.empty(a["sf"].shape[:0:-1]), np.empty(a["si"].shape[:0:-1], dtype=np.int64))  # (field, step)
        if itl_ahead is not None and reps != 1:
            raise ValueError("itl_ahead takes a one-replica run")
        into = _Into(steps)
        times: list[list[np.ndarray]] = [[] for _ in range(reps)]
        closed: list[list[np.ndarray]] = [[] for _ in range(5)]

        def need_dense() -> None:  # (on the core's thread, whose call asked: the cost model's totals)
            lib.core_info(st, _ptr(dense_info))
            T, s = int(dense_info[2]), int(dense_info[3])
            dense[:] = [float(v) for v in cost.dense_totals(T, s)]
            if lib.core_put_dense(st, T, s, _ptr(dense)):
                raise MemoryError("the compiled core could not grow its cost table")

        dense_info = np.zeros_like(info)
        ahead = _CoreThread(lib, st, [tuple(_ptr(b) for b in bufs) for bufs in sets], reps, need_dense,
                            itl_ahead is not None)
    except BaseException:
        lib.core_free(st)
        raise
    global _active
    try:
        _active = (lib, st, a)  # (inside the try: the finally below always clears it)
        ahead.start()
        while True:
            status, cur, counts, frontier = ahead.get()
            if status == _ERR_ADMIN:
                raise PolicyError(f"{policy.name}: no step after 100000 plans")
            if status == _ERR_IDLE:
                raise PolicyError(f"{policy.name}: asked to idle until a time not after now")
            if status < 0:
                raise RuntimeError(f"the compiled core stopped with status {status} (an internal invariant broke)")
            _flush(lib, cols, counts, reps, *sets[cur], steps, times, closed, into)
            if itl_ahead is not None:
                new_t, new_c = int(counts[_rep_info(0) + 1]), int(counts[_rep_info(0) + 3])
                itl_ahead.feed(times[0][-1] if new_t else None, closed[2][-1] if new_c else None,
                               closed[3][-1] if new_c else None, int(frontier[0]))
            if hasattr(steps, "settle"):  # (every step still to come ends at or after the core's clock)
                steps.settle(float(counts[0]))
            if status == _DONE:
                break
            ahead.release(cur)
        ahead.close()
        lib.core_info(st, _ptr(info))
        held = int(lib.core_held(st))
    finally:
        # (first, by stores and one C call with nothing between them that checks for signals: the
        # thread is told to stop and woken, and no run is reported in progress. Then close() again
        # until it returns: an interrupt can land as it is entered, before its own retry loop, and
        # the core must not be freed under a thread still running it. One that lands at the retry
        # loop's back edge, outside its try, leaves the loop: then the thread still stops by
        # itself, within the core's call in flight, and the core is left unfreed, never freed
        # under it)
        ahead._h.stop = True
        _active = None
        ahead._free.put(None)
        pending = None
        while True:
            try:
                ahead.close()
                break
            except BaseException as e:
                pending = pending or e
        lib.core_free(st)
        if pending is not None:
            raise pending
    delivered = int(info[4])
    requests = _frame(workload, delivered, req_i, req_f, policy.recipe, max_model_len, kv_blocks, block_size, max_queue_len)
    kept = []
    for i in range(reps):  # (each replica's small blocks let go once packed: not all at once)
        kept.append(Times(times[i]))
        times[i] = []
    itl = ItlRecords.build(kept,
                           [np.concatenate(c) if c else np.zeros(0) for c in closed],
                           (req_i[7, :delivered], req_i[8, :delivered], req_i[9, :delivered], req_f[5, :delivered]))
    if itl_ahead is not None and not itl_ahead.failed:
        itl.ahead = itl_ahead
    return CoreRun(requests=requests, itl=itl, now=float(info[0]),
                   kv_peak=[int(info[_rep_info(i) + 2]) for i in range(reps)], steps=int(info[1]),
                   held=held)


def progress() -> dict | None:
    """How far the core run in progress got (for a benchmark's timeout report, e.g. from a signal
    handler), or None when no core run is in progress. The core may be running on its thread
    meanwhile: the figures are a snapshot of counters it is updating (each read whole; together
    they may be a step apart)."""
    if _active is None:
        return None
    lib, st, a = _active
    info = np.zeros_like(a["info"])
    lib.core_info(st, _ptr(info))
    arrived = int(info[4])
    return {"steps": int(info[1]), "arrived": arrived, "completed": int((a["req_i"][1, :arrived] == _COMPLETED).sum()),
            "sim_s": float(info[0])}


def dense_totals(cost, keys) -> np.ndarray | None:
    """The core's own ``RooflineCostModel._dense`` for each ``(tokens, sampled)`` in ``keys``
    (rows of 7), or None when the core leaves this model's dense operators to Python."""
    from batchsim.policies.continuous import ContinuousPolicy
    from batchsim.sim.types import Workload

    lib = library()
    if lib is None or not _dense_in_c(cost.pricing_table().dense):
        return None
    empty = Workload(arrival=np.zeros(0), prompt_tokens=np.zeros(0, dtype=np.int64),
                     output_tokens=np.zeros(0, dtype=np.int64))
    st, _keep = _start(lib, empty, ContinuousPolicy(), cost, [1], 16, 1, "round_robin", None, None)
    out = np.empty((len(keys), 7), dtype=np.float64)
    try:
        for i, (t, s) in enumerate(keys):
            lib.core_dense(st, int(t), int(s), _ptr(out[i]))
    finally:
        lib.core_free(st)
    return out


def _pairs(rng: np.random.Generator | None, replicas: int, workload, horizon: float | None) -> np.ndarray:
    """batchsim.sim.router's power_of_two draws, one pair per routed arrival, in arrival order: the draws
    do not depend on the replicas' state, so they can be made before the run (~10 us each)."""
    # (a row per request, drawn for those that can arrive before the horizon: the others are never routed)
    out = np.zeros((max(len(workload), 1), 2), dtype=np.int64)
    n = len(workload) if horizon is None else min(len(workload), int(np.searchsorted(workload.arrival, horizon,
                                                                                        "right")) + 1)
    if rng is not None and replicas > 1:
        choice = rng.choice
        for i in range(n):
            a, b = choice(replicas, size=2, replace=False)
            out[i, 0], out[i, 1] = int(a), int(b)
    return out


def _start(lib, workload, policy, cost, kv_blocks, block_size, max_model_len, router, horizon, max_queue_len,
           router_rng=None):
    """A new core state for this run, and the arrays it reads and writes (kept alive by the caller)."""
    recipe = recipe_struct(policy.recipe)
    if isinstance(recipe, str):  # pragma: no cover - unsupported() said so first
        raise RuntimeError(f"the compiled core cannot run this recipe: {recipe}")
    n, reps = len(workload), len(kv_blocks)
    pairs = _pairs(router_rng if router == "power_of_two" else None, reps, workload, horizon)
    rows = min(recipe.max_num_seqs, n)
    # NOTE: buffers shrink with many replicas (4096 replicas at full size would reserve ~19 GiB);
    # a block has at most one token step a step, and is handed over before its closed runs overflow
    step_cap = max(64, min(_STEP_CAP, (1 << 20) // reps))
    gap_cap = max(2 * rows + 16, min(_GAP_CAP, (1 << 21) // reps, step_cap + 2 * rows + 16))
    params = CoreParams(n_req=n, n_rep=reps, block_size=block_size, max_model_len=max_model_len,
                        max_queue_len=-1 if max_queue_len is None else max_queue_len, router=_ROUTERS[router],
                        has_horizon=int(horizon is not None), step_cap=step_cap, gap_cap=gap_cap,
                        horizon=0.0 if horizon is None else float(horizon))
    fe = getattr(cost, "frontend", None)
    if fe is not None:
        params.has_frontend, params.out_step, params.out_token = 1, fe[2], fe[3]
    keep: list = []
    costs = cost_struct(cost.pricing_table(), keep)
    arrival = np.ascontiguousarray(workload.arrival, dtype=np.float64)
    prompt = np.ascontiguousarray(workload.prompt_tokens, dtype=np.int64)
    output = np.ascontiguousarray(workload.output_tokens, dtype=np.int64)
    req_i = np.empty((10, max(n, 1)), dtype=np.int64)
    req_f = np.empty((6, max(n, 1)), dtype=np.float64)
    blocks = np.array(kv_blocks, dtype=np.int64)
    sf = np.empty((reps, step_cap, 9), dtype=np.float64)  # (a step's record in one place: _flush reads columns)
    si = np.empty((reps, step_cap, 11), dtype=np.int64)
    g_t = np.empty((reps, gap_cap), dtype=np.float64)
    g_run = np.empty((reps, 3, gap_cap), dtype=np.int64)
    g_entry = np.empty((reps, gap_cap), dtype=np.float64)
    info = np.zeros(_rep_info(reps), dtype=np.float64)
    dense = np.empty(7, dtype=np.float64)
    st = lib.core_new(ctypes.addressof(params), ctypes.addressof(recipe), ctypes.addressof(costs), _ptr(arrival),
                      _ptr(prompt), _ptr(output), _ptr(req_i), _ptr(req_f), _ptr(blocks), _ptr(sf), _ptr(si),
                      _ptr(g_t), _ptr(g_run), _ptr(g_entry), _ptr(pairs))
    if not st:
        raise MemoryError("the compiled core could not allocate its state")
    return st, {"params": params, "recipe": recipe, "costs": costs, "keep": keep, "pairs": pairs, "arrival": arrival,
                "prompt": prompt, "output": output,
                "req_i": req_i, "req_f": req_f, "blocks": blocks, "sf": sf, "si": si, "g_t": g_t,
                "g_run": g_run, "g_entry": g_entry, "info": info, "dense": dense}


_BUFFERS = ("sf", "si", "g_t", "g_run", "g_entry")  # what the core writes as it runs (core_buffers)


class _CoreThread:
    """``core_run`` on a thread of its own, into one set of record buffers after another (``sets``:
    their addresses, as core_buffers takes them; the first is core_new's). At each hand-over it
    puts the set it filled, with copies of the core's counters then (core_info) and, when asked,
    its frontier (core_frontier), for :meth:`get`, and goes on into a set :meth:`release` freed,
    waiting while none is. It alone touches the core's state while it runs (Python reads only the
    sets handed over, in order), so nothing the core computes depends on the thread; a dense
    entry the core asks for is made on it (``need_dense``: the cost model's totals)."""

    def __init__(self, lib, st, sets: list, reps: int, need_dense: Callable[[], None], frontier: bool) -> None:
        self._lib, self._st, self._sets, self._reps = lib, st, sets, reps
        self._need_dense, self._want_frontier = need_dense, frontier
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(1, len(sets)):
            self._free.put(i)
        # (a SimpleQueue: its wait is in C and a signal interrupts it; a Queue's wait is Python's
        # Condition.wait, which an exception raised by a signal handler just after it let go of its
        # lock leaves to release it again: 'release unlocked lock' instead of the interrupt)
        self._filled: queue.SimpleQueue = queue.SimpleQueue()
        # (the thread's start and stop, right wherever an interrupt lands: a thread close() saw
        # not begun never touches the core, and one it saw begun is waited for until done)
        self._h = Handover()
        self._closed = False

    def _loop(self) -> None:
        lib, st = self._lib, self._st
        info = np.zeros(_rep_info(self._reps), dtype=np.float64)
        try:
            cur = 0
            while True:
                status = lib.core_run(st)
                while status == _NEED_DENSE:
                    self._need_dense()
                    status = lib.core_run(st)
                if status not in (_FLUSH, _DONE):
                    self._filled.put((status, cur, None, None))
                    return
                lib.core_info(st, _ptr(info))
                frontier = None
                if self._want_frontier:  # (before the core goes on: its runs as they are at the block's end)
                    frontier = np.zeros(self._reps, dtype=np.int64)
                    lib.core_frontier(st, _ptr(frontier))
                self._filled.put((status, cur, info.copy(), frontier))
                if status == _DONE or self._h.stop:
                    return
                cur = self._free.get()
                if cur is None or self._h.stop:
                    return
                lib.core_buffers(st, *self._sets[cur])
                lib.core_flushed(st)
        except BaseException as e:  # (raised where the sets are read)
            self._filled.put(e)

    def start(self) -> None:
        self._h.start(self._loop)

    def get(self) -> tuple:
        """The next set filled: ``(status, set, counters, frontier)``."""
        got = self._filled.get()
        if isinstance(got, BaseException):
            raise got
        return got

    def release(self, i: int) -> None:
        """Set ``i`` was read: the core may write it again."""
        self._free.put(i)

    def close(self) -> None:
        """Stop the thread, once its call in flight has returned. An interrupt meanwhile (a
        second Ctrl-C, a benchmark's alarm) is raised after that, never before: the core's state
        and buffers must outlive the call using them. One that lands as close() is entered comes
        out before it stops anything: call it again until it returns (run_core does)."""
        if self._closed:
            return
        pending, released = None, False
        while True:
            try:
                if not self._h.halt():  # (it never will touch the core)
                    break
                if not released:
                    self._free.put(None)  # (wakes a thread waiting for a free set; a second one is harmless)
                    released = True
                self._h.wait()
                break
            except BaseException as e:
                pending = pending or e
        self._closed = True
        if pending is not None:
            raise pending


# Where each field of the core's step records goes among STEP_FIELDS (sf's doubles, si's integers)
_SF_AT = (1, 2, 8, 9, 10, 11, 12, 13, 14)  # start end flops useful_flops bytes compute_s memory_s network_s overhead_s
_SI_AT = (0, 3, 4, 5, 6, 7, 15, 16, 17, 18, 19)  # replica num_seqs num_rows prefill decode padding oor kv waiting running preempted


class _Into:
    """Where ``core_columns_to`` writes a block in the step stream's arrays (Columns.reserve): their
    addresses and widths by the core's field order, made again when the arrays change (grown)."""

    def __init__(self, steps) -> None:
        self.reserve = getattr(steps, "reserve", lambda k: None)  # (a step stream: batchsim.sim.records.StepStream)
        self._arrays: list | None = None

    def tables(self, arrays: list) -> tuple:
        if arrays is not self._arrays:
            ok = all(arrays[j].dtype == np.float64 for j in _SF_AT) and all(
                arrays[j].dtype.kind == "i" and arrays[j].dtype.itemsize in (4, 8) for j in _SI_AT)
            if not ok or not all(a.flags.c_contiguous for a in arrays):  # pragma: no cover - STEP_FIELDS' types
                raise TypeError("the core writes step columns of doubles and of 4- or 8-byte integers")
            self._tabs = tuple((np.array([arrays[j].ctypes.data for j in at], dtype=np.int64),
                                np.array([arrays[j].dtype.itemsize for j in at], dtype=np.int64)) for at in (_SF_AT, _SI_AT))
            self._arrays = arrays
        return self._tabs


def _flush(lib, cols, info, reps, sf, si, g_t, g_run, g_entry, steps, times, closed, into=None) -> None:
    f, s = cols  # (field, step)
    for i in range(reps):
        k = int(info[_rep_info(i)])
        got = into.reserve(k) if k and into is not None else None
        if got is not None:
            # (straight into the step stream's arrays: Columns.reserve; no copy of the columns in between)
            n, arrays = got
            (fa, fw), (ia, iw) = into.tables(arrays)
            lib.core_columns_to(_ptr(sf[i]), k, sf.shape[2], _ptr(fa), _ptr(fw), n)
            lib.core_columns_to(_ptr(si[i]), k, si.shape[2], _ptr(ia), _ptr(iw), n)
            steps.commit(k)
        elif k:
            # (the core writes a step's record in one place; its fields are read as columns)
            lib.core_columns(_ptr(sf[i]), _ptr(f), k, *f.shape)
            lib.core_columns(_ptr(si[i]), _ptr(s), k, *s.shape)
            steps.extend(s[0, :k], f[0, :k], f[1, :k], s[1, :k], s[2, :k], s[3, :k], s[4, :k], s[5, :k],
                         f[2, :k], f[3, :k], f[4, :k], f[5, :k], f[6, :k], f[7, :k], f[8, :k], s[6, :k],
                         s[7, :k], s[8, :k], s[9, :k], s[10, :k], count=k)
        t = int(info[_rep_info(i) + 1])
        if t:
            # (packed as it comes, 4-6 B a time: itl.Packed; a small block, as many replicas make,
            # is kept as floats and packed with its neighbours (Times), a pack's fixed cost being
            # more than a few dozen floats')
            times[i].append(Packed(g_t[i, :t]) if t >= _PACK_MIN else g_t[i, :t].copy())
        c = int(info[_rep_info(i) + 3])
        if c:
            for col, v in zip(closed, (g_run[i, 0, :c], np.full(c, i, dtype=np.int64), g_run[i, 1, :c],
                                       g_run[i, 2, :c], g_entry[i, :c])):
                col.append(v.copy())


def _frame(workload, delivered, req_i, req_f, recipe, max_model_len, kv_blocks, block_size, max_queue_len):
    """The request records (batchsim.sim.records.request_frame's, the same dtypes and values, as a
    batchsim.sim.table.Table) built from the core's arrays, without a Python object per request."""
    if delivered == 0:
        return empty_requests()
    k = delivered
    rep, status, reason, rval, gen, pre, at_int = (req_i[j, :k] for j in range(7))
    admitted, first, last, comp, mx = (req_f[j, :k] for j in range(5))
    arrival = workload.arrival[:k].astype(np.float64)
    output = workload.output_tokens[:k].astype(np.int64)
    done = status == _COMPLETED
    completion = np.where(done, comp, np.nan)
    reasons = np.full(k, "", dtype=object)
    for rid in np.flatnonzero(status == _REJECTED).tolist():
        reasons[rid] = _reason(int(reason[rid]), int(rval[rid]), recipe, max_model_len, kv_blocks[int(rep[rid])],
                               block_size, max_queue_len)
    # NOTE: pandas infers a column of Python ints as int64: SimPy's clock is the integer 0 until a
    # timeout fires, so when every request was admitted then, the Python engine's column is integral
    adm = admitted.astype(np.int64) if bool(at_int.all()) else admitted.copy()
    cols = {
        "rid": np.arange(k, dtype=np.int64), "replica": rep.copy(),
        "status": np.array(_STATUS, dtype=object)[status], "reason": reasons,
        "arrival": arrival, "prompt_tokens": workload.prompt_tokens[:k].astype(np.int64), "output_tokens": output,
        "generated_tokens": gen.copy(), "admitted": adm, "first_token": first.copy(), "last_token": last.copy(),
        "completion": completion, "ttft": np.nan, "tpot": np.nan, "e2el": np.nan,
        "max_itl": mx.copy(), "preemptions": pre.copy(), "cached_tokens": np.zeros(k, dtype=np.int64),
    }
    return add_latencies(Table({c: cols[c] for c in REQUEST_COLUMNS}, n=k))


def _reason(code: int, value: int, recipe, max_model_len: int, blocks: int, block_size: int, max_queue_len) -> str:
    """The words batchsim.sim.engine and batchsim.policies.step give the rejection the core coded as (code, value)."""
    from batchsim.policies.step import over_budget, over_watermark
    from batchsim.sim.engine import over_kv, queue_full, too_long

    if code == 1:
        return too_long(value, max_model_len)
    if code == 2:
        return over_kv(value, blocks * block_size)
    if code == 3:
        return queue_full(max_queue_len)
    if code == 5:
        keep = int(recipe.watermark * blocks)
        return over_watermark(value, -(-value // block_size), blocks, keep)
    return over_budget(value, recipe.max_num_batched_tokens)
