"""Choose the row kernels for this CPU, then load only those.

``_core`` (compiled once, portable flags) carries the baseline kernels.
setup.py also compiles them into ``_isa_avx2``, ``_isa_avx512`` and
``_isa_avx512bf16`` (AVX-512 kernels that round bfloat16 with AVX512_BF16)
with wider instruction sets.  This module asks the CPU what it supports
(``_cpu``, portable) before importing any variant: a variant's module may
use its instructions anywhere, its init included, so importing it on a CPU
without them would kill the interpreter.  Every variant gives bitwise the
same results; the wider ones are only faster, and AVX-512 not on every CPU
that has it (`prefer_avx512`).  The environment variable ``POSENC_FAST_ISA``
(``baseline``, ``avx2``, ``avx512``, ``avx512bf16``) forces a variant, if it was built and
the CPU supports it; without it, the choice ``python -m posenc_fast tune``
stored for this CPU (`tune_file`) wins over the table of `prefer_avx512`.
"""

import importlib
import importlib.util
import json
import os
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np

from . import _core, _cpu

ENV_VAR = "POSENC_FAST_ISA"
TUNE_ENV_VAR = "POSENC_FAST_TUNE_FILE"
# Widest first.
PREFERENCE = ("avx512bf16", "avx512", "avx2", "baseline")
# The AVX-512 kernels; where AVX-512 is preferred, the first usable one.
AVX512 = ("avx512bf16", "avx512")


def prefer_avx512(vendor: str, family: int, model: int) -> tuple[bool, str]:
    """Whether the AVX-512 kernels beat the AVX2 ones on this CPU, and why.

    Parameters
    ----------
    vendor, family, model
        ``_cpu.cpu_identity()``: the CPUID vendor string, display family and model.

    Returns
    -------
    (bool, str)
        True where AVX-512 was measured faster; the reason in words.

    Notes
    -----
    Measured (``bench/bench_isa.py``, one thread, medians of interleaved
    ratios) on AMD EPYC Zen 5 (family 0x1A), avx512 / avx2: W1 from memory
    0.81-0.96 (in place 0.95-0.96 with the aligned head), in cache 0.83-1.04,
    W3 0.69-0.88, apply_qk 0.83-0.91, add_alibi 0.65-0.92, tables 0.92-1.03,
    half rows 0.96-1.01.
    On Intel Xeon family 6 model 0xCF (a 2-core KVM guest), avx512 / avx2:
    W1 from memory 0.96-1.02, W3 0.96, W4/W5 tables 0.98-1.00, apply_qk
    0.98, add_alibi 0.96, float16 W1 0.78-0.95, bfloat16 W1 0.57-0.77,
    head_dim 100 0.98-0.99.  On Intel Xeon family 6 model 0xA7 (AVX512_BF16
    and FP16, AMX; a 2-core KVM guest, 2026-12-07), avx512bf16 / avx2: W3
    0.77, add_alibi 0.74, W5 0.83-0.87, bfloat16 W1 0.62-0.82, float16 W1
    0.72-0.98, W4 and apply_qk 0.99, head_dim 100 0.98 / 1.07 out of place /
    in place, but W1 float32 / float64 from memory out of place 1.14 / 1.14
    (every variant within those rows' goal) and in place 1.04 / 0.99.
    Other Intel models after Skylake-SP take what those two favour, and say
    they were not measured.
    On AMD EPYC Zen 4 (family 0x19 model 0x11, a 2-core KVM guest; every
    family 0x19 CPU with AVX-512 is a Zen 4), avx512 / avx2, two runs: W1
    from memory float32 0.98, float64 1.02-1.08 out of place, 0.86-0.88 in
    place (float32 1.04), W3 0.96-1.05, W4/W5 tables 0.85-1.03, apply_qk
    0.96-1.00, add_alibi 0.99, float16 W1 0.92-0.96, bfloat16 W1 0.87-0.92,
    in cache (``--small``) 0.76-1.01 but W3 1.10: half types and float64 in
    place gain, though Zen 4 runs 512-bit operations as two 256-bit halves.
    Intel Skylake-SP and Cascade Lake (family 6, model 0x55) lower the clock
    for 512-bit floating-point work, also for the other cores' code: AVX2
    until a measurement says otherwise (``python -m posenc_fast tune``
    measures this machine).
    """
    if vendor == "AuthenticAMD" and family >= 0x1A:
        return True, "measured faster on AMD Zen 5 and later"
    if vendor == "AuthenticAMD" and family == 0x19:
        return True, "measured faster on AMD Zen 4 (model 0x11) in half precision and float64 in place"
    if vendor == "GenuineIntel" and family == 6 and model == 0x55:
        return False, "Intel Skylake-SP/Cascade Lake lower the clock for 512-bit work"
    if vendor == "GenuineIntel" and family == 6 and model in (0xCF, 0xA7):
        return True, f"measured faster on Intel family 6 model {model:#x}"
    if vendor == "GenuineIntel" and family == 6 and model > 0x55:
        return True, ("not measured on this model; measured faster on Intel models 0xcf and "
                      "0xa7")
    return False, "not measured faster on this CPU"


