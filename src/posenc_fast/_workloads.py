"""The standard benchmark workloads and the code that times them.

Shared by ``python -m posenc_fast bench`` (``_cli_bench``), ``bench/report.py``
and the pytest-benchmark suite in ``bench/``, so that all three time the same
arrays the same way.  It lives in the package (not in ``bench/``) because the
CLI must work from an installed wheel.

A workload (W1-W5 of issue 6, ``apply_qk``, ``add_alibi``) is built into a
`Case`: its arrays, allocated once, and a float64 *reference* result (the
definition evaluated with NumPy in float64: angles, sin/cos and arithmetic).
A case hands out `Impl` objects by kind:

``"posenc_fast"``   our call, with ``out=`` where the API has it;
``"limit"``         the cheapest NumPy call that moves the same bytes
                    (``np.copyto``, ``np.multiply(x, 1, out=x)``, ``out.fill``):
                    the physical limit the goals are stated against;
``"numpy"``         the NumPy expression a user would write (cos/sin formed in
                    float64, then cast);
``"torch"``, ``"torch.compile"``  the same expression in PyTorch (only when
                    torch is importable; `Unavailable` otherwise).

Timing rules (`measure`): every call is warmed up, the callables of one case
are timed in interleaved rounds (a, b, c, a, b, c, ...; the start rotates
each round), a sample holds enough calls to last `target_ns`, times come from
``time.perf_counter_ns`` and results are medians.  Claims are ratios of
medians (or medians of per-round ratios) measured in the same process, never
a single absolute time.  Nothing here imports torch unless asked to.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from . import _threads

ROPE_DIM = 128
BASE = 10000.0
W3_OFFSET = 4096          # the token after a 4096-token prefill
ALIBI_OFFSET = 0

# rel_diff = max|result - reference| / max(1, max|reference|) must stay below
# TOLERANCE[dtype] + ANGLE_ULPS * 2**-52 * (largest angle): a float64 angle of
# size A is only known to about 2**-52 * A, and every correct way of forming it
# (a product, an angle-addition recurrence) may differ from p*w by an ulp or two.
TOLERANCE = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}
ANGLE_ULPS = 4
CHUNK = 1 << 20  # elements per block when comparing or computing references

KINDS = ("posenc_fast", "limit", "numpy", "torch", "torch.compile")


class Unavailable(Exception):
    """An implementation that cannot run here (torch missing, module not written yet)."""


# ---------------------------------------------------------------------------
# timing


def calibrate(func: Callable[[], object], target_ns: int) -> int:
    """Return how many calls of `func` make one sample of about `target_ns`."""
    start = time.perf_counter_ns()
    func()
    elapsed = max(time.perf_counter_ns() - start, 1)
    number = 1
    while elapsed * number < target_ns // 4 and number < 1 << 20:
        number *= 2          # the first call may be slow: re-time a batch
        start = time.perf_counter_ns()
        for _ in range(number):
            func()
        elapsed = max((time.perf_counter_ns() - start) // number, 1)
    return max(1, min(1 << 20, math.ceil(target_ns / elapsed)))


@dataclass
class Timing:
    """Per-call times (ns) of one callable, one entry per interleaved round."""

    samples: list[float]
    number: int

    @property
    def median_ns(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """(q3 - q1) / median of the samples: how noisy the rounds were."""
        if len(self.samples) < 4:
            return 0.0
        q = statistics.quantiles(self.samples, n=4)
        return (q[2] - q[0]) / self.median_ns


def measure(funcs: Mapping[str, Callable[[], object]], *, rounds: int = 15,
            target_ns: int = 1_000_000, warmup: int = 1,
            before: Mapping[str, Callable[[], object]] | None = None,
            progress: Callable[[str], None] | None = None,
            budget_s: float | None = None, min_rounds: int = 3) -> dict[str, Timing]:
    """Time `funcs` in interleaved rounds; return a `Timing` per name.

    Parameters
    ----------
    funcs : mapping of name to a callable without arguments
    rounds : int
        Samples per callable.
    target_ns : int
        Each sample repeats the call enough times to last about this long
        (tiny calls are otherwise below the clock's resolution).
    warmup : int
        Untimed calls of each callable before the one that calibrates it.
    before : mapping of name to a callable, optional
        Run (untimed) before every sample of that name, e.g. to set a thread
        count; thread counts of posenc_fast and torch are restored at the end.
    progress : callable taking a str, optional
        Told "round i/n" as the rounds go.
    budget_s : float, optional
        Stop after `min_rounds` rounds once this many seconds have passed
        (a slow baseline on a busy machine must not stall a quick run).
    """
    before = dict(before or {})
    names = list(funcs)
    with restored_threads():
        numbers = {}
        for name in names:
            if name in before:
                before[name]()
            for _ in range(warmup):
                funcs[name]()
            numbers[name] = calibrate(funcs[name], target_ns)
        samples: dict[str, list[float]] = {name: [] for name in names}
        clock = time.perf_counter_ns
        started = clock()
        for r in range(rounds):
            if (budget_s is not None and r >= min_rounds
                    and clock() - started > budget_s * 1e9):
                break
            if progress is not None:
                progress(f"round {r + 1}/{rounds}")
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                if name in before:
                    before[name]()
                func, number = funcs[name], numbers[name]
                if number == 1:
                    start = clock()
                    func()
                    elapsed = clock() - start
                else:
                    start = clock()
                    for _ in range(number):
                        func()
                    elapsed = clock() - start
                samples[name].append(elapsed / number)
    return {name: Timing(samples[name], numbers[name]) for name in names}


def paired_ratio(a: Timing, b: Timing) -> float:
    """Median over rounds of a's time / b's time (rounds were interleaved)."""
    return statistics.median(x / y for x, y in zip(a.samples, b.samples))


def paired_ratio_quartiles(a: Timing, b: Timing) -> tuple[float, float]:
    """First and third quartiles over rounds of a's time / b's time: how noisy the ratio is."""
    ratios = [x / y for x, y in zip(a.samples, b.samples)]
    if len(ratios) < 4:
        return min(ratios), max(ratios)
    q = statistics.quantiles(ratios, n=4)
    return q[0], q[2]


class restored_threads:
    """Context manager: restore posenc_fast's (and torch's, if imported) thread counts."""

    def __enter__(self):
        self.ours = _threads.get_num_threads()
        torch = _torch_if_imported()
        self.torch = torch.get_num_threads() if torch is not None else None
        return self

    def __exit__(self, *exc):
        _threads.set_num_threads(self.ours)
        torch = _torch_if_imported()
        if torch is not None and self.torch is not None:
            torch.set_num_threads(self.torch)
        return False


def set_threads(n: int) -> None:
    """Set the thread count of posenc_fast and, if imported, of torch."""
    _threads.set_num_threads(n)
    torch = _torch_if_imported()
    if torch is not None:
        torch.set_num_threads(n)


class ParallelCopy:
    """``np.copyto(dst, src)`` split over `n` threads (NumPy drops the GIL while copying).

    The copy limit for a multi-threaded call: the memory bandwidth `n` cores get.
    """

    def __init__(self, dst: np.ndarray, src: np.ndarray, n: int):
        flat_dst, flat_src = dst.reshape(-1), src.reshape(-1)
        bounds = np.linspace(0, flat_dst.size, n + 1).astype(int)
        self.parts = [(flat_dst[a:b], flat_src[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        self.pool = ThreadPoolExecutor(max_workers=n)

    def __call__(self) -> None:
        for future in [self.pool.submit(np.copyto, d, s) for d, s in self.parts]:
            future.result()

    def close(self) -> None:
        self.pool.shutdown()


# ---------------------------------------------------------------------------
# differences to the reference


@dataclass
class Diff:
    """How far a result is from the float64 reference.

    ``max_ulp`` (float32 tables only) is the error in float32 ulps of the
    reference value plus half a float64 ulp of the angle: near a zero of
    sin/cos the value is only known to the precision of its float64 angle
    (there even the correctly rounded sin(fl(p*w)) is several ulps from
    sin(p*w)), so it is not judged finer than that.
    """

    max_abs: float
    max_rel: float                # max_abs / max(1, max|reference|)
    max_ulp: float | None = None
    tolerance: float = 0.0        # what max_rel must not exceed

    @property
    def ok(self) -> bool:
        return self.max_rel <= self.tolerance

    def as_dict(self) -> dict:
        return {"max_abs_diff": self.max_abs, "max_rel_diff": self.max_rel,
                "max_ulp": self.max_ulp, "tolerance": self.tolerance, "ok": self.ok}


def difference(results, references, *, max_angle: float = 0.0, angles=None) -> Diff:
    """Compare arrays (or tuples of arrays) with their float64 references.

    `angles`: for tables, the float64 angle behind each reference value (one
    array per reference, broadcastable), to report ulps.
    """
    if not isinstance(results, (tuple, list)):
        results, references = (results,), (references,)
        angles = None if angles is None else (angles,)
    max_abs = max_ref = 0.0
    max_ulp = None
    for n, (result, reference) in enumerate(zip(results, references)):
        result = np.asarray(result)
        if result.shape != reference.shape:
            raise AssertionError(f"result shape {result.shape} != reference {reference.shape}")
        with_ulps = angles is not None and result.dtype == np.float32
        flats = [result.reshape(-1), reference.reshape(-1)]
        if with_ulps:
            flats.append(np.broadcast_to(angles[n], reference.shape).reshape(-1))
        # In blocks: no temporaries the size of the arrays (page faults dominate otherwise).
        for start in range(0, flats[0].size, CHUNK):
            got, ref = (f[start:start + CHUNK] for f in flats[:2])
            err = np.abs(got.astype(np.float64) - ref)
            err[~np.isfinite(err)] = np.inf
            max_abs = max(max_abs, float(err.max(initial=0.0)))
            max_ref = max(max_ref, float(np.abs(ref).max(initial=0.0)))
            if with_ulps:
                unit = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
                unit += np.abs(flats[2][start:start + CHUNK]) * 2.0**-53
                max_ulp = max(max_ulp or 0.0, float((err / unit).max(initial=0.0)))
    dtype = np.result_type(*[np.asarray(r).dtype for r in results])
    tolerance = TOLERANCE.get(np.dtype(dtype), 1e-5) + ANGLE_ULPS * 2.0**-52 * max_angle
    return Diff(max_abs, max_abs / max(1.0, max_ref), max_ulp, tolerance)


# ---------------------------------------------------------------------------
# implementations and cases


@dataclass
class Impl:
    """One implementation of a workload.

    ``run()`` is the timed call.  ``verify()`` runs it once more on fresh
    inputs and returns its `Diff` to the reference (None for a limit row,
    whose own result it checks instead, raising AssertionError if wrong).
    """

    kind: str
    label: str
    run: Callable[[], object]
    verify: Callable[[], Diff | None]
    before: Callable[[], object] | None = None


@dataclass
class Case:
    """A workload built at one dtype and shape: arrays allocated, reference lazy."""

    key: str
    title: str
    dtype: np.dtype
    shape: tuple
    bytes_moved: int
    limit_label: str
    goal: float | None
    goal_text: str
    builders: dict[str, Callable[[], Impl]]
    reference: Callable[[], object]
    max_angle: float = 0.0                          # largest |angle| (for the tolerance)
    angles: Callable[[], object] | None = None      # tables: angles behind the reference
    arrays: dict = field(default_factory=dict)      # the main input/output arrays, by name
    _impls: dict = field(default_factory=dict)
    _ref: object = None

    @property
    def shape_label(self) -> str:
        return "x".join(str(n) for n in self.shape)

    def expected(self):
        """The float64 reference result (computed once)."""
        if self._ref is None:
            self._ref = self.reference()
        return self._ref

    def kinds(self) -> list[str]:
        return [kind for kind in KINDS if kind in self.builders]

    def impl(self, kind: str, threads: int | None = None) -> Impl:
        """The implementation of `kind` (built once; raises `Unavailable`)."""
        if kind not in self.builders:
            raise Unavailable(f"{self.key} has no {kind!r} implementation")
        if kind not in self._impls:
            self._impls[kind] = self.builders[kind]()
        impl = self._impls[kind]
        if threads is not None:
            impl = Impl(impl.kind, f"{impl.label} [{threads} threads]", impl.run, impl.verify,
                        lambda n=threads: set_threads(n))
        return impl

    def check(self, result) -> Diff:
        """The `Diff` of `result` (array or tuple) to the reference."""
        return difference(result, self.expected(), max_angle=self.max_angle,
                          angles=None if self.angles is None else self.angles())


def _torch_if_imported():
    import sys

    return sys.modules.get("torch")


def torch_or_unavailable():
    """Return the torch module, or raise `Unavailable` saying why not."""
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install
        raise Unavailable(f"torch is not importable ({type(exc).__name__}: {exc})") from None
    return torch


def torch_version() -> str | None:
    try:
        return torch_or_unavailable().__version__
    except Unavailable:
        return None


def _compile(torch, func, *example):
    """torch.compile `func` and run it once (compilation is setup, never timed)."""
    try:
        compiled = torch.compile(func)
        compiled(*example)
        compiled(*example)
    except Exception as exc:
        raise Unavailable(f"torch.compile failed: {type(exc).__name__}: {exc}"[:300]) from None
    return compiled


def _torch_builders(make_func, arrays, check) -> dict:
    """The "torch" and "torch.compile" builders of a workload.

    `make_func(torch)` returns the function timed, called on torch views of
    `arrays`; `check` gets its result as NumPy (one array or a tuple).
    """
    def builder(compiled):
        def build():
            torch = torch_or_unavailable()
            tensors = [torch.from_numpy(a) for a in arrays]
            func = make_func(torch)
            if compiled:
                func = _compile(torch, func, *tensors)

            def run():
                return func(*tensors)

            def verify():
                result = run()
                if isinstance(result, tuple):
                    return check(tuple(t.numpy() for t in result))
                return check(result.numpy())
            return Impl("torch.compile" if compiled else "torch",
                        "torch.compile" if compiled else "PyTorch eager", run, verify)
        return build
    return {"torch": builder(False), "torch.compile": builder(True)}


def rope_inv_freq(dim: int = ROPE_DIM, base: float = BASE) -> np.ndarray:
    """inv_freq[i] = base ** (-2i/dim) with Python's pow, as reference.py computes it."""
    return np.array([base ** (-2 * i / dim) for i in range(dim // 2)])


def alibi_slopes(num_heads: int) -> np.ndarray:
    """ALiBi slopes as BLOOM's build_alibi_tensor computes them (float64)."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest != num_heads:
        extra = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        slopes += [extra ** p for p in range(1, 1 + 2 * (num_heads - closest), 2)]
    return np.array(slopes)


def _rng():
    return np.random.default_rng(20240611)


def _random(shape, dtype) -> np.ndarray:
    return _rng().standard_normal(shape, dtype=np.float32).astype(dtype, copy=False)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate((-x[..., half:], x[..., :half]), axis=-1)


def numpy_rope_half(x, positions, inv_freq):
    """HF's ``x*cos + rotate_half(x)*sin``; cos/sin in float64, cast to x's dtype.

    `positions` broadcasts against ``x.shape[:-1]`` (float64 values).
    """
    angles = np.asarray(positions, dtype=np.float64)[..., None] * inv_freq
    emb = np.concatenate((angles, angles), axis=-1)
    cos = np.cos(emb).astype(x.dtype)
    sin = np.sin(emb).astype(x.dtype)
    return x * cos + _rotate_half(x) * sin


def reference_rope_half(x, positions, inv_freq):
    """The float64 reference of a "half"-layout rotation (in blocks of rows for big x)."""
    positions = np.asarray(positions, dtype=np.float64)
    if positions.ndim != 1 or x.size <= CHUNK:
        return numpy_rope_half(np.asarray(x, dtype=np.float64), positions, inv_freq)
    # positions (seq,) along axis -2: every (seq, dim) block uses the same positions.
    blocks = x.reshape(-1, x.shape[-2], x.shape[-1])
    result = np.empty(blocks.shape)
    step = max(1, CHUNK // (x.shape[-2] * x.shape[-1]))
    for start in range(0, blocks.shape[0], step):
        part = blocks[start:start + step].astype(np.float64)
        result[start:start + step] = numpy_rope_half(part, positions, inv_freq)
    return result.reshape(x.shape)


def _torch_rope_half(torch):
    def rope(x, positions, inv_freq):
        angles = positions[..., None] * inv_freq
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
    return rope


def _rope_case(key, title, dtype, shape, positions, offset, *, in_place=False, goal=None,
               goal_text=""):
    """W1/W2/W3: rotate x of `shape` ("half" layout, dim 128).

    positions: None (arange along seq, plus offset) or an integer array.
    """
    import posenc_fast as pf

    dtype = np.dtype(dtype)
    rope = pf.RotaryEmbedding(ROPE_DIM, base=BASE, layout="half")
    inv_freq = rope_inv_freq()
    x0 = _random(shape, dtype)
    out = np.empty_like(x0)
    work = x0.copy() if in_place else None
    # pos_b: float64 positions as they broadcast against x.shape[:-1]
    if positions is None:
        pos_b = offset + np.arange(shape[-2], dtype=np.float64)   # (seq,): the axis -2
    else:
        pos_b = np.asarray(positions, dtype=np.float64) + offset
    call_positions = positions
    nbytes = x0.nbytes

    def reference():
        return reference_rope_half(x0, pos_b, inv_freq)

    def ours():
        if in_place:
            def run():
                return rope.apply(work, call_positions, offset=offset, out=work)

            def verify():
                np.copyto(work, x0)
                run()
                return case.check(work)
        else:
            def run():
                return rope.apply(x0, call_positions, offset=offset, out=out)

            def verify():
                out.fill(np.nan)
                return case.check(run())
        return Impl("posenc_fast", "posenc_fast" + (" (in place)" if in_place else ""),
                    run, verify)

    def limit():
        if in_place:
            def run():
                return np.multiply(work, 1, out=work)

            def verify():
                np.copyto(work, x0)
                run()
                assert np.array_equal(work, x0)
                return None
            return Impl("limit", "np.multiply(x, 1, out=x)", run, verify)

        def run():
            return np.copyto(out, x0)

        def verify():
            out.fill(np.nan)
            run()
            assert np.array_equal(out, x0)
            return None
        return Impl("limit", "np.copyto(out, x)", run, verify)

    def numpy_expr():
        def run():
            return numpy_rope_half(x0, pos_b, inv_freq)
        return Impl("numpy", "NumPy expression", run, lambda: case.check(run()))

    builders = {"posenc_fast": ours, "limit": limit, "numpy": numpy_expr,
                **_torch_builders(_torch_rope_half,
                                  (x0, np.ascontiguousarray(pos_b, dtype=np.float64), inv_freq),
                                  lambda result: case.check(result))}
    case = Case(key, title, dtype, tuple(shape), 2 * nbytes,
                "np.multiply(x, 1, out=x)" if in_place else "np.copyto(out, x)", goal,
                goal_text, builders, reference,
                max_angle=float(np.abs(pos_b).max()) * float(inv_freq.max()),
                arrays={"x": x0, "out": out})
    return case


def _apply_qk_case(dtype, q_shape, k_shape):
    import posenc_fast as pf

    dtype = np.dtype(dtype)
    rope = pf.RotaryEmbedding(ROPE_DIM, base=BASE, layout="half")
    inv_freq = rope_inv_freq()
    q0, k0 = _random(q_shape, dtype), _random(k_shape, dtype)
    k0 = np.ascontiguousarray(k0[..., ::-1])  # not the same numbers as q
    out_q, out_k = np.empty_like(q0), np.empty_like(k0)
    pos = np.arange(q_shape[-2], dtype=np.float64)

    def reference():
        return (reference_rope_half(q0, pos, inv_freq), reference_rope_half(k0, pos, inv_freq))

    def ours():
        def run():
            return rope.apply_qk(q0, k0, out_q=out_q, out_k=out_k)

        def verify():
            out_q.fill(np.nan)
            out_k.fill(np.nan)
            return case.check(run())
        return Impl("posenc_fast", "posenc_fast apply_qk", run, verify)

    def limit():
        def run():
            np.copyto(out_q, q0)
            np.copyto(out_k, k0)

        def verify():
            run()
            assert np.array_equal(out_q, q0) and np.array_equal(out_k, k0)
            return None
        return Impl("limit", "np.copyto q and k", run, verify)

    def numpy_expr():
        def run():
            # HF apply_rotary_pos_emb: one cos/sin, used for q and k.
            angles = pos[:, None] * inv_freq
            emb = np.concatenate((angles, angles), axis=-1)
            cos, sin = np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)
            return q0 * cos + _rotate_half(q0) * sin, k0 * cos + _rotate_half(k0) * sin
        return Impl("numpy", "NumPy expression", run, lambda: case.check(run()))

    def torch_qk(torch):
        def func(q, k, p, inv):
            angles = p[:, None] * inv
            emb = torch.cat((angles, angles), dim=-1)
            cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
            half = q.shape[-1] // 2

            def rot(x):
                return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
            return rot(q), rot(k)
        return func

    builders = {"posenc_fast": ours, "limit": limit, "numpy": numpy_expr,
                **_torch_builders(torch_qk, (q0, k0, pos, inv_freq),
                                  lambda result: case.check(result))}
    case = Case("apply_qk", "apply_qk q+k (GQA 32/8 heads)", dtype,
                tuple(q_shape) + tuple(k_shape), 2 * (q0.nbytes + k0.nbytes),
                "np.copyto q and k", 1.15, "<= 1.15x", builders, reference,
                max_angle=float(pos.max(initial=0.0)) * float(inv_freq.max()))
    case.shape = (tuple(q_shape), tuple(k_shape))
    return case


def _cos_sin_case(dtype, n):
    """W4: RotaryEmbedding(128).cos_sin(arange(n), out=(cos, sin))."""
    import posenc_fast as pf

    dtype = np.dtype(dtype)
    rope = pf.RotaryEmbedding(ROPE_DIM, base=BASE, layout="half")
    inv_freq = rope_inv_freq()
    positions = np.arange(n)
    pos64 = positions.astype(np.float64)
    half = ROPE_DIM // 2
    fill_a = np.empty((n, half), dtype)
    fill_b = np.empty((n, half), dtype)

    def reference():
        angles = np.outer(pos64, inv_freq)
        return np.cos(angles), np.sin(angles)

    out = (np.empty((n, half), dtype), np.empty((n, half), dtype))

    def ours():
        # out= as the limit writes preallocated arrays too (a fresh 32 MiB array
        # costs page faults: alloc + fill is ~3x fill on the benchmark machine).
        def run():
            return rope.cos_sin(positions, dtype=dtype, out=out)
        return Impl("posenc_fast", "posenc_fast cos_sin(out=)", run, lambda: case.check(run()))

    def limit():
        def run():
            fill_a.fill(1.0)
            fill_b.fill(1.0)

        def verify():
            run()
            assert (fill_a == 1).all() and (fill_b == 1).all()
            return None
        return Impl("limit", "out.fill(1.0) x2", run, verify)

    def numpy_expr():
        def run():
            angles = np.outer(pos64, inv_freq)
            return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
        return Impl("numpy", "NumPy expression", run, lambda: case.check(run()))

    def torch_cos_sin(torch):
        tdtype = getattr(torch, dtype.name)

        def func(p, inv):
            angles = torch.outer(p, inv)
            return angles.cos().to(tdtype), angles.sin().to(tdtype)
        return func

    builders = {"posenc_fast": ours, "limit": limit, "numpy": numpy_expr,
                **_torch_builders(torch_cos_sin, (pos64, inv_freq),
                                  lambda result: case.check(result))}
    case = Case("w4_cos_sin", "W4 cos/sin table", dtype, (n, half), 2 * n * half * dtype.itemsize,
                "out.fill(1.0) on both", 3.0, "<= 3x", builders, reference,
                max_angle=float(n - 1) * float(inv_freq.max()),
                angles=lambda: (np.outer(pos64, inv_freq),) * 2)
    return case


def _sinusoidal_case(dtype, length, dim):
    """W5: sinusoidal_table(length, dim, out=out)."""
    import posenc_fast as pf

    dtype = np.dtype(dtype)
    out = np.empty((length, dim), dtype)
    fill = np.empty((length, dim), dtype)
    pos64 = np.arange(length, dtype=np.float64)
    freqs = np.array([BASE ** (-2 * i / dim) for i in range((dim + 1) // 2)])

    def reference():
        angles = np.outer(pos64, freqs)
        table = np.empty((length, dim))
        table[:, 0::2] = np.sin(angles)
        table[:, 1::2] = np.cos(angles[:, : dim // 2])
        return table

    def angles():
        pair = np.outer(pos64, freqs)
        table = np.empty((length, dim))
        table[:, 0::2] = pair
        table[:, 1::2] = pair[:, : dim // 2]
        return table

    def ours():
        def run():
            return pf.sinusoidal_table(length, dim, dtype=dtype, out=out)

        def verify():
            out.fill(np.nan)
            return case.check(run())
        return Impl("posenc_fast", "posenc_fast sinusoidal_table", run, verify)

    def limit():
        def run():
            fill.fill(1.0)

        def verify():
            run()
            assert (fill == 1).all()
            return None
        return Impl("limit", "out.fill(1.0)", run, verify)

    def numpy_expr():
        def run():
            # The "Attention Is All You Need" table as users write it (div_term precomputed).
            angles = np.outer(pos64, freqs)
            table = np.empty((length, dim), dtype)
            table[:, 0::2] = np.sin(angles)
            table[:, 1::2] = np.cos(angles[:, : dim // 2])
            return table
        return Impl("numpy", "NumPy expression", run, lambda: case.check(run()))

    def torch_table(torch):
        tdtype = getattr(torch, dtype.name)

        def func(p, f):
            angles = torch.outer(p, f)
            table = torch.empty((length, dim), dtype=tdtype)
            table[:, 0::2] = angles.sin()
            table[:, 1::2] = angles[:, : dim // 2].cos()
            return table
        return func

    builders = {"posenc_fast": ours, "limit": limit, "numpy": numpy_expr,
                **_torch_builders(torch_table, (pos64, freqs), lambda result: case.check(result))}
    case = Case(f"w5_sinusoidal_{length}x{dim}", f"W5 sinusoidal_table {length}x{dim}", dtype,
                (length, dim), length * dim * dtype.itemsize, "out.fill(1.0)", 3.0, "<= 3x",
                builders, reference, max_angle=float(length - 1) * float(freqs.max()),
                angles=angles)
    return case


def add_alibi_function():
    """posenc_fast's add_alibi, or raise `Unavailable` (relative.py may not exist yet)."""
    import posenc_fast as pf

    func = getattr(pf, "add_alibi", None)
    if func is None:
        try:
            from posenc_fast.relative import add_alibi as func
        except ImportError as exc:
            raise Unavailable(f"posenc_fast.add_alibi is not available yet ({exc})") from None
    return func


def numpy_add_alibi(scores, slopes, offset):
    """``scores += bias`` head by head (a (heads, q, k) float64 bias would be 4 GiB)."""
    q_len, k_len = scores.shape[-2:]
    rel = np.arange(k_len, dtype=np.float64) - (offset + np.arange(q_len, dtype=np.float64))[:, None]
    for h in range(scores.shape[-3]):
        scores[..., h, :, :] += (slopes[h] * rel).astype(scores.dtype)
    return scores


def _alibi_case(dtype, shape, offset=ALIBI_OFFSET):
    """add_alibi(scores, out=scores) on scores of `shape` (heads, q, k), starting from zeros.

    The reference covers at most 3 heads (first, middle, last): a full float64
    reference of the real shape would be 4 GiB.
    """
    dtype = np.dtype(dtype)
    heads, q_len, k_len = shape
    scores = np.zeros(shape, dtype)
    slopes = alibi_slopes(heads)
    checked = sorted({0, heads // 2, heads - 1})

    def reference():
        rel = np.arange(k_len, dtype=np.float64) - (offset + np.arange(q_len, dtype=np.float64))[:, None]
        return np.stack([slopes[h] * rel for h in checked])

    def sampled():
        return scores[checked]

    def ours():
        add_alibi = add_alibi_function()

        def run():
            return add_alibi(scores, offset=offset, causal=True, out=scores)

        def verify():
            scores.fill(0)
            run()
            return case.check(sampled())
        return Impl("posenc_fast", "posenc_fast add_alibi (in place)", run, verify)

    def limit():
        def run():
            return np.multiply(scores, 1, out=scores)

        def verify():
            scores.fill(0)
            run()
            assert not scores[checked].any()
            return None
        return Impl("limit", "np.multiply(s, 1, out=s)", run, verify)

    def numpy_expr():
        def run():
            return numpy_add_alibi(scores, slopes, offset)

        def verify():
            scores.fill(0)
            run()
            return case.check(sampled())
        return Impl("numpy", "NumPy expression (per head)", run, verify)

    def torch_impl():
        def build():
            torch = torch_or_unavailable()
            ts = torch.from_numpy(scores)
            tslopes = torch.from_numpy(slopes)
            rel = (torch.arange(k_len, dtype=torch.float64)
                   - (offset + torch.arange(q_len, dtype=torch.float64))[:, None])

            def run():
                for h in range(heads):
                    ts[h] += (tslopes[h] * rel).to(ts.dtype)
                return ts

            def verify():
                scores.fill(0)
                run()
                return case.check(sampled())
            return Impl("torch", "PyTorch eager (per head)", run, verify)
        return build

    builders = {"posenc_fast": ours, "limit": limit, "numpy": numpy_expr, "torch": torch_impl()}
    case = Case("alibi", "add_alibi in place", dtype, tuple(shape), 2 * scores.nbytes,
                "np.multiply(s, 1, out=s)", 1.3, "<= 1.3x", builders, reference)
    return case


# ---------------------------------------------------------------------------
# the table of workloads


@dataclass(frozen=True)
class Workload:
    """A named workload: how to build it at its real shape and at a small one."""

    key: str
    title: str
    shape: tuple
    small_shape: tuple
    build: Callable[..., Case]
    big: bool = False  # the CI-sized (--benchmark-disable) run uses small_shape
    dtypes: tuple = ("float32", "float64")
    threaded: bool = True  # large enough for the threads axis
    kinds: tuple = KINDS

    def case(self, dtype, small: bool = False) -> Case:
        return self.build(dtype, self.small_shape if small else self.shape)


def _w2_positions(batch: int) -> np.ndarray:
    # One position per sequence: 16 sequences of varied lengths (a decode step).
    return _rng().integers(17, 4000, size=(batch, 1, 1))


WORKLOADS: dict[str, Workload] = {w.key: w for w in [
    Workload("w1_oop", "W1 RoPE prefill, out-of-place", (1, 32, 4096, 128), (1, 32, 256, 128),
             lambda dt, s: _rope_case("w1_oop", "W1 RoPE prefill, out-of-place", dt, s, None, 0,
                                      goal=1.15, goal_text="<= 1.15x")),
    Workload("w1_inplace", "W1 RoPE prefill, in place", (1, 32, 4096, 128), (1, 32, 256, 128),
             lambda dt, s: _rope_case("w1_inplace", "W1 RoPE prefill, in place", dt, s, None, 0,
                                      in_place=True, goal=1.3, goal_text="<= 1.3x")),
    Workload("w2_decode", "W2 decode step, 16 sequences", (16, 32, 1, 128), (16, 32, 1, 128),
             lambda dt, s: _rope_case("w2_decode", "W2 decode step, 16 sequences", dt, s,
                                      _w2_positions(s[0]), 0, goal=2.5, goal_text="<= 2.5x"),
             threaded=False),
    Workload("w3_token", "W3 one token (offset=4096)", (1, 32, 1, 128), (1, 32, 1, 128),
             lambda dt, s: _rope_case("w3_token", "W3 one token (offset=4096)", dt, s, None,
                                      W3_OFFSET, goal=2.5, goal_text="<= 2.5x"),
             threaded=False),
    Workload("w4_cos_sin", "W4 cos/sin for 131072 positions", (131072, 64), (8192, 64),
             lambda dt, s: _cos_sin_case(dt, s[0])),
    Workload("w5_sinusoidal_131072x128", "W5 sinusoidal_table 131072x128", (131072, 128),
             (8192, 128), lambda dt, s: _sinusoidal_case(dt, *s)),
    Workload("w5_sinusoidal_8192x1024", "W5 sinusoidal_table 8192x1024", (8192, 1024),
             (512, 1024), lambda dt, s: _sinusoidal_case(dt, *s)),
    Workload("apply_qk", "apply_qk q (1,32,4096,128) + k (1,8,4096,128)",
             ((1, 32, 4096, 128), (1, 8, 4096, 128)), ((1, 32, 256, 128), (1, 8, 256, 128)),
             lambda dt, s: _apply_qk_case(dt, *s)),
    Workload("alibi", "add_alibi in place (32,4096,4096)", (32, 4096, 4096), (32, 256, 256),
             lambda dt, s: _alibi_case(dt, s), big=True, dtypes=("float32",),
             kinds=("posenc_fast", "limit", "numpy", "torch")),
]}

# What `python -m posenc_fast bench` runs (issue 7's list).
CLI_WORKLOADS = ("w1_oop", "w1_inplace", "w2_decode", "w3_token", "w4_cos_sin",
                 "w5_sinusoidal_131072x128", "w5_sinusoidal_8192x1024")


def build_case(key: str, dtype, small: bool = False) -> Case:
    """Build workload `key` at `dtype` (small: the reduced shape)."""
    return WORKLOADS[key].case(dtype, small)


def small_from_environment() -> bool:
    """True when POSENC_FAST_BENCH_SMALL asks for the reduced shapes."""
    return os.environ.get("POSENC_FAST_BENCH_SMALL", "").strip() not in ("", "0")


def machine_line() -> str:
    """``<CPU model>, <n> cores`` (Linux), or the platform's processor string."""
    import platform

    model = None
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model or platform.processor() or platform.machine()}, {os.cpu_count()} cores"


@dataclass
class Row:
    """One implementation of a case, checked and timed."""

    kind: str
    label: str
    timing: Timing
    diff: Diff | None


def time_case(case: Case, kinds, *, rounds: int, target_ns: int, warmup: int = 1,
              threads: Mapping[str, int] | None = None,
              progress: Callable[[str], None] | None = None,
              budget_s: float | None = None) -> tuple[dict[str, Row], dict]:
    """Check, then time the `kinds` of `case` interleaved; skip the unavailable ones.

    `threads` maps a kind to the thread count set before each of its samples.
    Returns ``(rows by kind, {kind: reason} for the kinds skipped)``.
    """
    impls, skipped = {}, {}
    for kind in kinds:
        if progress is not None:
            progress(f"{kind}: setup and check")
        try:
            impls[kind] = case.impl(kind)
        except Unavailable as exc:
            skipped[kind] = str(exc)
    diffs = {}
    with restored_threads():
        for kind, impl in impls.items():
            if threads and kind in threads:
                set_threads(threads[kind])
            diffs[kind] = impl.verify()
    before = {kind: (lambda n=n: set_threads(n)) for kind, n in (threads or {}).items()
              if kind in impls}
    timings = measure({kind: impl.run for kind, impl in impls.items()}, rounds=rounds,
                      target_ns=target_ns, warmup=warmup, before=before, progress=progress,
                      budget_s=budget_s)
    rows = {kind: Row(kind, impl.label, timings[kind], diffs[kind]) for kind, impl in impls.items()}
    return rows, skipped


def format_time(ns: float) -> str:
    """A duration with a unit a person reads at a glance."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"
