// ProcessGroupShm: construction, point-to-point and the barriers (collectives.cpp has the
// rest). Every call binds its tensors, posts shmdist non-blocking operations (shmdist's
// ProcessGroup takes calls from any thread: job.hpp) and returns a ShmWork; torch waits on it
// (at once unless async_op=True).

#include "process_group.hpp"

#include "tensor_bridge.hpp"

namespace shmdist::torch_backend {
namespace {

// The tag of the barrier's tokens on the control group.
constexpr int kBarrierTag = 0;

at::Tensor& single(std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "shm backend: ", op, " takes exactly one tensor, got ",
              tensors.size());
  return tensors[0];
}

}  // namespace

ProcessGroupShm::ProcessGroupShm(std::shared_ptr<Job> job, c10::intrusive_ptr<c10d::Store> store,
                                 int rank, std::vector<int> members, Group group, Group control,
                                 std::chrono::milliseconds timeout, bool owns_job)
    : BackendBase(rank, static_cast<int>(members.size())),
      store_(std::move(store)),
      job_(std::move(job)),
      members_(std::move(members)),
      source_map_(std::make_shared<const std::vector<int>>(members_)),
      group_(std::move(group)),
      control_(std::move(control)),
      timeout_(timeout),
      owns_job_(owns_job) {}

// torch's destroy_process_group drops its references to the world's group: that is when
// the shmdist job is destroyed (its report of unreceived messages printed), even if a
// sub-group object is still referenced from Python.
ProcessGroupShm::~ProcessGroupShm() {
  if (owns_job_) job_->destroy();
}

int ProcessGroupShm::global_rank(int group_rank, const char* op) const {
  TORCH_CHECK(group_rank >= 0 && group_rank < static_cast<int>(members_.size()),
              "shm backend: ", op, ": rank ", group_rank, " is not in the group of ",
              members_.size(), " ranks");
  return members_[static_cast<std::size_t>(group_rank)];
}

c10::intrusive_ptr<ShmWork> ProcessGroupShm::make_work(c10d::OpType type,
                                                       std::vector<at::Tensor> outputs,
                                                       std::chrono::milliseconds op_timeout) const {
  const auto limit = op_timeout.count() > 0 ? op_timeout : timeout_;
  return c10::make_intrusive<ShmWork>(job_, getRank(), type, std::move(outputs), limit);
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
  auto work = make_work(c10d::OpType::RECV, {b.original}, c10d::kUnsetTimeout);
  work->set_source_map(source_map_);
  if (b.staging.defined()) work->on_success([b] { b.finish(); });
  work->add(job_->pg.irecv(b.view, from, group_, tag));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  BoundTensor b = bind(single(tensors, "recv"), "recv");
  auto work = make_work(c10d::OpType::RECVANYSOURCE, {b.original}, c10d::kUnsetTimeout);
  work->set_source_map(source_map_);
  if (b.staging.defined()) work->on_success([b] { b.finish(); });
  work->add(job_->pg.irecv(b.view, ANY_SOURCE, group_, tag));
  return work;
}

// Each member sends an empty token to every other member and receives one from each: no
// member completes before all have arrived. Messages between a pair on one (group, tag) are
// received in order, so consecutive barriers never take each other's tokens. Non-blocking,
// so that barrier(async_op=True) does not stall the caller.
void ProcessGroupShm::post_tokens(ShmWork& work, int tag) {
  const Tensor token = empty({0}, kUInt8);
  const int me = job_->pg.get_rank();
  for (int peer : members_) {
    if (peer == me) continue;
    Tensor sink = empty({0}, kUInt8);
    work.add(job_->pg.irecv(sink, peer, control_, tag));
    work.add(job_->pg.isend(token, peer, control_, tag));
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::barrier(const c10d::BarrierOptions& opts) {
  seq_.fetch_add(1, std::memory_order_relaxed);
  auto work = make_work(c10d::OpType::BARRIER, {}, opts.timeout);
  post_tokens(*work, kBarrierTag);
  return work;
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
