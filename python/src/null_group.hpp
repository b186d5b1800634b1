// The floor of a torch.distributed call (for bench/torch/overhead.py): a c10d backend
// whose send, recv, allreduce and barrier do nothing and return an already completed Work. Timed (or
// counted) through torch.distributed exactly like backend "shm", it measures what torch's
// Python layer, its bindings and its Work wrapping cost any backend, so that "shm"'s own
// share is the difference. Not a backend for users: it moves no data.
#pragma once

#include <chrono>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "torch_compat.hpp"

namespace shmdist::torch_backend {

class ProcessGroupNull : public BackendBase {
 public:
  ProcessGroupNull(int rank, int size) : BackendBase(rank, size) {}
  const std::string getBackendName() const override { return "null"; }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
};

// The creator torch.distributed calls (register_backend's plain form).
c10::intrusive_ptr<BackendBase> create_null_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout);

}  // namespace shmdist::torch_backend