def block_bytes(vendor: str, family: int, model: int) -> dict[str, tuple[int | None, str]]:
    """The walks' block sizes on this CPU: ``"position"``, bytes of cos/sin rows per work item
    of the in-place walks past the caches (streamed results keep the build's
    ``POSENC_POSITION_BLOCK_BYTES``); ``"row"``, per kernel call of the walks below them;
    ``"group"`` and ``"group_interleaved"``, the longest half-layout and interleaved row the
    walks past the caches take a few heads at a time; ``"scalar_in_place"``, the shortest
    half-layout row they rotate in place by the scalar kernel (shorter ones: the vectors);
    ``"add"``, bytes of table rows per turn of add_position_table's walk over batches at the
    same positions (0: each batch whole); ``"stream"``, the least out-of-place rotation result
    written with non-temporal stores; ``"lines"``, the least out-of-place float16 / bfloat16
    result below it whose rows off a 64-byte line are written by whole lines (0: never).

    Parameters
    ----------
    vendor, family, model
        ``_cpu.cpu_identity()``.

    Returns
    -------
    dict of (int or None, str)
        Each size, or None for the build's (512 KiB, 16 KiB, 0, 0, 512 bytes,
        0, 16 MiB and 0), and the reason in words.

    Notes
    -----
    Measured with ``bench/sweep.py`` (bench/sweeps.md).  AMD EPYC Zen 4
    (family 0x19 model 0x11): position blocks of 4 MiB against 512 KiB, quiet,
    W1 in place float32 1.67 -> 1.48x its limit, float64 1.44 -> 1.21x,
    bfloat16 1.49 -> 1.06x, float16 1.42 -> 0.81x, head_dim 64-256 0.15-0.3x
    lower, beside the hog alike; out of place up to 0.3x lower, but beside
    the hog head_dim 100 out of place ran 3.8-4.2x its copy in some
    processes (1.1x with 512 KiB): in place only.  Row blocks of 8 KiB
    against 16 KiB, quiet and hog, 5 processes: the in-cache rows 0.05-0.35x
    lower (W1 (1,32,256,128) out of place 1.55 -> 1.20x, apply_qk 1.49 ->
    1.34x; (1,32,32,128) out of place 1.32 -> 1.03x).  AMD EPYC Zen 5
    (family 0x1A, 2026-12-01): 512 KiB best (1 MiB lost float64 in place,
    1.21 against 1.13x), 16 KiB best (8 KiB lost in place 1.15 against
    1.02x).  Zen 4's other models take its values, unmeasured.  Heads in
    groups of four for half-layout rows of at most 768 bytes and interleaved
    ones of at most 2 KiB, Zen 4 (2026-12-06): see ``POSENC_GROUP_ROW_BYTES``
    in csrc/posenc_config.h.  Intel Xeon family 6 model 0xA7 (2026-12-07,
    ``python -m posenc_fast tune --dry-run``, Zen 4's sizes / the build's):
    position blocks of 4 MiB 1.36-1.67x (W1 in place float32, float64,
    bfloat16, head_dim 256), row blocks of 8 KiB 0.99-1.01x, head groups
    1.14-2.04x (768 bytes) and 0.87-1.38x (2 KiB, interleaved; float64 out
    of place the one gain): the build's values there.  The scalar in-place
    kernel from 4 KiB rows instead of 512 bytes (the vectors below), Intel
    model 0xA7, W1 in place, one process, the size switched between
    interleaved rounds: float64 head_dim 128 1.36-1.42 -> 1.22-1.27x its
    limit, 256 1.50 -> 1.34x, float32 head_dim 128 1.17 -> 1.08x, 192 1.09
    -> 1.02x, 256 1.09 -> 1.06x, 512 1.08 -> 1.11x; on the Zen 4 the vectors
    lost 1 KiB rows (float64 1.29-1.51 -> 1.78x, float32 head_dim 256
    1.39-1.47 -> 2.15x: POSENC_SCALAR_IN_PLACE_ROW_BYTES).  add_position_table
    in turns of 256 KiB of table rows over the batches, model 0xA7, (8,2048,
    1024) float32 in place, the same way: 1.54-1.79 -> 1.13-1.20x (turns lost
    on the Zen 3 and Zen 4: POSENC_ADD_BLOCK_BYTES).  Out-of-place rotations
    streamed from 48 MiB instead of 16 MiB, model 0xA7 (2026-12-07, the
    result written by a copy just before each call, median of 9): bfloat16
    (1,32,4096,128) 8.2 -> 3.7 ms, float32 (1,32,2560,128) 8.1 -> 3.6 ms;
    from 64 MiB streaming still gains (float32 (1,32,4096,128) 8.1 against
    8.9 ms, bfloat16 (1,32,16384,128) 22.0 against 25.7 ms), and report.py's
    float32 rows just under 64 MiB ran 1.36-1.57x their copy unstreamed (met
    streamed).  The Zen 4's sweeps chose 16 MiB (POSENC_STREAM_BYTES).
    Half-layout half-type results written by whole lines from 2 MiB, model
    0xA7 (NumPy's arrays, 16 bytes past a line; each setting against its own
    copy, alternating): bfloat16 W1 out of place 1.24-1.37 -> 1.17-1.25x its
    copy, float16 1.19-1.36 -> 1.11-1.25x, head_dim 256 no gain, 2 MiB
    1.10-1.13 -> 1.05-1.06x, 1 MiB 1.45-1.58 -> 1.31-1.51x, 512 KiB and less
    within noise; interleaved rows no gain (POSENC_LINE_ROWS_BYTES).  Not
    measured on the AMD EPYC: never there.
    """
    if vendor == "AuthenticAMD" and family == 0x19 and any(model in models for models in _ZEN4_MODELS):
        where = "AMD Zen 4, " + ("measured" if model == 0x11 else "not measured on this model, measured on model 0x11")
        return {**_the_builds(where), "position": (4 << 20, f"4 MiB: {where}"), "row": (8 << 10, f"8 KiB: {where}"),
                "group": (768, f"768 bytes: {where}"), "group_interleaved": (2048, f"2048 bytes: {where}")}
    if vendor == "GenuineIntel" and family == 6 and model == 0xA7:
        where = "Intel family 6 model 0xa7, measured"
        return {**_the_builds(where), "scalar_in_place": (4096, f"4096 bytes: {where}"),
                "add": (256 << 10, f"256 KiB: {where}"), "stream": (48 << 20, f"48 MiB: {where}"),
                "lines": (2 << 20, f"2 MiB: {where}")}
    return _the_builds("measured on AMD Zen 5", group="groups not measured on this CPU",
                       scalar_in_place="measured on AMD Zen 4", add="measured on AMD Zen 3 and Zen 4",
                       stream="measured on AMD Zen 3, Zen 4 and Zen 5")


