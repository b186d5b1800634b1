// ProcessGroup's collectives: resolve the group, count the call in the group's sequence,
// hand over to lib/coll/, and block unless async_op.

#include <shmdist/embedding.hpp>

#include "coll/collectives.hpp"
#include "coll/kinds.hpp"
#include "coll/schedule.hpp"
#include "pg/impl.hpp"

namespace shmdist {
namespace {

// Every member counts the group's collectives alike (they call them in the same order), so
// the count names the call in fingerprints and keeps concurrent calls' messages apart.
coll::CallSetup setup(ProcessGroup::Impl& s, const Group& group, const char* call,
                      bool blocking) {
  const detail::GroupInfo& info = detail::member_group(s, group, call);
  coll::CallSetup setup;
  setup.engine = s.engine.get();
  setup.group.id = info.id;
  setup.group.sig = info.sig;
  setup.group.members = info.members;
  setup.group.me = info.my_rank;
  // The split before the count: if making it throws (out of memory), no call was counted.
  if (!s.host_of.empty()) {
    const std::uint64_t key = std::uint64_t{info.id} << 32 | info.sig;
    auto at = s.host_splits.find(key);
    if (at == s.host_splits.end())
      at = s.host_splits.emplace(key, coll::host_split(setup.group, s.host_of)).first;
    setup.split = at->second;
  }
  setup.seq = info.id == 0 ? ++s.world_collective_seq : ++s.collective_seq[info.id];
  if (info.id == 0 && s.world_lane) setup.lane = s.world_lane.get();
  setup.blocking = blocking;
  return setup;
}

}  // namespace

// Blocking calls wait here (and rethrow the collective's error); async ones return at once.
#define SHMDIST_COLLECTIVE(call, ...)                                   \
  Impl& s = impl();                                                     \
  const auto entry = s.engine->enter(#call);                            \
  auto done = coll::call(setup(s, group, #call, !async_op), __VA_ARGS__); \
  if (!async_op) s.engine->wait(*done, std::nullopt);                   \
  return Work(std::move(done))

Work ProcessGroup::broadcast(Tensor& tensor, int src, const Group& group, bool async_op) {
  SHMDIST_COLLECTIVE(broadcast, tensor, src);
}
Work ProcessGroup::all_reduce(Tensor& tensor, ReduceOp op, const Group& group, bool async_op) {
  SHMDIST_COLLECTIVE(all_reduce, tensor, op);
}
Work ProcessGroup::reduce(Tensor& tensor, int dst, ReduceOp op, const Group& group,
                          bool async_op) {
  SHMDIST_COLLECTIVE(reduce, tensor, dst, op);
}
Work ProcessGroup::all_gather(std::vector<Tensor>& tensor_list, const Tensor& tensor,
                              const Group& group, bool async_op) {
  SHMDIST_COLLECTIVE(all_gather, tensor_list, tensor);
}
Work ProcessGroup::all_gather_into_tensor(Tensor& output, const Tensor& input, const Group& group,
                                          bool async_op) {
  SHMDIST_COLLECTIVE(all_gather_into_tensor, output, input);
}
Work ProcessGroup::gather(const Tensor& tensor, std::vector<Tensor>& gather_list, int dst,
                          const Group& group, bool async_op) {
  SHMDIST_COLLECTIVE(gather, tensor, gather_list, dst);
}
Work ProcessGroup::scatter(Tensor& tensor, const std::vector<Tensor>& scatter_list, int src,
                           const Group& group, bool async_op) {
  SHMDIST_COLLECTIVE(scatter, tensor, scatter_list, src);
}
Work ProcessGroup::reduce_scatter(Tensor& output, const std::vector<Tensor>& input_list,
                                  ReduceOp op, const Group& group, bool async_op) {
  SHMDIST_COLLECTIVE(reduce_scatter, output, input_list, op);
}
Work ProcessGroup::reduce_scatter_tensor(Tensor& output, const Tensor& input, ReduceOp op,
                                         const Group& group, bool async_op) {
  SHMDIST_COLLECTIVE(reduce_scatter_tensor, output, input, op);
}
Work ProcessGroup::all_to_all(std::vector<Tensor>& output_list,
                              const std::vector<Tensor>& input_list, const Group& group,
                              bool async_op) {
  SHMDIST_COLLECTIVE(all_to_all, output_list, input_list);
}
Work ProcessGroup::all_to_all_single(Tensor& output, const Tensor& input,
                                     const std::vector<std::int64_t>& output_split_sizes,
                                     const std::vector<std::int64_t>& input_split_sizes,
                                     const Group& group, bool async_op) {
  SHMDIST_COLLECTIVE(all_to_all_single, output, input, output_split_sizes, input_split_sizes);
}

#undef SHMDIST_COLLECTIVE

// A collective like the others (counted, fingerprinted, agreed on): a member in another call
// fails every member's call at once, and a late member's barrier can only meet the others'
// barrier of the same number.
void ProcessGroup::barrier(const Group& group) {
  Impl& s = impl();
  const auto entry = s.engine->enter("barrier");
  auto done = coll::barrier(setup(s, group, "barrier", true));
  s.engine->wait(*done, std::nullopt);
}

void ProcessGroup::monitored_barrier(const Group& group, std::chrono::milliseconds timeout,
                                     bool wait_all_ranks) {
  Impl& s = impl();
  if (timeout.count() < 0)
    throw InvalidArgument("monitored_barrier: the timeout " + std::to_string(timeout.count()) +
                          " ms is negative");
  const auto entry = s.engine->enter("monitored_barrier");
  coll::monitored_barrier(setup(s, group, "monitored_barrier", true), timeout, wait_all_ranks);
}



namespace embedding {
using detail::ProcessGroupAccess;

Work start_barrier(ProcessGroup& pg, const Group& group) {
  ProcessGroup::Impl& s = ProcessGroupAccess::impl(pg);
  const auto entry = s.engine->enter("barrier");
  return ProcessGroupAccess::make_work(coll::barrier(setup(s, group, "barrier", false)));
}

Work reject_collective(ProcessGroup& pg, const Group& group, const std::string& call,
                       const std::string& why) {
  // Every collective that carries tensors, by its name in the table (coll/kinds.hpp).
  const std::optional<coll::Kind> kind = coll::kind_from_name(call);
  if (!kind || !coll::kind_info(*kind).data)
    throw InvalidArgument("reject_collective: '" + call + "' is not a collective shmdist knows "
                          "(expected one of " + coll::kind_names(/*data_only=*/true) + ")");
  ProcessGroup::Impl& s = ProcessGroupAccess::impl(pg);
  const auto entry = s.engine->enter("reject_collective");
  return ProcessGroupAccess::make_work(
      coll::reject(setup(s, group, call.c_str(), /*blocking=*/false), *kind, why));
}

}  // namespace embedding
}  // namespace shmdist
