// The CPU kernels of torch.ops.posenc_fast.rotary_embedding, apply_qk_to_cache, fused_qk_norm_rope,
// concat_and_cache_mla, concat_and_cache_mla_rope_fused, hf_rotate and _hf_rotate_no_grad in C++,
// against the torch they are built for (`python -m posenc_fast build-torch-kernel`; posenc_fast/_torch_kernel.py loads them).  torch's
// call of a kernel written in Python costs ~2.4 us however little it does; of one in C++ ~1.7 us,
// which is most of a decode step's op.  The common calls go to _core's entries (posenc_torch_kernel.h);
// every other call, and every error, to the op `_<name>_general`: the Python kernel, which raises
// what posenc_fast.vllm's function documents.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <torch/library.h>

#include <optional>
#include <vector>

#include "posenc_torch_kernel.h"

namespace {

const posenc_torch_entries* entries = nullptr;

// `t` as the entry reads it, or false: what the Python fast path (_core_torch.pxi) also declines.
bool view(const at::Tensor& t, bool written, posenc_tensor* v) {
    if (!t.defined() || !t.device().is_cpu() || t.layout() != c10::kStrided || t.is_conj() || t.is_neg()
            || (t.requires_grad() && c10::GradMode::is_enabled())
            || (written && t.is_inference() && !c10::InferenceMode::is_enabled()))
        return false;
    switch (t.scalar_type()) {
        case c10::ScalarType::Float: v->dtype = POSENC_TENSOR_FLOAT32; break;
        case c10::ScalarType::Double: v->dtype = POSENC_TENSOR_FLOAT64; break;
        case c10::ScalarType::Half: v->dtype = POSENC_TENSOR_FLOAT16; break;
        case c10::ScalarType::BFloat16: v->dtype = POSENC_TENSOR_BFLOAT16; break;
        case c10::ScalarType::Long: v->dtype = POSENC_TENSOR_INT64; break;
        default: return false;
    }
    v->data = t.has_storage() ? t.data_ptr() : nullptr;
    v->nd = static_cast<int>(t.dim());
    v->sizes = t.sizes().data();
    v->strides = t.strides().data();
    return v->data != nullptr;
}

// Bump the version counters of tensors written in place, as torch's in-place ops count them.
void count_writes(std::initializer_list<const at::Tensor*> written) {
    for (const at::Tensor* t : written)
        t->unsafeGetTensorImpl()->bump_version();
}

void rotary_embedding(const at::Tensor& positions, at::Tensor& query, const std::optional<at::Tensor>& key,
                      c10::SymInt head_size, const at::Tensor& cos_sin_cache, bool is_neox,
                      c10::SymInt rope_dim_offset, bool inverse) {
    posenc_tensor v[4];
    auto size = head_size.maybe_as_int(), offset = rope_dim_offset.maybe_as_int();
    if (entries != nullptr && size && offset && view(query, true, &v[0])
            && (!key || view(*key, true, &v[1])) && view(cos_sin_cache, false, &v[2])
            && view(positions, false, &v[3])
            && entries->rotate_tokens(&v[3], &v[0], key ? &v[1] : nullptr, &v[2], *size, *offset, is_neox,
                                      inverse)) {
        count_writes({&query});
        if (key)
            count_writes({&*key});
        return;
    }
    static auto general = c10::Dispatcher::singleton()
        .findSchemaOrThrow("posenc_fast::_rotary_embedding_general", "")
        .typed<void(const at::Tensor&, at::Tensor&, const std::optional<at::Tensor>&, c10::SymInt,
                    const at::Tensor&, bool, c10::SymInt, bool)>();
    general.call(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse);
}

void apply_qk_to_cache(const at::Tensor& positions, at::Tensor& query, const at::Tensor& key,
                       const at::Tensor& value, at::Tensor& key_cache, at::Tensor& value_cache,
                       const at::Tensor& slot_mapping, c10::SymInt head_size, const at::Tensor& cos_sin_cache,
                       bool is_neox, c10::string_view kv_cache_layout, const std::optional<at::Tensor>& q_weight,
                       const std::optional<at::Tensor>& k_weight, double eps, double weight_offset) {
    posenc_tensor v[10];
    auto size = head_size.maybe_as_int();
    bool hnd = kv_cache_layout == "HND", weights = q_weight && k_weight;
    if (entries != nullptr && size && (hnd || kv_cache_layout == "NHD") && weights == (q_weight || k_weight)
            && view(positions, false, &v[0]) && view(query, true, &v[1]) && view(key, false, &v[2])
            && view(value, false, &v[3]) && view(key_cache, true, &v[4]) && view(value_cache, true, &v[5])
            && view(slot_mapping, false, &v[6]) && view(cos_sin_cache, false, &v[7])
            && (!weights || (view(*q_weight, false, &v[8]) && view(*k_weight, false, &v[9])))
            && entries->tokens_to_cache(&v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], *size, &v[7], is_neox,
                                        hnd, weights ? &v[8] : nullptr, weights ? &v[9] : nullptr, eps,
                                        weight_offset)) {
        count_writes({&query, &key_cache, &value_cache});
        return;
    }
    static auto general = c10::Dispatcher::singleton()
        .findSchemaOrThrow("posenc_fast::_apply_qk_to_cache_general", "")
        .typed<void(const at::Tensor&, at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&,
                    at::Tensor&, const at::Tensor&, c10::SymInt, const at::Tensor&, bool, c10::string_view,
                    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, double, double)>();
    general.call(positions, query, key, value, key_cache, value_cache, slot_mapping, head_size, cos_sin_cache,
                 is_neox, kv_cache_layout, q_weight, k_weight, eps, weight_offset);
}

