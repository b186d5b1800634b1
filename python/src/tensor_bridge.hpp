// torch tensors as shmdist sees them. A contiguous CPU tensor is used in place (a shmdist
// view of its memory that keeps the torch tensor alive); a non-contiguous one goes through a
// contiguous copy, copied back into the original once an operation that writes it succeeds.
// Complex tensors travel as their real view (float pairs).
#pragma once

#include <ATen/ATen.h>

#include <shmdist/tensor.hpp>

namespace shmdist::torch_backend {

// One torch tensor bound to an operation.
struct BoundTensor {
  at::Tensor original;  // what the caller passed
  at::Tensor staging;   // a contiguous copy, when `original` could not be used in place
  Tensor view;          // what shmdist reads or writes (over `staging` if defined)
  bool is_complex = false;

  // For tensors the operation writes: copies the staging copy back into `original`.
  void finish() const;
};

// Checks that `t` can take part in `op` (a CPU, strided tensor of a supported dtype) and
// throws a RuntimeError (c10::Error) saying what is wrong otherwise.
void check_tensor(const at::Tensor& t, const char* op);

// Binds a tensor that `op` reads or writes (the caller calls finish() for written ones).
BoundTensor bind(const at::Tensor& t, const char* op);

// The shmdist dtype for a torch scalar type (complex types give their real component's).
DType to_shmdist(at::ScalarType type, const char* op);

}  // namespace shmdist::torch_backend
