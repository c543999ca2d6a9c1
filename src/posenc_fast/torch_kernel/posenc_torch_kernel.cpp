// torch.ops.posenc_fast.rotary_embedding's CPU kernel in C++, against the torch it is built for
// (`python -m posenc_fast build-torch-kernel`; posenc_fast/_torch_kernel.py loads it).  torch's call of
// a kernel written in Python costs ~2.4 us however little it does; of one in C++ ~1.7 us, which is most
// of a decode step's op.  The common call goes to _core's entry (posenc_torch_kernel.h); every other
// call, and every error, to the op _rotary_embedding_general: the Python kernel, which raises what
// posenc_fast.vllm.rotary_embedding documents.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <torch/library.h>

#include <optional>

#include "posenc_torch_kernel.h"

namespace {

posenc_rotate_tokens_fn rotate_tokens = nullptr;

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

void rotary_embedding(const at::Tensor& positions, at::Tensor& query, const std::optional<at::Tensor>& key,
                      c10::SymInt head_size, const at::Tensor& cos_sin_cache, bool is_neox,
                      c10::SymInt rope_dim_offset, bool inverse) {
    posenc_tensor v[4];
    auto size = head_size.maybe_as_int(), offset = rope_dim_offset.maybe_as_int();
    if (rotate_tokens != nullptr && size && offset && view(query, true, &v[0])
            && (!key || view(*key, true, &v[1])) && view(cos_sin_cache, false, &v[2])
            && view(positions, false, &v[3])
            && rotate_tokens(&v[3], &v[0], key ? &v[1] : nullptr, &v[2], *size, *offset, is_neox, inverse)) {
        // written in place: their version counters, as torch's in-place ops count them
        query.unsafeGetTensorImpl()->bump_version();
        if (key)
            key->unsafeGetTensorImpl()->bump_version();
        return;
    }
    static auto general = c10::Dispatcher::singleton()
        .findSchemaOrThrow("posenc_fast::_rotary_embedding_general", "")
        .typed<void(const at::Tensor&, at::Tensor&, const std::optional<at::Tensor>&, c10::SymInt,
                    const at::Tensor&, bool, c10::SymInt, bool)>();
    general.call(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse);
}

}  // namespace

// _core's entry (torch_kernel_entry()); 0 where its version is not this file's (then every call
// goes to the general op).
extern "C" int posenc_torch_kernel_set_entry(void* entry, int version) {
    if (version != POSENC_TORCH_ENTRY_VERSION)
        return 0;
    rotate_tokens = reinterpret_cast<posenc_rotate_tokens_fn>(entry);
    return 1;
}

TORCH_LIBRARY_IMPL(posenc_fast, CPU, m) {
    m.impl("rotary_embedding", &rotary_embedding);
}