void fused_qk_norm_rope(const at::Tensor& positions, at::Tensor& query, at::Tensor& key, const at::Tensor& q_weight,
                        const at::Tensor& k_weight, c10::SymInt head_size, const at::Tensor& cos_sin_cache,
                        bool is_neox, double eps, double weight_offset) {
    posenc_tensor v[6];
    auto size = head_size.maybe_as_int();
    if (entries != nullptr && size && view(query, true, &v[0]) && view(key, true, &v[1])
            && view(q_weight, false, &v[2]) && view(k_weight, false, &v[3]) && view(cos_sin_cache, false, &v[4])
            && view(positions, false, &v[5])
            && entries->norm_tokens(&v[5], &v[0], &v[1], &v[2], &v[3], *size, &v[4], is_neox, eps,
                                    weight_offset)) {
        count_writes({&query, &key});
        return;
    }
    static auto general = c10::Dispatcher::singleton()
        .findSchemaOrThrow("posenc_fast::_fused_qk_norm_rope_general", "")
        .typed<void(const at::Tensor&, at::Tensor&, at::Tensor&, const at::Tensor&, const at::Tensor&,
                    c10::SymInt, const at::Tensor&, bool, double, double)>();
    general.call(positions, query, key, q_weight, k_weight, head_size, cos_sin_cache, is_neox, eps, weight_offset);
}

void concat_and_cache_mla(const at::Tensor& kv_c, const at::Tensor& k_pe, at::Tensor& kv_cache,
                          const at::Tensor& slot_mapping, c10::string_view kv_cache_dtype,
                          const std::optional<at::Tensor>& scale) {
    posenc_tensor v[4];
    if (entries != nullptr && kv_cache_dtype == "auto" && view(kv_c, false, &v[0]) && view(k_pe, false, &v[1])
            && view(kv_cache, true, &v[2]) && view(slot_mapping, false, &v[3])
            && entries->mla_to_cache(nullptr, nullptr, &v[1], &v[0], nullptr, 0, &v[3], &v[2])) {
        count_writes({&kv_cache});
        return;
    }
    static auto general = c10::Dispatcher::singleton()
        .findSchemaOrThrow("posenc_fast::_concat_and_cache_mla_general", "")
        .typed<void(const at::Tensor&, const at::Tensor&, at::Tensor&, const at::Tensor&, c10::string_view,
                    const std::optional<at::Tensor>&)>();
    general.call(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale);
}

void concat_and_cache_mla_rope_fused(const at::Tensor& positions, at::Tensor& q_pe, at::Tensor& k_pe,
                                     const at::Tensor& kv_c, const at::Tensor& cos_sin_cache, bool is_neox,
                                     const at::Tensor& slot_mapping, at::Tensor& kv_cache,
                                     c10::string_view kv_cache_dtype,
                                     const std::optional<at::Tensor>& kv_cache_scale) {
    posenc_tensor v[7];
    if (entries != nullptr && kv_cache_dtype == "auto" && view(positions, false, &v[0]) && view(q_pe, true, &v[1])
            && view(k_pe, true, &v[2]) && view(kv_c, false, &v[3]) && view(cos_sin_cache, false, &v[4])
            && view(slot_mapping, false, &v[5]) && view(kv_cache, true, &v[6])
            && entries->mla_to_cache(&v[0], &v[1], &v[2], &v[3], &v[4], is_neox, &v[5], &v[6])) {
        count_writes({&q_pe, &k_pe, &kv_cache});
        return;
    }
    static auto general = c10::Dispatcher::singleton()
        .findSchemaOrThrow("posenc_fast::_concat_and_cache_mla_rope_fused_general", "")
        .typed<void(const at::Tensor&, at::Tensor&, at::Tensor&, const at::Tensor&, const at::Tensor&, bool,
                    const at::Tensor&, at::Tensor&, c10::string_view, const std::optional<at::Tensor>&)>();
    general.call(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping, kv_cache, kv_cache_dtype,
                 kv_cache_scale);
}

