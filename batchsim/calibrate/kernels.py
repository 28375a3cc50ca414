"""Real torch kernels on a device: a Llama layer's operators, and how to time them.

The reference executor (:mod:`batchsim.calibrate.executor`) builds its transformer
from these functions, and ``batchsim calibrate`` times each of them with
:class:`KernelTimer` inside that model's forward steps over grids of sizes
(GEMMs over token counts, SDPA prefill attention over (q, kv), decode
attention over (batch, kv), the elementwise kernels), plus a large copy, a
large GEMM and empty launches for the peaks: a profile is fitted on exactly
the code whose step times it must then predict.

Each operator is one *kernel* of the cost model (:mod:`batchsim.calibrate.work`):
``add_rms_norm`` (``norms``), ``rotary``, ``write_kv`` (``kv_cache_write``),
``silu_and_mul`` (``mlp_act``), the two attentions, ``F.linear`` for every
GEMM. KV lives in per-layer slabs ``[slots, kv_heads, capacity, head_dim]``,
one slot per sequence. Only calibration and the executor import this module.
"""

from __future__ import annotations

import math
import platform
import time
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from batchsim.sim.errors import InputError

__all__ = ["DTYPES", "resolve_device", "keep_heap", "synchronize", "device_name", "software_versions",
           "clock", "time_calls", "device_hold", "launch_seconds", "copy_bandwidth", "peak_gemm_flops", "bucket",
           "add_rms_norm", "rotary", "rope_tables", "write_kv", "silu_and_mul",
           "prefill_attention", "decode_attention", "KernelTimer"]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}  # fp32: tests only


# -- devices -----------------------------------------------------------------
def resolve_device(spec: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:i`` as a torch device; InputError if it is not there."""
    try:
        dev = torch.device(spec)
    except (RuntimeError, ValueError):
        raise InputError(f"unknown device {spec!r}; use cpu, cuda or cuda:<index>", "--device") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError("no CUDA device is available to torch", "--device")
        index = dev.index or 0
        if index >= torch.cuda.device_count():
            raise InputError(f"cuda:{index} does not exist ({torch.cuda.device_count()} CUDA devices)", "--device")
        # NOTE: events, device sleeps and current_stream() act on the current device: make it this one
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if dev.type != "cpu":
        raise InputError(f"unsupported device {spec!r}; use cpu, cuda or cuda:<index>", "--device")
    return dev


def keep_heap() -> bool:
    """Stop glibc from returning freed blocks to the OS (CPU runs only; True if applied).

    NOTE: by default glibc serves large blocks with mmap and trims the heap on
    free, so every eager op's output is page-faulted in afresh: ~2x on a tiny
    model's prefill step. A serving process keeps its arena (PyTorch's CUDA
    caching allocator does the same on a GPU), so calibration and the executor
    both run with mmap and trimming pushed out of the way.
    """
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    # mallopt(M_MMAP_THRESHOLD=-3, 32 MiB), (M_TRIM_THRESHOLD=-1, 1 GiB), (M_TOP_PAD=-2, 64 MiB)
    return all(libc.mallopt(opt, val) == 1 for opt, val in ((-3, 32 << 20), (-1, 1 << 30), (-2, 64 << 20)))


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    """A human name for the device (GPU product name, or the CPU model)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def software_versions(device: torch.device) -> dict[str, str]:
    """Versions that a measurement depends on (torch, CUDA, driver, Python; CPU threads)."""
    out = {"torch": torch.__version__, "python": platform.python_version(), "numpy": np.__version__}
    if device.type != "cuda":
        return dict(out, threads=str(torch.get_num_threads()))
    import subprocess

    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.split()
    except (OSError, subprocess.SubprocessError):
        smi = []
    return dict(out, cuda=str(torch.version.cuda), driver=smi[0] if smi else "unknown",
                cudnn_attention="on" if torch.backends.cuda.cudnn_sdp_enabled() else "off")


# -- timing ------------------------------------------------------------------
def clock(device: torch.device) -> Callable[[], float]:
    """The clock that times work on ``device``: wall time on a GPU (after a synchronize),
    this thread's CPU time on the CPU.

    NOTE: on a shared machine a CPU-bound thread is descheduled for milliseconds at a
    time: on the 2-vCPU VM of docs/validation.md the wall time of a fixed 7 ms loop
    had a median of 11 ms and a p90 of 15 ms while its thread CPU time stayed at 7 ms.
    With torch pinned to one thread every kernel runs on the calling thread, so its
    CPU time is the step's own cost on the device, whoever else shares the machine.
    """
    return time.perf_counter if device.type == "cuda" else time.thread_time