_ZEN4_MODELS = (range(0x10, 0x20), range(0x60, 0x80), range(0xA0, 0xB0))  # family 0x19's Zen 4 models
# Each size the build gives (None in block_bytes), in words, with the place for where it was measured
_BUILDS = {"position": "512 KiB: the build's ({})", "row": "16 KiB: the build's ({})",
           "group": "0, none: the build's (a head at a time; {})",
           "group_interleaved": "0, none: the build's (a head at a time; {})",
           "scalar_in_place": "512 bytes: the build's ({})", "add": "0, whole batches: the build's ({})",
           "stream": "16 MiB: the build's ({})", "lines": "0, never: the build's ({})"}


def _the_builds(where: str, **elsewhere: str) -> dict[str, tuple[None, str]]:
    """Every kind at the build's size, measured `where` (a kind in `elsewhere`: there; the
    interleaved groups as the half-layout ones; whole lines measured on Intel model 0xa7 only)."""
    elsewhere.setdefault("group_interleaved", elsewhere.get("group", where))
    elsewhere.setdefault("lines", "not measured on this CPU; measured on Intel model 0xa7")
    return {kind: (None, text.format(elsewhere.get(kind, where))) for kind, text in _BUILDS.items()}


def cache_folder() -> Path:
    """posenc_fast's per-user folder of what it builds or measures on this machine:
    ``$XDG_CACHE_HOME/posenc_fast`` (``~/.cache`` without it)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "posenc_fast"


def tune_file() -> Path:
    """Where ``python -m posenc_fast tune`` stores its choices: ``POSENC_FAST_TUNE_FILE``, else
    ``tune.json`` in `cache_folder`."""
    if os.environ.get(TUNE_ENV_VAR):
        return Path(os.environ[TUNE_ENV_VAR])
    return cache_folder() / "tune.json"


def cpu_key(cpu: tuple[str, int, int]) -> str:
    """The name a CPU's entry has in the tuning file (as ``build_info()["cpu"]``)."""
    return "{} family {:#x} model {:#x}".format(*cpu)


