// The CPU kernel of vllm_edge::int4_gemv: the native int4 product (int4_gemv.c) as a
// dispatcher op, so a cpu_int4 linear runs without a Python impl or ctypes between the
// compiled graph and the C product. The schema and the fake (meta) impl are defined in
// Python (quant/ops.py), which keeps the op defined even where this library does not build.
//
// Built by quant/native_op.py: int4_gemv.c compiled as C into an object, linked here.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include <cstdint>

extern "C" int edge_int4_gemv(const uint8_t* packed, const uint16_t* sz, const uint16_t* x,
                              uint16_t* y, int64_t M, int64_t n, int64_t k, int64_t kg,
                              int64_t threads);

namespace {

at::Tensor int4_gemv(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales_zeros,
                     int64_t group_size) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "vllm_edge::int4_gemv: x must be bf16, got ",
              x.scalar_type());
  TORCH_CHECK(scales_zeros.scalar_type() == at::kBFloat16 && scales_zeros.dim() == 3 &&
                  scales_zeros.is_contiguous(),
              "vllm_edge::int4_gemv: scales_zeros must be contiguous bf16 [K/group, N, 2]");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous(),
              "vllm_edge::int4_gemv: packed must be the contiguous uint8 tinygemm tensor");
  const int64_t k = x.size(-1), n = scales_zeros.size(1);
  TORCH_CHECK(group_size > 0 && scales_zeros.size(0) * group_size == k && packed.size(0) == n &&
                  packed.numel() * 2 == n * k,
              "vllm_edge::int4_gemv: x has K=", k, ", the weight is N=", n, " in ",
              scales_zeros.size(0), " groups of ", group_size);
  const at::Tensor x2 = x.reshape({-1, k}).contiguous();
  const int64_t m = x2.size(0);
  at::Tensor y = at::empty({m, n}, x.options());
  if (m > 0) {
    RECORD_FUNCTION("edge_int4_product", c10::ArrayRef<const c10::IValue>{});  // as `bench profile` names it
    const int rc = edge_int4_gemv(packed.const_data_ptr<uint8_t>(),
                                  reinterpret_cast<const uint16_t*>(scales_zeros.const_data_ptr()),
                                  reinterpret_cast<const uint16_t*>(x2.const_data_ptr()),
                                  reinterpret_cast<uint16_t*>(y.mutable_data_ptr()), m, n, k,
                                  group_size, at::get_num_threads());
    TORCH_CHECK(rc == 0, "vllm_edge::int4_gemv: the native int4 product refused N=", n, ", K=", k,
                ", group ", group_size,
                " (it needs AVX512-BF16 and VBMI, N % 64 == 0, K and the group multiples of 32)");
  }
  auto shape = x.sizes().vec();
  shape.back() = n;
  return y.view(shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(vllm_edge, CPU, m) { m.impl("int4_gemv", &int4_gemv); }
