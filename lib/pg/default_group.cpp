// The free functions of distributed.hpp: the default process group. A launch() in thread
// mode gives each rank's thread its own default (thread_local override), so seed-style code
// runs unchanged as threads.

#include <stdlib.h>

#include <utility>
#include <memory>

#include "pg/default_group.hpp"
#include "pg/impl.hpp"

namespace shmdist {
namespace {
std::unique_ptr<ProcessGroup> g_default;
thread_local ProcessGroup* t_default = nullptr;
thread_local detail::Rejoin t_rejoin;

// exit() (and a return from main) runs this before static destructors, with the exit status:
// a default group still initialized then ends without waiting for its peers.
void at_exit(int status, void*) {
  if (g_default && g_default->is_initialized()) {
    try {
      detail::ProcessGroupAccess::impl(*g_default).end_without_destroy(status & 0xff);
    } catch (...) {
    }
  }
}

ProcessGroup& current() {
  ProcessGroup* pg = t_default ? t_default : g_default.get();
  if (!pg || !pg->is_initialized())
    throw NotInitialized(
        "the default process group is not initialized; call init_process_group() first "
        "(and start the program with 'shmrun -n N program')");
  return *pg;
}
}  // namespace

namespace detail {
ProcessGroup* set_thread_default(ProcessGroup* pg) { return std::exchange(t_default, pg); }
Rejoin set_thread_rejoin(Rejoin rejoin) { return std::exchange(t_rejoin, std::move(rejoin)); }
ProcessGroup& default_process_group() { return current(); }
}  // namespace detail

void init_process_group(const std::string& backend, const InitOptions& options) {
  if (backend != "shm" && backend != "gloo" && !backend.empty())
    throw InvalidArgument("backend '" + backend +
                          "' is not available: shmdist provides 'shm' ('gloo' is accepted as an "
                          "alias so that torch programs port unchanged)");
  if (t_default) {  // a rank of launch(): it joined the job before the rank function ran
    if (t_default->is_initialized()) return;
    // Destroyed: join a fresh job among the same ranks, as under shmrun (launch.cpp).
    const ProcessGroup::Impl* was = detail::ProcessGroupAccess::impl_or_null(*t_default);
    if (!t_rejoin)
      throw InvalidArgument("init_process_group on rank " + std::to_string(was ? was->rank : -1) +
                            ": this thread's default group was destroyed and cannot be "
                            "initialized again here (only the thread launch() started for the "
                            "rank can)");
    *t_default = detail::ProcessGroupAccess::make(t_rejoin(options));
    return;
  }
  if (g_default && g_default->is_initialized())
    throw InvalidArgument(
        "init_process_group: the default process group is already initialized; call "
        "destroy_process_group() before initializing it again");
  g_default = std::make_unique<ProcessGroup>(options);
  static const bool registered = on_exit(at_exit, nullptr) == 0;
  (void)registered;
}

bool is_initialized() {
  ProcessGroup* pg = t_default ? t_default : g_default.get();
  return pg && pg->is_initialized();
}

void destroy_process_group() {
  ProcessGroup& pg = current();
  pg.destroy();
  if (!t_default) g_default.reset();
}

int get_rank(const Group& group) { return current().get_rank(group); }
int get_world_size(const Group& group) { return current().get_world_size(group); }
Group new_group(const std::vector<int>& ranks) { return current().new_group(ranks); }
int get_group_rank(const Group& group, int global_rank) {
  return current().get_group_rank(group, global_rank);
}
int get_global_rank(const Group& group, int group_rank) {
  return current().get_global_rank(group, group_rank);
}
std::vector<int> get_process_group_ranks(const Group& group) {
  return current().get_process_group_ranks(group);
}

void send(const Tensor& tensor, int dst, const Group& group, int tag) {
  current().send(tensor, dst, group, tag);
}
int recv(Tensor& tensor, int src, const Group& group, int tag) {
  return current().recv(tensor, src, group, tag);
}
Work isend(const Tensor& tensor, int dst, const Group& group, int tag) {
  return current().isend(tensor, dst, group, tag);
}
Work irecv(Tensor& tensor, int src, const Group& group, int tag) {
  return current().irecv(tensor, src, group, tag);
}
std::vector<Work> batch_isend_irecv(const std::vector<P2POp>& ops) {
  return current().batch_isend_irecv(ops);
}
void barrier(const Group& group) { current().barrier(group); }

Work broadcast(Tensor& tensor, int src, const Group& group, bool async_op) {
  return current().broadcast(tensor, src, group, async_op);
}
Work all_reduce(Tensor& tensor, ReduceOp op, const Group& group, bool async_op) {
  return current().all_reduce(tensor, op, group, async_op);
}
Work reduce(Tensor& tensor, int dst, ReduceOp op, const Group& group, bool async_op) {
  return current().reduce(tensor, dst, op, group, async_op);
}
Work all_gather(std::vector<Tensor>& tensor_list, const Tensor& tensor, const Group& group,
                bool async_op) {
  return current().all_gather(tensor_list, tensor, group, async_op);
}
Work all_gather_into_tensor(Tensor& output, const Tensor& input, const Group& group,
                            bool async_op) {
  return current().all_gather_into_tensor(output, input, group, async_op);
}
Work gather(const Tensor& tensor, std::vector<Tensor>& gather_list, int dst, const Group& group,
            bool async_op) {
  return current().gather(tensor, gather_list, dst, group, async_op);
}
Work scatter(Tensor& tensor, const std::vector<Tensor>& scatter_list, int src, const Group& group,
             bool async_op) {
  return current().scatter(tensor, scatter_list, src, group, async_op);
}
Work reduce_scatter(Tensor& output, const std::vector<Tensor>& input_list, ReduceOp op,
                    const Group& group, bool async_op) {
  return current().reduce_scatter(output, input_list, op, group, async_op);
}
Work reduce_scatter_tensor(Tensor& output, const Tensor& input, ReduceOp op, const Group& group,
                           bool async_op) {
  return current().reduce_scatter_tensor(output, input, op, group, async_op);
}
Work all_to_all(std::vector<Tensor>& output_list, const std::vector<Tensor>& input_list,
                const Group& group, bool async_op) {
  return current().all_to_all(output_list, input_list, group, async_op);
}
Work all_to_all_single(Tensor& output, const Tensor& input,
                       const std::vector<std::int64_t>& output_split_sizes,
                       const std::vector<std::int64_t>& input_split_sizes, const Group& group,
                       bool async_op) {
  return current().all_to_all_single(output, input, output_split_sizes, input_split_sizes, group,
                                     async_op);
}
void monitored_barrier(const Group& group, std::chrono::milliseconds timeout,
                       bool wait_all_ranks) {
  current().monitored_barrier(group, timeout, wait_all_ranks);
}

void send_bytes(std::span<const std::byte> bytes, int dst, const Group& group, int tag) {
  current().send_bytes(bytes, dst, group, tag);
}
int recv_bytes(std::span<std::byte> bytes, int src, const Group& group, int tag) {
  return current().recv_bytes(bytes, src, group, tag);
}
std::vector<std::byte> recv_bytes(int src, const Group& group, int tag, int* source) {
  return current().recv_bytes(src, group, tag, source);
}

}  // namespace shmdist