# The tuning file's format: what with_tuned writes and _tuned_entry reads
TUNE_VERSION = 1


def _tuned_entry(text: str | None, cpu: tuple[str, int, int]) -> dict | None:
    """`cpu`'s entry in the tuning file's text, or None (no file, no entry)."""
    if text is None:
        return None
    try:
        record = json.loads(text)
        version = record.get("version")
        entry = record.get("cpus", {}).get(cpu_key(cpu))
    except (ValueError, AttributeError, RecursionError) as error:
        raise ValueError(f"not a posenc_fast tuning file: {error!r}") from None
    if version != TUNE_VERSION:
        raise ValueError(f"its version is {version!r}, this posenc_fast reads version {TUNE_VERSION}: run "
                         f"python -m posenc_fast tune again")
    if entry is not None and not isinstance(entry, dict):
        raise ValueError(f"its entry for {cpu_key(cpu)} is not an object")
    return entry


def tuned_variant(text: str | None, cpu: tuple[str, int, int]) -> str | None:
    """The variant the tuning file's text records for `cpu`, or None (no file, no entry, or an
    entry of block sizes only).

    Raises ValueError for a file that is not the JSON ``tune`` writes.
    """
    entry = _tuned_entry(text, cpu)
    if entry is None or "variant" not in entry:
        return None
    if entry["variant"] not in PREFERENCE:
        raise ValueError(f"its entry for {cpu_key(cpu)} names no variant of {PREFERENCE}")
    return entry["variant"]


