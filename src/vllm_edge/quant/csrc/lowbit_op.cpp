// The CPU kernel of vllm_edge::lowbit_linear: cpu_int8's packed product (lowbit_gemv.c)
// as a dispatcher op, so a packed layer runs without a Python impl or ctypes between the
// compiled graph and the C code. Up to 16 rows it is the product; more rows (prefill) take W^T
// dequantized to bf16 and one GEMM, as the Python impl does. The schema, the fake impl and the
// Python fallback are defined in quant/lowbit_op.py.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

extern "C" int edge_lowbit_gemv(const uint8_t* nib, const uint8_t* hib, const uint16_t* s,
                                const uint16_t* z, const uint16_t* x, uint16_t* y, int64_t M,
                                int64_t n, int64_t k, int64_t kg, int64_t planes, int64_t off,
                                int64_t threads);
extern "C" int edge_lowbit_dequant_t(const uint8_t* nib, const uint8_t* hib, const uint16_t* s,
                                     const uint16_t* z, uint16_t* outT, int64_t n, int64_t k,
                                     int64_t kg, int64_t planes, int64_t off, int64_t threads);

namespace {

constexpr int64_t kGemvRows = 16;  // int8_ops.GEMV_ROWS

at::Tensor lowbit_linear(const at::Tensor& x, const at::Tensor& nibbles, const at::Tensor& high,
                         const at::Tensor& scale, const std::optional<at::Tensor>& zero,
                         int64_t group, int64_t planes) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "vllm_edge::lowbit_linear: x must be bf16, got ",
              x.scalar_type());
  TORCH_CHECK(nibbles.scalar_type() == at::kByte && nibbles.dim() == 3 && nibbles.is_contiguous() &&
                  high.scalar_type() == at::kInt && high.is_contiguous() &&
                  scale.scalar_type() == at::kHalf && scale.dim() == 2 && scale.is_contiguous(),
              "vllm_edge::lowbit_linear: expected the packed layout of quant/lowbit.py");
  const int64_t k = x.size(-1), n = scale.size(1);
  TORCH_CHECK(nibbles.size(1) == k && nibbles.size(0) * 64 == n && scale.size(0) * group == k,
              "vllm_edge::lowbit_linear: x has K=", k, ", the weight is N=", n);
  const uint16_t* zp = nullptr;
  if (zero.has_value()) {
    TORCH_CHECK(zero->scalar_type() == at::kHalf && zero->is_contiguous() && zero->sizes() == scale.sizes(),
                "vllm_edge::lowbit_linear: zero must match scale");
    zp = reinterpret_cast<const uint16_t*>(zero->const_data_ptr());
  }
  const int64_t off = planes == 4 ? 128 : planes == 2 ? 32 : planes == 1 ? 16 : 8;  // lowbit.OFFSETS
  const at::Tensor x2 = x.reshape({-1, k}).contiguous();
  const int64_t m = x2.size(0);
  const auto* nb = nibbles.const_data_ptr<uint8_t>();
  const auto* hb = reinterpret_cast<const uint8_t*>(high.const_data_ptr());
  const auto* sp = reinterpret_cast<const uint16_t*>(scale.const_data_ptr());
  at::Tensor y;
  if (m <= kGemvRows) {
    y = at::empty({m, n}, x.options());
    if (m > 0) {
      RECORD_FUNCTION("edge_lowbit_product", c10::ArrayRef<const c10::IValue>{});
      const int rc = edge_lowbit_gemv(nb, hb, sp, zp, reinterpret_cast<const uint16_t*>(x2.const_data_ptr()),
                                      reinterpret_cast<uint16_t*>(y.mutable_data_ptr()), m, n, k, group,
                                      planes, off, at::get_num_threads());
      TORCH_CHECK(rc == 0, "vllm_edge::lowbit_linear: the packed product refused N=", n, ", K=", k,
                  ", group ", group, ", planes ", planes);
    }
  } else {
    at::Tensor wt = at::empty({k, n}, x.options());
    {
      RECORD_FUNCTION("edge_lowbit_dequant_t", c10::ArrayRef<const c10::IValue>{});
      const int rc = edge_lowbit_dequant_t(nb, hb, sp, zp, reinterpret_cast<uint16_t*>(wt.mutable_data_ptr()),
                                           n, k, group, planes, off, at::get_num_threads());
      TORCH_CHECK(rc == 0, "vllm_edge::lowbit_linear: the packed dequantizer refused N=", n, ", K=", k);
    }
    y = at::matmul(x2, wt);
  }
  auto shape = x.sizes().vec();
  shape.back() = n;
  return y.view(shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(vllm_edge, CPU, m) { m.impl("lowbit_linear", &lowbit_linear); }