// The outputs of an hf rotation, made when the entry asks for them (posenc_allocate_fn).
struct Outputs {
    at::TensorList xs;
    std::vector<at::Tensor> made;
};

void* allocate(void* context, int j) {
    auto* outputs = static_cast<Outputs*>(context);
    try {
        outputs->made.push_back(at::empty(outputs->xs[j].sizes(), outputs->xs[j].options()));
        return outputs->made.back().data_ptr();
    } catch (...) {  // no exception crosses _core's C: the entry writes nothing, the general op raises
        return nullptr;
    }
}

using HfSignature = std::vector<at::Tensor>(at::TensorList, const at::Tensor&, const at::Tensor&, c10::string_view,
                                             c10::string_view, c10::SymInt, bool);
using HfGeneral = c10::TypedOperatorHandle<HfSignature>;

HfGeneral hf_general(const char* op) {
    return c10::Dispatcher::singleton().findSchemaOrThrow(op, "").typed<HfSignature>();
}

// hf_rotate's and _hf_rotate_no_grad's kernel (the same op; `general`, its Python kernel's op).
std::vector<at::Tensor> hf_rotate_as(const HfGeneral& general, at::TensorList xs, const at::Tensor& cos,
                                     const at::Tensor& sin, c10::string_view family, c10::string_view name,
                                     c10::SymInt unsqueeze_dim, bool transpose) {
    posenc_tensor v[4];  // the data (one or two), cos, sin
    auto dim = unsqueeze_dim.maybe_as_int();
    size_t n = xs.size();
    if (entries != nullptr && !transpose && dim && (n == 1 || n == 2) && view(cos, false, &v[2])
            && view(sin, false, &v[3]) && view(xs[0], false, &v[0]) && (n == 1 || view(xs[1], false, &v[1]))) {
        Outputs outputs{xs, {}};
        if (entries->hf_rotate(family.data(), static_cast<int64_t>(family.size()), name.data(),
                               static_cast<int64_t>(name.size()), v, static_cast<int>(n), &v[2], &v[3], *dim,
                               allocate, &outputs))
            return outputs.made;
    }
    return general.call(xs, cos, sin, family, name, unsqueeze_dim, transpose);
}

std::vector<at::Tensor> hf_rotate(at::TensorList xs, const at::Tensor& cos, const at::Tensor& sin,
                                  c10::string_view family, c10::string_view name, c10::SymInt unsqueeze_dim,
                                  bool transpose) {
    static const auto general = hf_general("posenc_fast::_hf_rotate_general");
    return hf_rotate_as(general, xs, cos, sin, family, name, unsqueeze_dim, transpose);
}

std::vector<at::Tensor> hf_rotate_no_grad(at::TensorList xs, const at::Tensor& cos, const at::Tensor& sin,
                                          c10::string_view family, c10::string_view name,
                                          c10::SymInt unsqueeze_dim, bool transpose) {
    static const auto general = hf_general("posenc_fast::__hf_rotate_no_grad_general");
    return hf_rotate_as(general, xs, cos, sin, family, name, unsqueeze_dim, transpose);
}

}  // namespace

// _core's entries (torch_kernel_entry()); 0 where their version is not this file's (then every call
// goes to the general ops).
extern "C" int posenc_torch_kernel_set_entries(const void* given, int version) {
    if (version != POSENC_TORCH_ENTRY_VERSION)
        return 0;
    entries = static_cast<const posenc_torch_entries*>(given);
    return 1;
}

TORCH_LIBRARY_IMPL(posenc_fast, CPU, m) {
    m.impl("rotary_embedding", &rotary_embedding);
    m.impl("apply_qk_to_cache", &apply_qk_to_cache);
    m.impl("fused_qk_norm_rope", &fused_qk_norm_rope);
    m.impl("concat_and_cache_mla", &concat_and_cache_mla);
    m.impl("concat_and_cache_mla_rope_fused", &concat_and_cache_mla_rope_fused);
    m.impl("hf_rotate", &hf_rotate);
    m.impl("_hf_rotate_no_grad", &hf_rotate_no_grad);
}
