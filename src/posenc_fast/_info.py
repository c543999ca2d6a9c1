"""build_info(): the facts of this build and of the running machine."""

from typing import Any

from . import _cpu, _dispatch
from ._threads import get_num_threads
from ._version import __version__


def build_info() -> dict[str, Any]:
    """Return the build facts: version, compiler, instruction sets, thread pool, threads.

    Returns
    -------
    dict
        ``version``; ``compiler``; ``isa_built`` (kernel variants compiled),
        ``isa_supported`` (variants this CPU can run), ``isa_in_use`` (the
        variant loaded, overridable with ``POSENC_FAST_ISA``), ``isa_reason``
        (why that one and which source decided: the environment variable,
        ``python -m posenc_fast tune``'s file, or the table of measured CPUs,
        e.g. "avx512: supported, measured faster on AMD Zen 5 and later";
        a CPU in no row says "not measured"), ``cpu`` (vendor, family, model), ``simd`` (the
        widest SIMD level that variant was compiled for); ``thread_pool``
        (True where large calls can use worker threads: the pthread pool);
        ``num_threads``; ``position_block_bytes`` and ``row_block_bytes``
        (cos/sin bytes per work item of the in-place walks past the caches,
        and per kernel call below them: by CPU), ``group_row_bytes`` and
        ``group_interleaved_row_bytes`` (the longest half-layout and
        interleaved row the walks past the caches take a few heads at a time;
        0: none), ``scalar_in_place_row_bytes`` (the shortest half-layout
        row rotated in place past the caches by the scalar kernel, shorter
        ones by the vectors: by CPU), ``add_block_bytes`` (table rows per turn
        of add_position_table over batches at the same positions; 0: each
        batch whole), ``stream_bytes`` (the least out-of-place rotation
        result written with non-temporal stores: by CPU), ``line_rows_bytes``
        (the least out-of-place float16 / bfloat16 result below it whose
        rows off a 64-byte line are written by whole lines; 0: never) and their
        ``..._reason`` (which source decided: the build, ``tune``'s file, or
        the table of measured CPUs).
    """
    kernels = _dispatch.kernels
    blocks = kernels.block_bytes()
    return {
        "version": __version__,
        "compiler": _cpu.compiler(),
        "isa_built": [name for name in reversed(_dispatch.PREFERENCE) if name in _dispatch.BUILT],
        "isa_supported": list(_dispatch.CPU_SUPPORTS),
        "isa_in_use": _dispatch.ISA_IN_USE,
        "isa_reason": _dispatch.ISA_REASON,
        "cpu": "{} family {:#x} model {:#x}".format(*_cpu.cpu_identity()),
        "simd": kernels.simd_level(),
        "thread_pool": kernels.thread_pool_enabled(),
        "num_threads": get_num_threads(),
        "position_block_bytes": blocks["position"][0],
        "position_block_reason": _dispatch.BLOCK_REASONS["position"],
        "row_block_bytes": blocks["row"][0],
        "row_block_reason": _dispatch.BLOCK_REASONS["row"],
        "group_row_bytes": blocks["group"][0],
        "group_row_reason": _dispatch.BLOCK_REASONS["group"],
        "group_interleaved_row_bytes": blocks["group_interleaved"][0],
        "group_interleaved_row_reason": _dispatch.BLOCK_REASONS["group_interleaved"],
        "scalar_in_place_row_bytes": blocks["scalar_in_place"][0],
        "scalar_in_place_row_reason": _dispatch.BLOCK_REASONS["scalar_in_place"],
        "add_block_bytes": blocks["add"][0],
        "add_block_reason": _dispatch.BLOCK_REASONS["add"],
        "stream_bytes": blocks["stream"][0],
        "stream_reason": _dispatch.BLOCK_REASONS["stream"],
        "line_rows_bytes": blocks["lines"][0],
        "line_rows_reason": _dispatch.BLOCK_REASONS["lines"],
    }
