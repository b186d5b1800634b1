// ProcessGroupShm's collectives: each maps onto one shmdist collective (or one per tensor for
// the coalesced forms), started non-blocking; torch waits on the Work unless async_op=True.
// torch's options carry group ranks for roots; shmdist takes global ranks.

#include <string>

#include "backend.hpp"
#include "tensor_bridge.hpp"
#include <shmdist/embedding.hpp>

namespace shmdist::torch_backend {
namespace {

ReduceOp to_shmdist(const c10d::ReduceOp& op, bool complex) {
  const auto type = static_cast<c10d::ReduceOp::RedOpType>(op);
  refuse_unless(type <= c10d::ReduceOp::BXOR, "shm backend: reduction ", static_cast<int>(type),
                " (PREMUL_SUM or unknown) is not supported; use SUM, AVG, PRODUCT, MIN, MAX, "
                "BAND, BOR or BXOR");
  // A complex tensor travels as its real view: only element-wise linear reductions give
  // the complex result there.
  refuse_unless(!complex || type == c10d::ReduceOp::SUM || type == c10d::ReduceOp::AVG,
                "shm backend: complex tensors support only SUM and AVG (reduced through their "
                "real view); got reduction ", static_cast<int>(type));
  return static_cast<ReduceOp>(type);  // the same numbering as torch 1.13's
}

at::Tensor& single(std::vector<at::Tensor>& tensors, const char* op) {
  refuse_unless(tensors.size() == 1, "shm backend: ", op,
                " takes exactly one tensor per rank, got ", tensors.size());
  return tensors[0];
}

std::vector<at::Tensor>& single_list(std::vector<std::vector<at::Tensor>>& lists, const char* op) {
  refuse_unless(lists.size() == 1, "shm backend: ", op, " takes exactly one tensor list, got ",
                lists.size());
  return lists[0];
}

std::vector<BoundTensor> bind_all(const std::vector<at::Tensor>& tensors, const char* op) {
  std::vector<BoundTensor> bound;
  bound.reserve(tensors.size());
  for (const at::Tensor& t : tensors) bound.push_back(bind(t, op));
  return bound;
}

std::vector<Tensor> views(const std::vector<BoundTensor>& bound) {
  std::vector<Tensor> v;
  v.reserve(bound.size());
  for (const BoundTensor& b : bound) v.push_back(b.view);
  return v;
}

// opts.asyncOp where the options have it (torch 2.x), else true (torch 1.13: the backend is
// not told, so it must not block).
template <class Opts>
auto async_op(const Opts& opts, int) -> decltype(static_cast<bool>(opts.asyncOp)) {
  return opts.asyncOp;
}
template <class Opts>
bool async_op(const Opts&, long) {
  return true;
}

}  // namespace

template <class Opts>
bool ProcessGroupShm::blocking(const Opts& opts) const {
  if (async_op(opts, 0)) return false;
  const auto limit = opts.timeout.count() > 0 ? opts.timeout : timeout_;  // make_work's
  return limit == job_->pg.timeout();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::collective(
    c10d::OpType type, c10::ArrayRef<at::Tensor> outputs, c10::ArrayRef<BoundTensor> written,
    std::chrono::milliseconds timeout, c10::function_ref<PostedWorks()> post) {
  seq_.fetch_add(1, std::memory_order_relaxed);
  auto work = make_work(type, outputs, timeout);
  for (const BoundTensor& b : written)
    if (b.staging.defined()) work->on_success([b] { b.finish(); });
  for (Work& w : post()) work->add(std::move(w));
  return work;
}

template <class Body>
c10::intrusive_ptr<c10d::Work> ProcessGroupShm::or_reject(c10d::OpType type, const char* call,
                                                          std::size_t calls,
                                                          std::chrono::milliseconds timeout,
                                                          Body&& body) {
  // Relaxed is enough: the only increment that matters here is collective()'s, made by this
  // thread inside body(), which is sequenced before the second load. (A collective of the
  // same group started at once on another thread, which torch's API does not do, could make
  // a refusal after it look posted: it would then fail on this rank only, as before.)
  const std::uint64_t started = seq_.load(std::memory_order_relaxed);
  std::string why;
  try {
    return body();
  } catch (const InvalidArgument& e) {  // this adapter's refusals (refuse_unless)
    // collective() counts the call first: an error after that is not a refused argument.
    if (seq_.load(std::memory_order_relaxed) != started) throw;
    why = e.what();
  } catch (const c10::Error& e) {  // torch's own checks while binding the tensors
    if (seq_.load(std::memory_order_relaxed) != started) throw;
    why = e.msg();
  }
  why = "on rank " + std::to_string(global_rank_of_this_process()) + ": " + why;
  // Nothing to take part in (a coalesced call of no tensors): the refusal is this rank's alone.
  if (calls == 0) throw InvalidArgument(std::string(call) + ": " + why);
  return collective(type, {}, {}, timeout, [&] {
    PostedWorks works;
    for (std::size_t i = 0; i < calls; ++i)
      works.push_back(embedding::reject_collective(job_->pg, group_, call, why));
    return works;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  return or_reject(c10d::OpType::BROADCAST, "broadcast", 1, opts.timeout, [&] {
    BoundTensor b = bind(single(tensors, "broadcast"), "broadcast");
    const int root = global_rank(static_cast<int>(opts.rootRank), "broadcast");
    return collective(c10d::OpType::BROADCAST, tensors, b, opts.timeout, [&] {
      return PostedWorks{job_->pg.broadcast(b.view, root, group_, true)};
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  return or_reject(c10d::OpType::ALLREDUCE, "all_reduce", 1, opts.timeout, [&] {
    BoundTensor b = bind(single(tensors, "allreduce"), "allreduce");
    const ReduceOp op = to_shmdist(opts.reduceOp, b.is_complex);
    // Blocking where the caller waits at once anyway (blocking()): the Work returned is
    // complete, its wait() only runs the success steps (a staging copy back). An error
    // (Timeout, PeerFailure, a mismatch) is thrown from this call instead of from wait(),
    // the same exception; dist.all_reduce raises it either way.
    const bool async = !blocking(opts);
    return collective(c10d::OpType::ALLREDUCE, tensors, b, opts.timeout, [&] {
      return PostedWorks{job_->pg.all_reduce(b.view, op, group_, async)};
    });
  });
}

namespace {

// What kept bind() from using `t` in place (it made a staging copy).
std::string not_in_place(const at::Tensor& t) {
  if (!t.is_contiguous())
    return c10::str("a non-contiguous tensor (sizes ", t.sizes(), ", strides ", t.strides(), ")");
  if (t.is_conj()) return "a conjugate view (resolve it first: t.resolve_conj())";
  if (t.is_neg()) return "a negative view (resolve it first: t.resolve_neg())";
  return "a tensor that cannot be used in place";
}

}  // namespace

void ProcessGroupShm::all_reduce_in_place(const at::Tensor& tensor,
                                          const c10d::ReduceOp& reduce_op) {
  constexpr const char* kOp = "inference_all_reduce";
  BoundTensor b;
  ReduceOp op = ReduceOp::SUM;
  std::string why;
  try {  // dist.all_reduce's checks (bind, to_shmdist), then in place or refused
    b = bind(tensor, kOp);
    if (b.staging.defined())  // a copy would be reduced, and never written back here
      throw InvalidArgument(c10::str(
          "shm backend: ", kOp, " reduces the tensor in place and expects a contiguous "
          "tensor, found ", not_in_place(tensor), "; pass a contiguous tensor (t.contiguous(), "
          "then use that tensor), or use dist.all_reduce, which reduces a copy and writes it "
          "back"));
    op = to_shmdist(reduce_op, b.is_complex);
  } catch (const InvalidArgument& e) {
    why = e.what();
  } catch (const c10::Error& e) {  // torch's own checks while binding the tensor
    why = e.msg();
  }
  seq_.fetch_add(1, std::memory_order_relaxed);  // counted as collective() counts
  if (!why.empty()) {
    // As or_reject: the other members' all_reduce fails at once naming this rank.
    why = "on rank " + std::to_string(global_rank_of_this_process()) + ": " + why;
    embedding::reject_collective(job_->pg, group_, "all_reduce", why).wait();  // throws it
    throw InvalidArgument("all_reduce: " + why);  // (not reached: the wait throws)
  }
  if (timeout_ == job_->pg.timeout()) {  // blocking(): shmdist's own wait ends at this timeout
    job_->pg.all_reduce(b.view, op, group_, /*async_op=*/false);
    return;
  }
  // A group timeout of its own: the Work's wait enforces it, as for dist.all_reduce.
  auto work = make_work(c10d::OpType::ALLREDUCE, {}, c10d::kUnsetTimeout);
  work->add(job_->pg.all_reduce(b.view, op, group_, /*async_op=*/true));
  work->wait();
}

// The coalesced forms post one shmdist collective per tensor (per input): refused, as many
// rejected ones, which the other members' calls meet one for one.
c10::intrusive_ptr<c10d::Work> ProcessGroupShm::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return or_reject(c10d::OpType::ALLREDUCE_COALESCED, "all_reduce", tensors.size(), opts.timeout,
                   [&] {
    std::vector<BoundTensor> bound = bind_all(tensors, "allreduce_coalesced");
    std::vector<ReduceOp> ops;
    for (const BoundTensor& b : bound) ops.push_back(to_shmdist(opts.reduceOp, b.is_complex));
    return collective(c10d::OpType::ALLREDUCE_COALESCED, tensors, bound, opts.timeout, [&] {
      PostedWorks works;
      for (std::size_t i = 0; i < bound.size(); ++i)
        works.push_back(job_->pg.all_reduce(bound[i].view, ops[i], group_, true));
      return works;
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  return or_reject(c10d::OpType::REDUCE, "reduce", 1, opts.timeout, [&] {
    BoundTensor b = bind(single(tensors, "reduce"), "reduce");
    const ReduceOp op = to_shmdist(opts.reduceOp, b.is_complex);
    const int root = global_rank(static_cast<int>(opts.rootRank), "reduce");
    std::vector<BoundTensor> written;
    if (opts.rootRank == getRank()) written.push_back(b);  // the other inputs stay as they were
    return collective(c10d::OpType::REDUCE, tensors, written, opts.timeout, [&] {
      return PostedWorks{job_->pg.reduce(b.view, root, op, group_, true)};
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return or_reject(c10d::OpType::ALLGATHER, "all_gather", 1, opts.timeout, [&] {
    BoundTensor in = bind(single(inputs, "allgather"), "allgather");
    std::vector<BoundTensor> out = bind_all(single_list(outputs, "allgather"), "allgather");
    return collective(c10d::OpType::ALLGATHER, outputs[0], out, opts.timeout, [&] {
      std::vector<Tensor> list = views(out);
      return PostedWorks{job_->pg.all_gather(list, in.view, group_, true)};
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return or_reject(c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", 1, opts.timeout, [&] {
    BoundTensor in = bind(input, "_allgather_base");
    BoundTensor out = bind(output, "_allgather_base");
    return collective(c10d::OpType::_ALLGATHER_BASE, output, out, opts.timeout, [&] {
      return PostedWorks{job_->pg.all_gather_into_tensor(out.view, in.view, group_, true)};
    });
  });
}

// outputs[r][i] receives input i of group rank r: one all_gather per input.
c10::intrusive_ptr<c10d::Work> ProcessGroupShm::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return or_reject(c10d::OpType::ALLGATHER_COALESCED, "all_gather", inputs.size(), opts.timeout,
                   [&] {
    refuse_unless(outputs.size() == members_.size(), "shm backend: allgather_coalesced expects "
                  "one output list per group member (", members_.size(), "), got ",
                  outputs.size());
    std::vector<BoundTensor> in = bind_all(inputs, "allgather_coalesced");
    std::vector<std::vector<BoundTensor>> per_input(inputs.size());
    std::vector<BoundTensor> written;
    std::vector<at::Tensor> flat;
    for (const auto& list : outputs) {
      refuse_unless(list.size() == inputs.size(), "shm backend: allgather_coalesced expects ",
                    inputs.size(), " outputs per member (one per input), got ", list.size());
      for (std::size_t i = 0; i < list.size(); ++i) {
        per_input[i].push_back(bind(list[i], "allgather_coalesced"));
        written.push_back(per_input[i].back());
        flat.push_back(list[i]);
      }
    }
    return collective(c10d::OpType::ALLGATHER_COALESCED, flat, written, opts.timeout, [&] {
      PostedWorks works;
      for (std::size_t i = 0; i < in.size(); ++i) {
        std::vector<Tensor> list = views(per_input[i]);
        works.push_back(job_->pg.all_gather(list, in[i].view, group_, true));
      }
      return works;
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return or_reject(c10d::OpType::GATHER, "gather", 1, opts.timeout, [&] {
    BoundTensor in = bind(single(inputs, "gather"), "gather");
    const int root = global_rank(static_cast<int>(opts.rootRank), "gather");
    std::vector<BoundTensor> out;
    std::vector<at::Tensor> results;
    if (opts.rootRank == getRank()) {
      out = bind_all(single_list(outputs, "gather"), "gather");
      results = outputs[0];
    } else {
      refuse_unless(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                    "shm backend: gather takes an output list on the root only");
    }
    return collective(c10d::OpType::GATHER, results, out, opts.timeout, [&] {
      std::vector<Tensor> list = views(out);
      return PostedWorks{job_->pg.gather(in.view, list, root, group_, true)};
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return or_reject(c10d::OpType::SCATTER, "scatter", 1, opts.timeout, [&] {
    BoundTensor out = bind(single(outputs, "scatter"), "scatter");
    const int root = global_rank(static_cast<int>(opts.rootRank), "scatter");
    std::vector<BoundTensor> in;
    if (opts.rootRank == getRank())
      in = bind_all(single_list(inputs, "scatter"), "scatter");
    else
      refuse_unless(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                    "shm backend: scatter takes an input list on the root only");
    return collective(c10d::OpType::SCATTER, outputs, out, opts.timeout, [&] {
      return PostedWorks{job_->pg.scatter(out.view, views(in), root, group_, true)};
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return or_reject(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", 1, opts.timeout, [&] {
    BoundTensor out = bind(single(outputs, "reduce_scatter"), "reduce_scatter");
    std::vector<BoundTensor> in = bind_all(single_list(inputs, "reduce_scatter"), "reduce_scatter");
    const ReduceOp op = to_shmdist(opts.reduceOp, out.is_complex);
    return collective(c10d::OpType::REDUCE_SCATTER, outputs, out, opts.timeout, [&] {
      return PostedWorks{job_->pg.reduce_scatter(out.view, views(in), op, group_, true)};
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const auto type = c10d::OpType::_REDUCE_SCATTER_BASE;
  return or_reject(type, "reduce_scatter_tensor", 1, opts.timeout, [&] {
    BoundTensor out = bind(output, "_reduce_scatter_base");
    BoundTensor in = bind(input, "_reduce_scatter_base");
    const ReduceOp op = to_shmdist(opts.reduceOp, out.is_complex);
    return collective(type, output, out, opts.timeout, [&] {
      return PostedWorks{job_->pg.reduce_scatter_tensor(out.view, in.view, op, group_, true)};
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) {
  return or_reject(c10d::OpType::ALLTOALL_BASE, "all_to_all_single", 1, opts.timeout, [&] {
    BoundTensor out = bind(output, "alltoall_base");
    BoundTensor in = bind(input, "alltoall_base");
    return collective(c10d::OpType::ALLTOALL_BASE, output, out, opts.timeout, [&] {
      return PostedWorks{job_->pg.all_to_all_single(out.view, in.view, output_splits,
                                                    input_splits, group_, true)};
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  return or_reject(c10d::OpType::ALLTOALL, "all_to_all", 1, opts.timeout, [&] {
    std::vector<BoundTensor> out = bind_all(outputs, "alltoall");
    std::vector<BoundTensor> in = bind_all(inputs, "alltoall");
    return collective(c10d::OpType::ALLTOALL, outputs, out, opts.timeout, [&] {
      std::vector<Tensor> list = views(out);
      return PostedWorks{job_->pg.all_to_all(list, views(in), group_, true)};
    });
  });
}

#if SHMDIST_TORCH_MAJOR >= 2
c10::intrusive_ptr<c10d::Work> ProcessGroupShm::allreduce_sparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return allreduce(tensors, opts);  // bind() refuses the sparse tensor, saying what to do
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return or_reject(c10d::OpType::COALESCED, "all_gather_into_tensor", inputs.size(), opts.timeout,
                   [&] {
    refuse_unless(outputs.size() == inputs.size(), "shm backend: "
                  "allgather_into_tensor_coalesced expects one output per input, got ",
                  outputs.size(), " outputs for ", inputs.size(), " inputs");
    std::vector<BoundTensor> out = bind_all(outputs, "allgather_into_tensor_coalesced");
    std::vector<BoundTensor> in = bind_all(inputs, "allgather_into_tensor_coalesced");
    return collective(c10d::OpType::COALESCED, outputs, out, opts.timeout, [&] {
      PostedWorks works;
      for (std::size_t i = 0; i < out.size(); ++i)
        works.push_back(job_->pg.all_gather_into_tensor(out[i].view, in[i].view, group_, true));
      return works;
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupShm::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const auto type = c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED;
  return or_reject(type, "reduce_scatter_tensor", inputs.size(), opts.timeout, [&] {
    refuse_unless(outputs.size() == inputs.size(), "shm backend: "
                  "reduce_scatter_tensor_coalesced expects one output per input, got ",
                  outputs.size(), " outputs for ", inputs.size(), " inputs");
    std::vector<BoundTensor> out = bind_all(outputs, "reduce_scatter_tensor_coalesced");
    std::vector<BoundTensor> in = bind_all(inputs, "reduce_scatter_tensor_coalesced");
    std::vector<ReduceOp> ops;
    for (const BoundTensor& b : out) ops.push_back(to_shmdist(opts.reduceOp, b.is_complex));
    return collective(type, outputs, out, opts.timeout, [&] {
      PostedWorks works;
      for (std::size_t i = 0; i < out.size(); ++i)
        works.push_back(
            job_->pg.reduce_scatter_tensor(out[i].view, in[i].view, ops[i], group_, true));
      return works;
    });
  });
}
#endif

}  // namespace shmdist::torch_backend
