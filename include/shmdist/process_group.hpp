// ProcessGroup: the whole point-to-point API as methods of an object, so a program can hold
// several independent jobs' groups at once without global state. The free functions of
// distributed.hpp act on a default instance that init_process_group creates.
//
// Threading rule: several threads may call on a ProcessGroup (and wait on its Work objects) at
// once. Calls on different groups proceed independently; calls on one group made at once
// from several threads pair in whatever order the threads enter, so the program orders them
// (docs/semantics.md, "Threads"). destroy() must not run while another thread is in a call.
// Different ProcessGroup objects may be used concurrently from different threads.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <shmdist/distributed.hpp>

namespace shmdist {

namespace detail {
struct ProcessGroupAccess;
}

class ProcessGroup {
 public:
  // Joins the job this process belongs to: launched by shmrun (its SHMDIST_* variables), or
  // by torchrun-style variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Open MPI's
  // mpirun (OMPI_COMM_WORLD_*) or PMI (PMI_RANK, PMI_SIZE). Throws SetupError otherwise.
  explicit ProcessGroup(const InitOptions& options = {});
  ProcessGroup(ProcessGroup&&) noexcept;
  ProcessGroup& operator=(ProcessGroup&&) noexcept;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;
  ~ProcessGroup();  // destroys the group if destroy() was not called (never throws)

  bool is_initialized() const;
  // destroy_process_group: finishes pending sends, waits for the other ranks to destroy
  // theirs, and reports on stderr (one line per peer) messages that were never received.
  void destroy();

  int get_rank(const Group& group = {}) const;
  int get_world_size(const Group& group = {}) const;
  Group new_group(const std::vector<int>& ranks);
  int get_group_rank(const Group& group, int global_rank) const;
  int get_global_rank(const Group& group, int group_rank) const;
  std::vector<int> get_process_group_ranks(const Group& group) const;
  std::chrono::milliseconds timeout() const;

  void send(const Tensor& tensor, int dst, const Group& group = {}, int tag = 0);
  int recv(Tensor& tensor, int src = ANY_SOURCE, const Group& group = {}, int tag = 0);
  Work isend(const Tensor& tensor, int dst, const Group& group = {}, int tag = 0);
  Work irecv(Tensor& tensor, int src = ANY_SOURCE, const Group& group = {}, int tag = 0);
  std::vector<Work> batch_isend_irecv(const std::vector<P2POp>& ops);
  void barrier(const Group& group = {});

  // Collectives: semantics as the free functions of distributed.hpp.
  Work broadcast(Tensor& tensor, int src, const Group& group = {}, bool async_op = false);
  Work all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::SUM, const Group& group = {},
                  bool async_op = false);
  Work reduce(Tensor& tensor, int dst, ReduceOp op = ReduceOp::SUM, const Group& group = {},
              bool async_op = false);
  Work all_gather(std::vector<Tensor>& tensor_list, const Tensor& tensor,
                  const Group& group = {}, bool async_op = false);
  Work all_gather_into_tensor(Tensor& output, const Tensor& input, const Group& group = {},
                              bool async_op = false);
  Work gather(const Tensor& tensor, std::vector<Tensor>& gather_list, int dst = 0,
              const Group& group = {}, bool async_op = false);
  Work scatter(Tensor& tensor, const std::vector<Tensor>& scatter_list, int src = 0,
               const Group& group = {}, bool async_op = false);
  Work reduce_scatter(Tensor& output, const std::vector<Tensor>& input_list,
                      ReduceOp op = ReduceOp::SUM, const Group& group = {},
                      bool async_op = false);
  Work reduce_scatter_tensor(Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::SUM,
                             const Group& group = {}, bool async_op = false);
  Work all_to_all(std::vector<Tensor>& output_list, const std::vector<Tensor>& input_list,
                  const Group& group = {}, bool async_op = false);
  Work all_to_all_single(Tensor& output, const Tensor& input,
                         const std::vector<std::int64_t>& output_split_sizes = {},
                         const std::vector<std::int64_t>& input_split_sizes = {},
                         const Group& group = {}, bool async_op = false);
  void monitored_barrier(const Group& group = {},
                         std::chrono::milliseconds timeout = std::chrono::seconds(30),
                         bool wait_all_ranks = false);

  void send_bytes(std::span<const std::byte> bytes, int dst, const Group& group = {},
                  int tag = 0);
  int recv_bytes(std::span<std::byte> bytes, int src = ANY_SOURCE, const Group& group = {},
                 int tag = 0);
  std::vector<std::byte> recv_bytes(int src = ANY_SOURCE, const Group& group = {}, int tag = 0,
                                    int* source = nullptr);

  template <class T>
  void send_object(const T& value, int dst, const Group& group = {}, int tag = 0) {
    send_bytes(detail::object_bytes(value), dst, group, tag);
  }
  template <class T>
  int recv_object(T& value, int src = ANY_SOURCE, const Group& group = {}, int tag = 0) {
    return recv_bytes(detail::object_bytes(value), src, group, tag);
  }

  struct Impl;

 private:
  friend struct detail::ProcessGroupAccess;
  explicit ProcessGroup(std::shared_ptr<Impl> impl);
  Impl& impl() const;
  std::shared_ptr<Impl> impl_;
};

}  // namespace shmdist
