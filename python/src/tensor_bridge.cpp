#include "tensor_bridge.hpp"

#include <memory>

namespace shmdist::torch_backend {

DType to_shmdist(at::ScalarType type, const char* op) {
  switch (type) {
    // Every row of shmdist/dtype_table.hpp, by its torch ScalarType.
#define SHMDIST_DTYPE_FROM_TORCH(name, code, element, storage, torch_name, kind, scalar) \
  case at::ScalarType::scalar: return DType::name;
    SHMDIST_DTYPES(SHMDIST_DTYPE_FROM_TORCH)
#undef SHMDIST_DTYPE_FROM_TORCH
    // Complex tensors travel as their real view.
    case at::kComplexHalf: return kFloat16;
    case at::kComplexFloat: return kFloat32;
    case at::kComplexDouble: return kFloat64;
    default:
#define SHMDIST_DTYPE_TORCH_NAME(name, code, element, storage, torch_name, ...) torch_name ", "
      throw InvalidArgument(c10::str(
          "shm backend: ", op, " does not support tensors of dtype ", type,
          "; supported: " SHMDIST_DTYPES(SHMDIST_DTYPE_TORCH_NAME) "and complex (as their real "
          "view)"));
#undef SHMDIST_DTYPE_TORCH_NAME
  }
}

namespace {

// check_tensor's checks; returns the tensor's shmdist dtype.
DType checked_dtype(const at::Tensor& t, const char* op) {
  refuse_unless(t.defined(), "shm backend: ", op, " got an undefined tensor");
  refuse_unless(!t.is_sparse(), "shm backend: ", op,
                " does not support sparse tensors; send the dense values and indices "
                "(t.coalesce().values(), t.coalesce().indices()) or use backend 'gloo'");
  refuse_unless(t.device().is_cpu(), "shm backend: ", op,
                " supports CPU tensors only, got a tensor on ", t.device(),
                "; move it with .cpu() or use backend 'nccl' for GPU tensors");
  refuse_unless(t.layout() == at::kStrided, "shm backend: ", op,
                " supports strided (dense) tensors only, got layout ", t.layout());
  return to_shmdist(t.scalar_type(), op);
}

}  // namespace

void check_tensor(const at::Tensor& t, const char* op) { checked_dtype(t, op); }

void BoundTensor::finish() const {
  if (staging.defined()) original.copy_(is_complex ? at::view_as_complex(staging) : staging);
}

BoundTensor bind(const at::Tensor& t, const char* op) {
  const DType dtype = checked_dtype(t, op);
  BoundTensor b;
  b.original = t;
  b.is_complex = t.is_complex();
  // Conjugate or negative views, and any non-contiguous layout, go through a copy: shmdist
  // needs the values themselves, densely packed in row-major order.
  const bool in_place = t.is_contiguous() && !t.is_conj() && !t.is_neg();
  if (in_place && !b.is_complex) {  // the common case: the caller's tensor itself, as below
    std::vector<std::int64_t> sizes(t.sizes().begin(), t.sizes().end());
    b.view = Tensor::from_blob(t.data_ptr(), std::move(sizes), dtype,
                               std::make_shared<at::Tensor>(t));  // the owner, as below
    return b;
  }
  at::Tensor dense = t;
  if (!in_place) {
    dense = t.resolve_conj().resolve_neg().contiguous();
    if (dense.data_ptr() == t.data_ptr()) dense = dense.clone();  // never write through a view
  }
  at::Tensor real = b.is_complex ? at::view_as_real(dense) : dense;
  if (!in_place) b.staging = real;
  std::vector<std::int64_t> sizes(real.sizes().begin(), real.sizes().end());
  // The shmdist view keeps the torch tensor it points into alive, so an operation that
  // outlives its Work (a dropped isend) never touches freed memory.
  std::shared_ptr<void> owner = std::make_shared<at::Tensor>(real);  // one allocation
  b.view = Tensor::from_blob(real.data_ptr(), std::move(sizes), dtype, std::move(owner));
  return b;
}

}  // namespace shmdist::torch_backend
