// The torch.distributed backend "shm": a c10d backend (BackendBase: c10d::ProcessGroup on
// torch 1.13, c10d::Backend on torch 2.x; see torch_compat.hpp) over a shmdist job. The world and every new_group sub-group of it share one
// shmdist ProcessGroup (one segment, one engine): a sub-group is a shmdist Group with an id
// derived from torch's group name, which all ranks agree on.
//
// torch passes group ranks; shmdist takes global ranks, so every peer is translated through
// `members_`, and receives report their sender's group rank (torch maps it back).
#pragma once

#include <c10/util/ArrayRef.h>
#include <c10/util/FunctionRef.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include <shmdist/process_group.hpp>

#include "job.hpp"
#include "tensor_bridge.hpp"
#include "torch_compat.hpp"
#include "work.hpp"

namespace shmdist::torch_backend {

// The shmdist operations one call posts: mostly one, kept inline (no allocation).
using PostedWorks = c10::SmallVector<Work, 1>;

class ProcessGroupShm : public BackendBase {
 public:
  // `members`: global ranks of the group's members in group-rank order (the world: 0..n-1);
  // `group`: the shmdist group every call of this torch group goes to (barrier included).
  // `store`: torch's store for the group. Held for the group's lifetime, as gloo does: rank
  // 0 of a job started by torchrun or env:// hosts the store's server, which must outlive
  // the other ranks' use of it (destroy_process_group waits for all ranks before it goes).
  ProcessGroupShm(std::shared_ptr<Job> job, c10::intrusive_ptr<c10d::Store> store, int rank,
                  std::vector<int> members, Group group,
                  std::chrono::milliseconds timeout, bool owns_job);
  ~ProcessGroupShm() override;

  const std::string getBackendName() const override { return "shm"; }
  const std::vector<int>& members() const { return members_; }
  const Group& group() const { return group_; }
  const std::shared_ptr<Job>& job() const { return job_; }

  // The group's count of collectives (barriers included, as in shmdist's own count; point-to-point is not counted, as
  // its calls differ between ranks). All members make the same collectives in the same
  // order, so the counts agree: torch's ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL
  // wraps every group in it) compares them across ranks before each collective. It starts
  // at 0, as gloo's does, so setting it needs no agreement through the store.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(std::memory_order_relaxed); }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  // shmdist.torch.inference_all_reduce: dist.all_reduce of one tensor in place, without
  // torch's Python layer, its dispatcher or a Work: the same shmdist collective (same checks,
  // same mismatch detection, same result bit for bit), run blocking in the caller's frame.
  // The tensor must be usable in place (contiguous, not a conjugate or negative view):
  // refused otherwise, as is anything dist.all_reduce refuses; a refusal is posted as a
  // rejected all_reduce, so the other members fail at once naming this rank (or_reject).
  // Called with the GIL released.
  void all_reduce_in_place(const at::Tensor& tensor, const c10d::ReduceOp& op);

#if SHMDIST_TORCH_MAJOR >= 2
  // torch 2.x only. A sparse all_reduce arrives here: refused by the tensor check, with
  // what to do (as every operation refuses sparse tensors).
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  // all_gather_into_tensor / reduce_scatter_tensor inside dist._coalescing_manager (FSDP):
  // one collective per pair, in one Work.
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
#endif

 private:
  // `outputs` is only read (copied into the Work): a view of the caller's tensors.
  c10::intrusive_ptr<ShmWork> make_work(c10d::OpType type, c10::ArrayRef<at::Tensor> outputs,
                                        std::chrono::milliseconds op_timeout) const;
  int global_rank(int group_rank, const char* op) const;
  // Whether a collective with these options may run blocking inside the call, in shmdist's
  // blocking form (in the caller's frame: no background schedule, the lane polled before
  // the engine's waiting loop), returning an already completed Work. torch 2.x says in the
  // options whether its caller waits at once (asyncOp false: dist.all_reduce(...) without
  // async_op=True, which waits on the Work before returning); torch 1.13 does not say, so
  // there every call posts non-blocking. Only when the operation's timeout is the job's:
  // shmdist's blocking wait ends with the job's timeout (and its Timeout, the same error
  // the Work's wait would rethrow), so a group or call with a timeout of its own keeps the
  // Work's wait, which enforces it.
  template <class Opts>
  bool blocking(const Opts& opts) const;
  // A collective: a Work returning `outputs`, copying `written` back out of their staging
  // copies once `post` has completed. The arguments are only read during the call (views,
  // not copies, and `post` is called before it returns, so it is not stored): for tensors
  // used in place nothing is allocated here but the Work.
  c10::intrusive_ptr<c10d::Work> collective(c10d::OpType type, c10::ArrayRef<at::Tensor> outputs,
                                            c10::ArrayRef<BoundTensor> written,
                                            std::chrono::milliseconds timeout,
                                            c10::function_ref<PostedWorks()> post);
  // Runs `body`, a collective that posts `calls` shmdist collectives `call` (1, or one per
  // tensor for the coalesced forms); if it throws before reaching collective() (an argument
  // this adapter refuses: a dtype or layout shmdist does not carry, a reduction it lacks),
  // posts `calls` of shmdist's collective `call` as rejected instead, so that the other
  // members fail at once naming this rank rather than waiting for it, and returns their
  // Work, which fails with the refusal (shmdist.InvalidArgument).
  template <class Body>
  c10::intrusive_ptr<c10d::Work> or_reject(c10d::OpType type, const char* call, std::size_t calls,
                                           std::chrono::milliseconds timeout, Body&& body);
  // This process's global rank (for error messages: they name global ranks).
  int global_rank_of_this_process() const {
    return members_[static_cast<std::size_t>(getRank())];
  }

  c10::intrusive_ptr<c10d::Store> store_;  // declared first: released after the job is destroyed
  std::shared_ptr<Job> job_;
  std::vector<int> members_;
  std::shared_ptr<const std::vector<int>> source_map_;  // members_, shared with receives' Work
  Group group_;
  std::chrono::milliseconds timeout_;
  bool owns_job_;  // the world's torch group: destroying it destroys the shmdist job
  std::atomic<std::uint64_t> seq_{0};  // collectives started (getSequenceNumberForGroup)
};

}  // namespace shmdist::torch_backend
