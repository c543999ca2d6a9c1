/* What the compiled torch kernel (posenc_torch_kernel.cpp, built on the user's machine by
   `python -m posenc_fast build-torch-kernel`) and _core share: the C entries of vLLM's rotation,
   KV-cache write, fused q/k norm and MLA cache writes, and of posenc_fast.hf's rotation, which _core
   lends it by address (torch_kernel_entry()).  Plain C: _core is built without torch. */
#ifndef POSENC_TORCH_KERNEL_H
#define POSENC_TORCH_KERNEL_H

#include <stdint.h>

/* Changes whenever posenc_tensor or the entries change. */
#define POSENC_TORCH_ENTRY_VERSION 5

/* A tensor's dtype: posenc_fast_dtype's float codes (posenc_fast.h), and int64 for positions. */
enum {
    POSENC_TENSOR_FLOAT32 = 1,
    POSENC_TENSOR_FLOAT64 = 2,
    POSENC_TENSOR_FLOAT16 = 3,
    POSENC_TENSOR_BFLOAT16 = 4,
    POSENC_TENSOR_INT64 = 5
};

/* A strided CPU tensor: its first item, sizes and strides (in items), as torch holds them. */
typedef struct {
    void* data;
    int dtype;
    int nd;
    const int64_t* sizes;
    const int64_t* strides;
} posenc_tensor;

/* Each entry takes the common call of a posenc_fast.vllm function, every check made: 1, or 0 with
   nothing written where it does not take the call (then the general path checks it fully and raises
   what the function documents). */

/* rotary_embedding: query and key (NULL: none) rotated in place by their tokens' rows of the
   [cos | sin] cache. */
typedef int (*posenc_rotate_tokens_fn)(const posenc_tensor* positions, const posenc_tensor* query,
                                       const posenc_tensor* key, const posenc_tensor* cos_sin_cache,
                                       int64_t head_size, int64_t rope_dim_offset, int is_neox,
                                       int inverse);

/* apply_qk_to_cache: query rotated in place, the rotated key and the value written into their
   slots of the key and value caches (hnd: kv_cache_layout "HND", else "NHD"); with q_weight and
   k_weight (NULL: none) each head of query and key RMSNormed first (eps, weight_offset). */
typedef int (*posenc_tokens_to_cache_fn)(const posenc_tensor* positions, const posenc_tensor* query,
                                         const posenc_tensor* key, const posenc_tensor* value,
                                         const posenc_tensor* key_cache, const posenc_tensor* value_cache,
                                         const posenc_tensor* slot_mapping, int64_t head_size,
                                         const posenc_tensor* cos_sin_cache, int is_neox, int hnd,
                                         const posenc_tensor* q_weight, const posenc_tensor* k_weight,
                                         double eps, double weight_offset);

/* fused_qk_norm_rope: each head of query and key RMSNormed (weights q_weight, k_weight of any float
   dtype; eps; weight_offset) and rotated in place by its token's row of the [cos | sin] cache. */
typedef int (*posenc_norm_tokens_fn)(const posenc_tensor* positions, const posenc_tensor* query,
                                     const posenc_tensor* key, const posenc_tensor* q_weight,
                                     const posenc_tensor* k_weight, int64_t head_size,
                                     const posenc_tensor* cos_sin_cache, int is_neox, double eps,
                                     double weight_offset);

/* concat_and_cache_mla (positions, q_pe and cos_sin_cache NULL; is_neox unread) and
   concat_and_cache_mla_rope_fused: each token's [kv_c | k_pe] written into its slot's row of kv_cache
   (kv_cache_dtype "auto"), q_pe and k_pe first rotated in place by the token's row of the
   [cos | sin] cache. */
typedef int (*posenc_mla_to_cache_fn)(const posenc_tensor* positions, const posenc_tensor* q_pe,
                                      const posenc_tensor* k_pe, const posenc_tensor* kv_c,
                                      const posenc_tensor* cos_sin_cache, int is_neox,
                                      const posenc_tensor* slot_mapping, const posenc_tensor* kv_cache);

/* The data of a call's output j (C-contiguous, of xs[j]'s shape and dtype), made by the caller once
   every check passed; NULL: none (the entry then writes nothing and returns 0). */
typedef void* (*posenc_allocate_fn)(void* context, int j);

/* hf_rotate and _hf_rotate_no_grad (transpose false): what posenc_fast.hf's replacement of
   transformers.models.<family>'s function `name` returns for xs (q and k, or one tensor; n of them),
   into outputs from `allocate`, where posenc_fast named a rotation so (the ops' Python kernel names
   it on its first call). */
typedef int (*posenc_hf_rotate_fn)(const char* family, int64_t family_len, const char* name, int64_t name_len,
                                   const posenc_tensor* xs, int n, const posenc_tensor* cos,
                                   const posenc_tensor* sin, int64_t unsqueeze_dim, posenc_allocate_fn allocate,
                                   void* context);

typedef struct {
    posenc_rotate_tokens_fn rotate_tokens;
    posenc_tokens_to_cache_fn tokens_to_cache;
    posenc_norm_tokens_fn norm_tokens;
    posenc_mla_to_cache_fn mla_to_cache;
    posenc_hf_rotate_fn hf_rotate;
} posenc_torch_entries;

#endif