def time_calls(fn: Callable[..., object], args: Sequence[tuple], device: torch.device,
               warmup: int = 2, repeats: int = 10) -> list[float]:
    """Seconds of each of ``repeats`` calls ``fn(*args[i % len(args)])`` after ``warmup``.

    Inputs rotate so that successive calls touch different memory (caches
    don't flatter). CUDA events on a GPU; :func:`clock` on the CPU.
    """
    n = len(args)
    for i in range(warmup):
        fn(*args[i % n])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(repeats)]
        for i, (a, b) in enumerate(marks):
            a.record()
            fn(*args[(warmup + i) % n])
            b.record()
        torch.cuda.synchronize(device)
        return [a.elapsed_time(b) * 1e-3 for a, b in marks]
    now, times = clock(device), []
    for i in range(repeats):
        t0 = now()
        fn(*args[(warmup + i) % n])
        times.append(now() - t0)
    return times


def device_hold(seconds: float) -> None:
    """Queue a device sleep of about ``seconds`` on the current CUDA stream, so that the host can
    queue work behind it and events then time that work back to back on the device."""
    torch.cuda._sleep(int(seconds * 2e9))  # NOTE: cycles at ~2 GHz; a slower clock only holds longer


def launch_seconds(device: torch.device, calls: int = 2000, rounds: int = 5) -> float:
    """Per-call cost of an empty launch (a one-element add).

    On the CPU, dispatch plus launch on the host. On a GPU, the device's time per
    back-to-back empty kernel, queued behind a device sleep as :class:`KernelTimer`
    queues a step's kernels: that is the per-kernel floor inside the kernel times it
    measures, while the host's dispatch cost goes to the fitted host overhead.
    """
    a = torch.zeros(1, device=device)
    out = torch.empty_like(a)
    if device.type == "cuda":
        calls = min(calls, 400)  # NOTE: well inside the launch queue, or the host waits for the device
        per_call = []
        for _ in range(rounds):
            torch.cuda.synchronize(device)
            device_hold(0.03)
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            for _ in range(calls):
                torch.add(a, a, out=out)
            t1.record()
            torch.cuda.synchronize(device)
            per_call.append(t0.elapsed_time(t1) * 1e-3 / calls)
        return float(np.median(per_call))
    now, per_call = clock(device), []
    for _ in range(rounds):
        synchronize(device)
        t0 = now()
        for _ in range(calls):
            torch.add(a, a, out=out)
        synchronize(device)
        per_call.append((now() - t0) / calls)
    return float(np.median(per_call))


def copy_bandwidth(device: torch.device, nbytes: int, repeats: int = 5) -> float:
    """Bytes/s of a large device copy (read + write counted)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = min(time_calls(lambda: dst.copy_(src), [()], device, warmup=1, repeats=repeats))
    return 2.0 * src.numel() * 4 / t


def peak_gemm_flops(device: torch.device, dtype: torch.dtype, sizes: Sequence[int], repeats: int = 5) -> float:
    """Best FLOP/s over large square GEMMs of the given sizes."""
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        t = min(time_calls(lambda: torch.mm(a, b), [()], device, warmup=2, repeats=repeats))
        best = max(best, 2.0 * n**3 / t)
        del a, b
    return best


def bucket(n: int, per_octave: int = 16) -> int:
    """``n`` rounded up to a grid with ``per_octave`` sizes per doubling (exact up to ``per_octave``).

    NOTE: the CPU executor pads a step's token rows to this grid (as vLLM pads decode
    batches to CUDA-graph sizes): oneDNN compiles a GEMM kernel per new row count
    (~1 ms), so only a bounded set of sizes, compiled at warm-up, may appear.
    """
    if n <= per_octave:
        return max(n, 1)
    step = 2 ** (n.bit_length() - 1) // per_octave
    return -(-n // step) * step


# -- the layer's operators ------------------------------------------------------
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add (in place) then RMSNorm, as vLLM's fused kernel: ``(normed, residual)``."""
    residual = x if residual is None else residual.add_(x)
    return F.rms_norm(residual, (residual.shape[-1],), weight, eps), residual


