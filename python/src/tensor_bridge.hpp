// torch tensors as shmdist sees them. A contiguous CPU tensor is used in place (a shmdist
// view of its memory that keeps the torch tensor alive); a non-contiguous one goes through a
// contiguous copy, copied back into the original once an operation that writes it succeeds.
// Complex tensors travel as their real view (float pairs).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>

#include <shmdist/errors.hpp>
#include <shmdist/tensor.hpp>

namespace shmdist::torch_backend {

// The backend's refusals of a caller's arguments: shmdist::InvalidArgument, which Python sees
// as shmdist.InvalidArgument (a RuntimeError subclass, so `except RuntimeError` still catches
// it), like every refusal shmdist itself makes. `what` is concatenated as by c10::str.
template <class... Args>
void refuse_unless(bool ok, const Args&... what) {
  if (!ok) throw InvalidArgument(c10::str(what...));
}

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
// throws InvalidArgument saying what is wrong otherwise.
void check_tensor(const at::Tensor& t, const char* op);

// Binds a tensor that `op` reads or writes (the caller calls finish() for written ones).
BoundTensor bind(const at::Tensor& t, const char* op);

// The shmdist dtype for a torch scalar type (complex types give their real component's).
DType to_shmdist(at::ScalarType type, const char* op);

}  // namespace shmdist::torch_backend
