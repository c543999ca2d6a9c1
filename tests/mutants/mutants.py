"""Deliberate bugs, one a line: each must make the tests it names fail (run.py applies them).

Each mutant is (name, layer of docs/architecture.md, file under the
repository root, the text replaced (exactly once in that file), its
replacement, the tests that must notice).  A mutant of a compiled source
(``.pyx``/``.pxi``/``.h``/``.tp``) is built before its tests run; ``isa``
names the variant whose kernels it changes (the tests then run that one).
"""

from typing import NamedTuple


class Mutant(NamedTuple):
    name: str
    layer: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    isa: str = "baseline"


PKG = "src/posenc_fast/"
KERNELS = PKG + "csrc/posenc_kernels.h.tp"
VECTORS = PKG + "csrc/posenc_vectors.h.tp"

MUTANTS = [
    # row kernels
    Mutant("rotation step sign (half layout, out of place)", "row kernels", KERNELS,
           "            oa[i] = {{st}}(a * ci - b * si);", "            oa[i] = {{st}}(a * ci + b * si);",
           ("tests/test_rotary.py",)),
    Mutant("rotation step sign (half layout, in place)", "row kernels", KERNELS,
           "            xb[i] = {{st}}(b * ci + a * si);", "            xb[i] = {{st}}(b * ci - a * si);",
           ("tests/test_rotary.py",)),
    Mutant("interleaved pairs written swapped", "row kernels", KERNELS,
           "            out[2 * (i0 + i)] = ra[i];\n            out[2 * (i0 + i) + 1] = rb[i];",
           "            out[2 * (i0 + i)] = rb[i];\n            out[2 * (i0 + i) + 1] = ra[i];",
           ("tests/test_rotary.py",)),
    Mutant("streamed run loses its last 16 bytes", "row kernels", VECTORS,
           "    for (Py_ssize_t i = 0; i < nbytes; i += 16)",
           "    for (Py_ssize_t i = 0; i + 16 < nbytes; i += 16)",
           ("tests/test_sizes.py", "-k", "streamed"), isa="avx2"),
    Mutant("bfloat16 rounding truncates", "row kernels", PKG + "csrc/posenc_half.h",
           "    return (posenc_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);",
           "    return (posenc_bf16)(u >> 16);", ("tests/test_half.py",)),
    Mutant("round-to-odd never sets the sticky bit", "row kernels", PKG + "csrc/posenc_half.h",
           "        u |= 1;\n", "", ("tests/test_half.py",)),
    # compiled layer
    Mutant("block walk one row short", "compiled layer", PKG + "_core_rotary.pxi",
           "    cdef Py_ssize_t rows = min(job.block_size, plan.seq - first), o, r",
           "    cdef Py_ssize_t rows = min(job.block_size, plan.seq - first - 1), o, r",
           ("tests/test_rotary.py", "tests/test_fast_path_rules.py")),
    Mutant("KV cache value slot written from k", "compiled layer", PKG + "_core_cache.pxi",
           "            memcpy(v_slot, v_row, w.kv_heads * w.row_bytes)",
           "            memcpy(v_slot, k_row, w.kv_heads * w.row_bytes)",
           ("tests/test_kv_cache.py",)),
    Mutant("features before rotary_start not copied", "compiled layer", PKG + "_core_rotate.pxi",
           "    if call.lead_bytes > 0:\n        memcpy(out, x, call.lead_bytes)",
           "    if call.lead_bytes > 8:\n        memcpy(out, x, call.lead_bytes)",
           ("tests/test_rotary_start.py",)),
    Mutant("fast path out overlap check removed", "compiled layer", PKG + "_core_rotary.pxi",
           "    if arr is not x and not _disjoint(arr, x):",
           "    if False and arr is not x and not _disjoint(arr, x):",
           ("tests/test_fast_path_rules.py",)),
    Mutant("fast-path switch ignored by the cos/sin walk", "compiled layer", PKG + "_core_walk.pxi",
           "    if (not _fast_paths_on or n > 2", "    if (n > 2", ("tests/test_fast_path_rules.py",)),
    Mutant("attention factor left out of the cos/sin cache", "compiled layer", PKG + "_core_rotary.pxi",
           "                     self.factor, table[rows:, 0], table[rows:, 1], work, threads)",
           "                     1.0, table[rows:, 0], table[rows:, 1], work, threads)",
           ("tests/test_rotary.py", "tests/test_frequencies.py")),
    Mutant("vLLM fast path takes a cache of another dtype", "compiled layer", PKG + "_core_tokens.pxi",
           "        if ((cnp.PyArray_TYPE(x) != cnp.PyArray_TYPE(c)\n",
           "        if ((False\n", ("tests/test_vllm.py",)),
    Mutant("vLLM fast path sees no overlap between q and k", "compiled layer", PKG + "_core_tokens.pxi",
           "    if n == 2 and not _rows_disjoint(&rows[0], &rows[1], tokens):",
           "    if False and not _rows_disjoint(&rows[0], &rows[1], tokens):", ("tests/test_vllm.py",)),
    Mutant("q/k norm without its eps", "row kernels", PKG + "csrc/posenc_tables.h.tp",
           "(1.0 / sqrt(total / (double)n + eps));", "(1.0 / sqrt(total / (double)n));",
           ("tests/test_qk_norm.py",)),
    Mutant("Gemma's 1 + weight lost", "KV cache, q/k norm", PKG + "_qk_norm.py",
           "    return np.ascontiguousarray(weight.astype(np.float64) + weight_offset)",
           "    return np.ascontiguousarray(weight.astype(np.float64))", ("tests/test_qk_norm.py",)),
    # thread pool
    Mutant("a worker runs an item twice", "thread pool", PKG + "csrc/posenc_pool.h",
           "        posenc_pool.fn(posenc_pool.ctx, (Py_ssize_t)(posenc_pool.n - left), (int)slot);",
           "        posenc_pool.fn(posenc_pool.ctx, (Py_ssize_t)(posenc_pool.n - left), (int)slot);\n"
           "        posenc_pool.fn(posenc_pool.ctx, (Py_ssize_t)(posenc_pool.n - left), (int)slot);",
           ("tests/test_thread_pool.py",)),
    # validation
    Mutant("overlap check removed", "validation", PKG + "_validate.py",
           "    return np.may_share_memory(a, b) and np.shares_memory(a, b)", "    return False",
           ("tests/test_fast_path_rules.py", "tests/test_rotary.py")),
    # public API
    Mutant("sinusoidal layout switch inverted", "public API", PKG + "absolute.py",
           "    kernels.sinusoidal_rows(positions, freqs, target, split,",
           "    kernels.sinusoidal_rows(positions, freqs, target, not split,",
           ("tests/test_sinusoidal.py",)),
    Mutant("ALiBi slopes of the first power of two off by one", "public API", PKG + "relative.py",
           "        result[h] = 2.0 ** (-8 * (h + 1) / closest)", "        result[h] = 2.0 ** (-8 * h / closest)",
           ("tests/test_relative.py",)),
    # scalings
    Mutant("linear scaling multiplies", "model rules, scalings", PKG + "_frequencies.py",
           '        inv_freq = _default_inv_freq(base, rotary_dim) / p["factor"]\n    elif rope_type == "proportional":',
           '        inv_freq = _default_inv_freq(base, rotary_dim) * p["factor"]\n    elif rope_type == "proportional":',
           ("tests/test_frequencies.py",)),
    Mutant("mRoPE sections assigned in reverse", "model rules, scalings", PKG + "_streams.py",
           "    return np.repeat(np.arange(len(section)), section)",
           "    return np.repeat(np.arange(len(section))[::-1], section[::-1])", ("tests/test_streams.py",)),
    # model rules
    Mutant("DeepSeek-V4 rotates its leading features", "model rules, scalings", PKG + "_hf_models.py",
           'whole_head=False, trailing=True,', 'whole_head=False, trailing=False,',
           ("tests/test_hf_models.py", "-k", "deepseek_v4")),
    Mutant("the probe reads interleaved pairs as halves", "model rules, scalings", PKG + "_hf_probe.py",
           '        layout, firsts = "interleaved", [start + 2 * i for i in range(width // 2)]',
           '        layout, firsts = "half", [start + 2 * i for i in range(width // 2)]',
           ("tests/test_hf_probe.py",)),
    Mutant("a model rule's layout flipped (Cohere)", "model rules, scalings", PKG + "_hf_models.py",
           '    "cohere": ModelRule("cohere/modeling_cohere.py", "interleaved"),',
           '    "cohere": ModelRule("cohere/modeling_cohere.py"),',
           ("tests/test_hf_models.py", "-k", "cohere")),
    # plan
    Mutant("row table ignores broadcasting", "plan", PKG + "_rows.py",
           "    broadcast = np.broadcast_to(index.astype(np.intp, copy=False), rows_shape)",
           "    broadcast = np.resize(index.astype(np.intp, copy=False), rows_shape)",
           ("tests/test_rotary_cos_sin.py",)),
    Mutant("thread limit never applied", "plan", PKG + "_threads.py",
           "    kernels.set_thread_limit(min(n, MAX_KERNEL_THREADS), MIN_ELEMENTS_PER_THREAD)",
           "    kernels.set_thread_limit(MAX_KERNEL_THREADS, MIN_ELEMENTS_PER_THREAD)",
           ("tests/test_build.py", "tests/test_thread_pool.py")),
    # KV cache
    Mutant("slot -1 accepted below", "KV cache", PKG + "_kv_cache.py",
           "    if ntokens and (int(slots.min()) < -1 or", "    if ntokens and (int(slots.min()) < -2 or",
           ("tests/test_kv_cache.py",)),
    # integrations
    Mutant("MLA cache row written before its rotation", "integrations", PKG + "_mla_cache.py",
           "    rotary_embedding(positions, q_pe, k_rows, rot_dim, cos_sin_cache, is_neox)  # checks, then rotates\n"
           "    _write(kv_c, k_rows, kv_cache, slots)",
           "    _write(kv_c, k_rows, kv_cache, slots)\n"
           "    rotary_embedding(positions, q_pe, k_rows, rot_dim, cos_sin_cache, is_neox)  # checks, then rotates",
           ("tests/test_vllm_mla.py",)),
    Mutant("vLLM op's neox flag inverted", "integrations", PKG + "vllm.py",
           '    layout = "half" if is_neox else "interleaved"\n    if key is None:',
           '    layout = "interleaved" if is_neox else "half"\n    if key is None:', ("tests/test_vllm.py",)),
    Mutant("the backward rotates forward again", "integrations", PKG + "_hf_drop_in.py",
           "    transpose = function._replace(inverse=not function.inverse, deinterleaves=False,",
           "    transpose = function._replace(inverse=function.inverse, deinterleaves=False,",
           ("tests/test_hf.py", "-k", "gradient")),
    Mutant("the drop-ins take the formula under torch.compile", "integrations", PKG + "_hf_drop_in.py",
           "        return _compiled_rotation(torch, function, xs, cos, sin, unsqueeze_dim)",
           "        return None", ("tests/test_hf_compile.py", "-k", "equals and llama")),
    Mutant("a fallback for a gradient goes uncounted", "integrations", PKG + "_hf_drop_in.py",
           '            _fell_back(torch, xs, "data the kernel does not compute exactly")',
           "            pass", ("tests/test_hf_fallbacks.py",)),
    Mutant("hf_rotate's formula passes unsqueeze_dim to a vision tower's function", "integrations",
           PKG + "torch_ops.py", "    if function.unsqueeze is not None:  # it unsqueezes at its own axis",
           "    if False:  # it unsqueezes at its own axis",
           ("tests/test_hf_gradcheck.py", "-k", "op_passes and qwen2_vl")),
    Mutant("a trailing-features function rotates the leading ones (DeepSeek-V4)", "integrations",
           PKG + "_hf_drop_in.py",
           "    start = xs[0].shape[-1] - 2 * cos.shape[-1] if function.trailing else 0",
           "    start = 0", ("tests/test_hf_deepseek_v4.py",)),
    Mutant("the vision towers' rotation by -theta", "model rules, scalings", PKG + "_hf_functions.py",
           '    return RotaryFunction(f"{module}/modeling_{module}.py", *args, unsqueeze=-2, **kwargs)',
           '    return RotaryFunction(f"{module}/modeling_{module}.py", *args, unsqueeze=-2, inverse=True, **kwargs)',
           ("tests/test_hf_vision.py",)),
    Mutant("GPT-J's (tensor, sin, cos) read as (tensor, cos, sin)", "integrations", PKG + "_hf_functions.py",
           '_GPTJ = dict(one_tensor=True, unsqueeze=2, parameters=("tensor", "sin", "cos"), dims=4)',
           '_GPTJ = dict(one_tensor=True, unsqueeze=2, parameters=("tensor", "cos", "sin"), dims=4)',
           ("tests/test_hf_install.py", "-k", "gptj")),
    Mutant("DINOv3's prefix tokens put after the patch tokens", "integrations", PKG + "_hf_drop_in.py",
           "np.concatenate((x[..., :prefix, :], r), axis=-2)", "np.concatenate((r, x[..., :prefix, :]), axis=-2)",
           ("tests/test_hf_install.py", "-k", "dinov3")),
    Mutant("Muse-Glimmer's assistant rotates q by the cache's first rows", "integrations", PKG + "_hf_drop_in.py",
           "(xs[:1], cos[..., -rows:, :], sin[..., -rows:, :],", "(xs[:1], cos[..., :rows, :], sin[..., :rows, :],",
           ("tests/test_hf_install.py", "-k", "muse_glimmer_assistant")),
    Mutant("PE's sums of rotation matrices keep the kernel's -0", "integrations", PKG + "_hf_drop_in.py",
           "        return tuple(_positive_zeros(np.ascontiguousarray(r))",
           "        return tuple((np.ascontiguousarray(r))", ("tests/test_hf_install.py", "-k", "positive_zero")),
    Mutant("CLVP's cache sliced to the first positions, not indexed by position_ids", "integrations", PKG + "hf.py",
           "                cos, sin = cos[positions], sin[positions]",
           "                cos, sin = cos[None, :positions.shape[-1]], sin[None, :positions.shape[-1]]",
           ("tests/test_hf_install.py", "-k", "clvp")),
    Mutant("vLLM op's rope_dim_offset ignored", "integrations", PKG + "vllm.py",
           "    if offset:  # the features from the offset on", "    if False:  # the features from the offset on",
           ("tests/test_vllm.py",)),
    # dispatch
    Mutant("the tuned variant ignored", "dispatch", PKG + "_dispatch.py",
           "    if tuned in usable:\n", "    if False:\n", ("tests/test_tune.py",)),
    Mutant("AVX-512 chosen on Zen 4", "dispatch", PKG + "_dispatch.py",
           '        return False, "AMD Zen 4 runs 512-bit operations as two 256-bit halves"',
           '        return True, "AMD Zen 4 runs 512-bit operations as two 256-bit halves"',
           ("tests/test_build.py",)),
    # bench, CLI
    Mutant("bench --compare never finds a slower ratio", "bench, CLI", PKG + "_cli_bench.py",
           '"SLOWER" if now["ratio"] > entry["allowed"] else "ok")',
           '"SLOWER" if now["ratio"] > 2 * entry["allowed"] else "ok")', ("tests/test_cli_bench.py",)),
    Mutant("bench --compare accepts another CPU's file", "bench, CLI", PKG + "_cli_bench.py",
           "    for key, want in (machine or {}).items():", "    for key, want in {}.items():",
           ("tests/test_cli_bench.py", "-k", "cpu")),
]
