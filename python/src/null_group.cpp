#include "null_group.hpp"

#include "work.hpp"

namespace shmdist::torch_backend {

// Each call returns a completed Work, as the cheapest real backend would for a message that
// is already there: one allocation (the Work), no lock beyond c10d::Work's own.
c10::intrusive_ptr<c10d::Work> ProcessGroupNull::send(std::vector<at::Tensor>&, int, int) {
  return completed_work(getRank(), c10d::OpType::SEND, {});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNull::recv(std::vector<at::Tensor>& tensors, int,
                                                      int) {
  return completed_work(getRank(), c10d::OpType::RECV, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNull::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions&) {
  return completed_work(getRank(), c10d::OpType::ALLREDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNull::barrier(const c10d::BarrierOptions&) {
  return completed_work(getRank(), c10d::OpType::BARRIER, {});
}

c10::intrusive_ptr<BackendBase> create_null_process_group(
    const c10::intrusive_ptr<c10d::Store>&, int rank, int size, std::chrono::milliseconds) {
  return c10::make_intrusive<ProcessGroupNull>(rank, size);
}

}  // namespace shmdist::torch_backend
