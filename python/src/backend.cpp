// ProcessGroupShm: construction, point-to-point and the barriers (backend_collectives.cpp has the
// rest). Every call binds its tensors, posts shmdist non-blocking operations (shmdist's
// ProcessGroup takes calls from any thread: job.hpp) and returns a ShmWork; torch waits on it
// (at once unless async_op=True).

#include "backend.hpp"

#include "tensor_bridge.hpp"
#include <shmdist/embedding.hpp>

namespace shmdist::torch_backend {
namespace {

at::Tensor& single(std::vector<at::Tensor>& tensors, const char* op) {
  refuse_unless(tensors.size() == 1, "shm backend: ", op, " takes exactly one tensor, got ",
                tensors.size());
  return tensors[0];
}

}  // namespace

ProcessGroupShm::ProcessGroupShm(std::shared_ptr<Job> job, c10::intrusive_ptr<c10d::Store> store,
                                 int rank, std::vector<int> members, Group group,
                                 std::chrono::milliseconds timeout, bool owns_job)
    : BackendBase(rank, static_cast<int>(members.size())),
      store_(std::move(store)),
      job_(std::move(job)),
      members_(std::move(members)),
      source_map_(std::make_shared<const std::vector<int>>(members_)),
      group_(std::move(group)),
      timeout_(timeout),
      owns_job_(owns_job) {}

// torch's destroy_process_group drops its references to the world's group: that is when
// the shmdist job is destroyed (its report of unreceived messages printed), even if a
// sub-group object is still referenced from Python.
ProcessGroupShm::~ProcessGroupShm() {
  if (owns_job_) job_->destroy();
}

int ProcessGroupShm::global_rank(int group_rank, const char* op) const {
  const int size = static_cast<int>(members_.size());
  refuse_unless(group_rank >= 0 && group_rank < size, "shm backend: ", op, " on rank ",
                global_rank_of_this_process(), ": group rank ", group_rank,
                " is not in the group of ", size, " ranks; pass a group rank from 0 to ",
                size - 1);
  return members_[static_cast<std::size_t>(group_rank)];
}

c10::intrusive_ptr<ShmWork> ProcessGroupShm::make_work(c10d::OpType type,
                                                       c10::ArrayRef<at::Tensor> outputs,
                                                       std::chrono::milliseconds op_timeout) const {
  const auto limit = op_timeout.count() > 0 ? op_timeout : timeout_;
  return c10::make_intrusive<ShmWork>(job_, getRank(), global_rank_of_this_process(), type,
                                      outputs, limit);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::send(std::vector<at::Tensor>& tensors, int dst,
                                                     int tag) {
  BoundTensor b = bind(single(tensors, "send"), "send");
  const int to = global_rank(dst, "send");
  auto work = make_work(c10d::OpType::SEND, {}, c10d::kUnsetTimeout);
  work->add(job_->pg.isend(b.view, to, group_, tag));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::recv(std::vector<at::Tensor>& tensors, int src,
                                                     int tag) {
  BoundTensor b = bind(single(tensors, "recv"), "recv");
  const int from = global_rank(src, "recv");
  auto work = make_work(c10d::OpType::RECV, b.original, c10d::kUnsetTimeout);
  work->set_source_map(source_map_);
  if (b.staging.defined()) work->on_success([b] { b.finish(); });
  work->add(job_->pg.irecv(b.view, from, group_, tag));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  BoundTensor b = bind(single(tensors, "recv"), "recv");
  auto work = make_work(c10d::OpType::RECVANYSOURCE, b.original, c10d::kUnsetTimeout);
  work->set_source_map(source_map_);
  if (b.staging.defined()) work->on_success([b] { b.finish(); });
  work->add(job_->pg.irecv(b.view, ANY_SOURCE, group_, tag));
  return work;
}

// shmdist's barrier collective, counted and agreed on like every other collective: a member
// in another collective (or in monitored_barrier) fails every member's call at once, and a
// barrier can only complete with the other members' barrier of the same number.
// Non-blocking, so that barrier(async_op=True) does not stall the caller.
c10::intrusive_ptr<c10d::Work> ProcessGroupShm::barrier(const c10d::BarrierOptions& opts) {
  return collective(c10d::OpType::BARRIER, {}, {}, opts.timeout, [&] {
    return PostedWorks{embedding::start_barrier(job_->pg, group_)};
  });
}

// Group rank 0 waits up to the timeout for every member, then releases them; every member
// that took part raises naming the members that did not arrive (all of them with
// wait_all_ranks), as gloo's does. A timeout of 0 is given (it expires at once, as gloo's);
// only torch's "unset" (-1 ms) means the group's timeout.
void ProcessGroupShm::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  const auto limit = opts.timeout != c10d::kUnsetTimeout ? opts.timeout : timeout_;
  job_->pg.monitored_barrier(group_, limit, wait_all_ranks);
}

}  // namespace shmdist::torch_backend