def tuned_blocks(text: str | None, cpu: tuple[str, int, int]) -> dict[str, int] | None:
    """The block sizes (`block_bytes`'s kinds, bytes) the tuning file's text records for `cpu`:
    those ``tune`` measured, or None (no file, no entry, no sizes).

    Raises ValueError for a file that is not the JSON ``tune`` writes.
    """
    entry = _tuned_entry(text, cpu)
    if entry is None or "blocks" not in entry:
        return None
    blocks = entry["blocks"]
    least = {kind: smallest for kind, (_, smallest) in _BLOCK_KINDS.items()}
    if not isinstance(blocks, dict) or not all(
            kind in least and type(size) is int and least[kind] <= size <= 2**40 for kind, size in blocks.items()):
        raise ValueError(f"its entry for {cpu_key(cpu)} has blocks that are not sizes in bytes of "
                         f"{tuple(least)} (position, row and stream >= 1, the others >= 0, each at most 2**40): "
                         f"{blocks!r}")
    return dict(blocks)


def with_tuned(text: str | None, cpu: tuple[str, int, int], entry: dict) -> str:
    """The tuning file's text with `cpu`'s entry replaced by `entry` (what ``tune`` measured:
    ``"variant"`` and its ``"ratios"``, ``"blocks"`` and theirs)."""
    try:
        record = json.loads(text) if text else {}
        cpus = dict(record.get("cpus", {})) if record.get("version") == TUNE_VERSION else {}
    except (ValueError, AttributeError, RecursionError, TypeError):
        cpus = {}  # a file tune cannot read is replaced
    cpus[cpu_key(cpu)] = entry
    return json.dumps({"version": TUNE_VERSION, "cpus": cpus}, indent=1, sort_keys=True) + "\n"


def choose(built: list[str], supported: list[str], requested: str,
           cpu: tuple[str, int, int], tuned: str | None = None) -> tuple[str, str]:
    """Return (variant, reason): the variant to load and why.

    Parameters
    ----------
    built, supported : list of str
        The variants compiled, and those the CPU can run.
    requested : str
        ``POSENC_FAST_ISA`` ("" when unset); a request that is not usable
        here warns and falls back to the automatic choice.
    cpu : (vendor, family, model)
        As ``_cpu.cpu_identity()`` returns them, for `prefer_avx512`.
    tuned : str, optional
        The variant ``python -m posenc_fast tune`` measured fastest on this
        CPU (`tuned_variant`); it wins over `prefer_avx512` where usable.

    Notes
    -----
    Where AVX-512 is preferred, ``avx512bf16`` comes before ``avx512``: the
    same kernels, bfloat16 rounded by vcvtne2ps2bf16 to the same bits
    (``bench/bench_isa.py --variants avx512,avx512bf16`` on AMD Zen 4:
    bfloat16 W1 0.63-0.85, the other rows 0.96-1.01; on Intel model 0xA7
    bfloat16 W1 0.75-0.90, float16 in place 0.87, the other rows 0.97-1.01).
    """
    usable = [name for name in PREFERENCE if name in built and name in supported]
    requested = requested.strip().lower()
    if requested in usable:
        return requested, f"forced by {ENV_VAR}={requested}"
    if requested:
        warnings.warn(f"{ENV_VAR}={requested!r} is not available here (usable: {usable}); "
                      "choosing as if unset", RuntimeWarning, stacklevel=3)
    if tuned in usable:
        return tuned, f"{tuned}: measured fastest on this CPU by python -m posenc_fast tune"
    if tuned:
        warnings.warn(f"the tuning file names {tuned!r}, which is not usable here (usable: "
                      f"{usable}); choosing as if it did not", RuntimeWarning, stacklevel=3)
    wide = [name for name in usable if name in AVX512]
    if wide:
        if "avx2" not in usable:
            return wide[0], f"{wide[0]}: supported; avx2 not built"
        faster, why = prefer_avx512(*cpu)
        if faster:
            return wide[0], f"{wide[0]}: supported, {why}"
        return "avx2", f"avx2: avx512 supported but {why}"
    best = usable[0]
    wider = PREFERENCE[:PREFERENCE.index(best)]
    return best, f"{best}: " + "; ".join(
        f"{name} not built" if name not in built else f"{name} not supported by the CPU (or its OS)"
        for name in wider)