def rope_tables(max_positions: int, head_dim: int, device: torch.device, dtype: torch.dtype,
                theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and signed ``sin`` tables ``[positions, head_dim]`` for :func:`rotary`."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv)
    cos = torch.cat([ang.cos(), ang.cos()], dim=-1)
    sin = torch.cat([-ang.sin(), ang.sin()], dim=-1)
    return cos.to(device, dtype), sin.to(device, dtype)


def rotary(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on ``qk [T, heads, head_dim]`` with ``cos``/``sin [T, 1, head_dim]``.

    ``roll`` swaps the halves and the sign lives in the ``sin`` table, so the
    whole rotation is three kernels.
    """
    return torch.addcmul(qk * cos, torch.roll(qk, qk.shape[-1] // 2, dims=-1), sin)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor, positions: torch.Tensor) -> None:
    """Store the step's keys and values ``[T, kv_heads, head_dim]`` at (slot, position)."""
    k_cache[slots, :, positions] = k
    v_cache[slots, :, positions] = v


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU activation: ``silu(gate) * up`` of a fused ``[T, 2f]`` projection."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


_CAUSAL: dict[tuple, torch.Tensor] = {}


def _lower_right(q: int, kv: int, device: torch.device) -> torch.Tensor:
    """Causal mask of ``q`` new tokens after ``kv`` cached ones (query i sees keys <= kv + i)."""
    key = (q, kv, device)
    m = _CAUSAL.get(key)
    if m is None:
        if len(_CAUSAL) > 256:
            _CAUSAL.clear()
        m = torch.arange(kv + q, device=device)[None, :] <= (kv + torch.arange(q, device=device))[:, None]
        _CAUSAL[key] = m
    return m


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slots: Sequence[int], kv: int, idx: torch.Tensor | None = None) -> torch.Tensor:
    """Causal SDPA of ``R`` rows of ``n`` new tokens each over ``kv`` cached ones.

    ``q [R*n, heads, head_dim]`` (token-major, rows in ``slots`` order, their
    keys already written); returns ``[R*n, heads*head_dim]``. One SDPA call for
    the ``R`` rows, which must share ``(n, kv)`` (a padded batch does). ``idx``:
    ``slots`` as a device tensor, made ahead (a copy from host memory here would
    wait for the device in the middle of the step).
    """
    rows = len(slots)
    n, heads, dh = q.shape[0] // rows, q.shape[1], q.shape[2]
    ctx = kv + n
    if rows == 1:
        k, v = k_cache[slots[0], :, :ctx].unsqueeze(0), v_cache[slots[0], :, :ctx].unsqueeze(0)
    else:
        idx = torch.as_tensor(slots, device=q.device) if idx is None else idx
        k, v = k_cache[:, :, :ctx].index_select(0, idx), v_cache[:, :, :ctx].index_select(0, idx)
    qh = q.view(rows, n, heads, dh).transpose(1, 2)
    if kv == 0:
        out = F.scaled_dot_product_attention(qh, k, v, is_causal=True, enable_gqa=True)
    else:
        out = F.scaled_dot_product_attention(qh, k, v, attn_mask=_lower_right(n, kv, q.device), enable_gqa=True)
    return out.transpose(1, 2).reshape(rows * n, heads * dh)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                     lens: torch.Tensor, max_len: int) -> torch.Tensor:
    """One new token per row over its cached keys: ``q [B, heads, head_dim]`` -> ``[B, heads*head_dim]``.

    Gathers the rows' slots up to the longest context and masks the rest (a
    padded stand-in for a paged-attention kernel).
    """
    b, heads, dh = q.shape
    k = k_cache[:, :, :max_len].index_select(0, slots)
    v = v_cache[:, :, :max_len].index_select(0, slots)
    mask = (torch.arange(max_len, device=q.device)[None, :] < lens[:, None])[:, None, None, :]
    out = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, enable_gqa=True)
    return out.reshape(b, heads * dh)


class KernelTimer:
    """Times each kernel of a forward step where it runs: ``timer(name, fn, *args)``.

    NOTE: in place, not in a loop of its own. On a CPU the same kernel ran 2-4x
    faster timed back to back (code and data hot) and 2x slower timed between
    shuffled unrelated kernels (everything cold) than inside the model, where
    its input is what the previous kernel just wrote. CUDA events on a GPU,
    :func:`clock` on the CPU.

    NOTE: on a GPU an eager step is host-bound (an H200 ran a llama-3-8b decode
    step's kernels in a fraction of the ~13 ms Python took to launch them), so
    events around a kernel launched as the device idles time the launch, not the
    kernel. The first timed call therefore queues a ``hold_s`` device sleep:
    while it runs the host queues the step, and the events then time each kernel
    back to back on the device, as a serving engine's CUDA graphs run them.
    """

    def __init__(self, device: torch.device, hold_s: float = 0.04) -> None:
        self.cuda, self.now = device.type == "cuda", clock(device)
        self.marks: list[tuple] = []
        self.hold = hold_s if self.cuda else 0.0

    def __call__(self, name: str, fn: Callable, *args):
        if self.cuda:
            if self.hold:
                device_hold(self.hold)
                self.hold = 0.0
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = fn(*args)
            b.record()
            self.marks.append((name, a, b))
            return out
        t0 = self.now()
        out = fn(*args)
        self.marks.append((name, self.now() - t0))
        return out

    def times(self) -> dict[str, list[float]]:
        """Seconds of every timed call by kernel name (call after the step has synchronized)."""
        out: dict[str, list[float]] = {}
        for m in self.marks:
            out.setdefault(m[0], []).append(m[1] if len(m) == 2 else m[1].elapsed_time(m[2]) * 1e-3)
        return out

    def idle_fraction(self) -> float:
        """On a GPU, the share of the step's device time spent between timed calls: near 0 when the
        hold let the host queue the whole step, larger when the device caught up with the host
        and later kernels were timed launch-bound again (0.0 on the CPU)."""
        ev = [m for m in self.marks if len(m) == 3]
        if len(ev) < 2:
            return 0.0
        gaps = sum(max(b.elapsed_time(a2), 0.0) for (_, _, b), (_, a2, _) in zip(ev, ev[1:]))
        span = ev[0][1].elapsed_time(ev[-1][2])
        return gaps / span if span > 0 else 0.0