def _read_tuned(cpu: tuple[str, int, int]) -> tuple[str | None, dict[str, int] | None]:
    """(variant, blocks) of the tuning file for `cpu`; (None, None) where it has none or is broken."""
    try:
        text = tune_file().read_text()
        return tuned_variant(text, cpu), tuned_blocks(text, cpu)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as error:  # unreadable (a folder, not UTF-8) or not what tune writes
        warnings.warn(f"{tune_file()} ignored: {error}", RuntimeWarning, stacklevel=2)
        return None, None


# Each block size (`block_bytes`'s kinds, _core.set_block_bytes's arguments): its build macro, its least value
_BLOCK_KINDS = {"position": ("POSENC_POSITION_BLOCK_BYTES", 1), "row": ("POSENC_ROW_BLOCK_BYTES", 1),
                "group": ("POSENC_GROUP_ROW_BYTES", 0),
                "group_interleaved": ("POSENC_GROUP_INTERLEAVED_ROW_BYTES", 0),
                "scalar_in_place": ("POSENC_SCALAR_IN_PLACE_ROW_BYTES", 0),
                "add": ("POSENC_ADD_BLOCK_BYTES", 0), "stream": ("POSENC_STREAM_BYTES", 1),
                "lines": ("POSENC_LINE_ROWS_BYTES", 0)}
BLOCK_KINDS = tuple(_BLOCK_KINDS)


def block_sizes(cpu: tuple[str, int, int], built: dict[str, tuple[int, bool]],
                tuned: dict[str, int] | None = None) -> dict[str, tuple[int, str]]:
    """The walks' block sizes for `cpu`, and why each: a size the build was given stands, then
    the one ``tune`` measured on this CPU (`tuned`), then `block_bytes`'s table, then the build's.

    Parameters
    ----------
    cpu : (vendor, family, model)
    built : dict
        ``_core.block_bytes()``: each kind's (bytes, whether the build was given it).
    tuned : dict, optional
        `tuned_blocks` of the tuning file.
    """
    sizes = {}
    for kind, (nbytes, why) in block_bytes(*cpu).items():
        size, given = built[kind]
        if given:
            sizes[kind] = size, f"set by the build (-D{_BLOCK_KINDS[kind][0]})"
        elif tuned and kind in tuned:
            sizes[kind] = tuned[kind], f"{tuned[kind]} bytes: measured on this CPU by python -m posenc_fast tune"
        else:
            sizes[kind] = size if nbytes is None else nbytes, why
    return sizes


def _use_block_bytes(cpu: tuple[str, int, int], tuned: dict[str, int] | None) -> dict[str, str]:
    """Set the walks' block sizes (`block_sizes`); return why each."""
    sizes = block_sizes(cpu, _core.block_bytes(), tuned)
    _core.set_block_bytes(**{kind: size for kind, (size, _) in sizes.items()})
    return {kind: why for kind, (_, why) in sizes.items()}


def variant_module(name: str):
    """The compiled module of a vector variant (import only one the CPU supports)."""
    return importlib.import_module(f"posenc_fast._isa_{name}")


BUILT = [name for name in PREFERENCE
         if name == "baseline" or importlib.util.find_spec(f"posenc_fast._isa_{name}")]
CPU_SUPPORTS = _cpu.cpu_supports()
TUNED_VARIANT, TUNED_BLOCKS = _read_tuned(_cpu.cpu_identity())
ISA_IN_USE, ISA_REASON = choose(BUILT, CPU_SUPPORTS, os.environ.get(ENV_VAR, ""),
                                _cpu.cpu_identity(), TUNED_VARIANT)
if ISA_IN_USE != "baseline":
    _core.use_kernels(variant_module(ISA_IN_USE).KERNELS)
BLOCK_REASONS = _use_block_bytes(_cpu.cpu_identity(), TUNED_BLOCKS)
_core.set_bfloat16_typenum(np.dtype(ml_dtypes.bfloat16).num)
kernels = _core
