// torch.distributed-style point-to-point messaging and collectives between processes on one
// host.
// The free functions act on the default process group (init_process_group creates it);
// ProcessGroup (process_group.hpp) offers the same calls as methods.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <shmdist/errors.hpp>
#include <shmdist/tensor.hpp>

namespace shmdist {

inline constexpr int ANY_SOURCE = -1;

namespace detail {
struct GroupInfo;
struct Operation;
struct ProcessGroupAccess;
}  // namespace detail

// A handle to a process group; a default-constructed Group{} means the world group.
// Obtained from new_group(); cheap to copy.
class Group {
 public:
  Group() = default;
  bool is_world() const { return info_ == nullptr; }
  // False on ranks that are not members of the group created by new_group().
  bool is_member() const;
  // Global ranks of the members in group-rank order (empty for the world handle).
  const std::vector<int>& ranks() const;
  const detail::GroupInfo* info() const { return info_.get(); }  // library-internal

 private:
  friend class ProcessGroup;
  friend struct detail::ProcessGroupAccess;
  explicit Group(std::shared_ptr<const detail::GroupInfo> info) : info_(std::move(info)) {}
  std::shared_ptr<const detail::GroupInfo> info_;
};

struct InitOptions {
  std::string init_method = "env://";
  int rank = -1;        // -1: take from the environment
  int world_size = -1;  // -1: take from the environment
  std::chrono::milliseconds timeout = std::chrono::minutes(30);  // torch's default
};

// The handle of a non-blocking operation (isend, irecv, batch_isend_irecv, and every
// collective). It keeps the operation's tensor storage alive until the operation is done.
class Work {
 public:
  Work() = default;
  void wait();                                   // throws what the operation failed with
  bool wait(std::chrono::milliseconds timeout);  // false if still pending at the timeout
  bool is_completed();                           // also makes progress
  int source_rank() const;                       // recv only: sender's global rank
  // A receive's sender's global rank; for every other operation (sends, collectives)
  // source_rank() throws InvalidArgument.
  bool is_send() const;

 private:
  friend class ProcessGroup;
  friend struct detail::ProcessGroupAccess;
  explicit Work(std::shared_ptr<detail::Operation> op) : op_(std::move(op)) {}
  std::shared_ptr<detail::Operation> op_;
};

struct P2POp {
  enum class Kind { Send, Recv };
  Kind op = Kind::Send;
  Tensor tensor;
  int peer = ANY_SOURCE;
  Group group;
  int tag = 0;
};
P2POp P2PSend(const Tensor& t, int peer, const Group& group = {}, int tag = 0);
P2POp P2PRecv(Tensor& t, int peer = ANY_SOURCE, const Group& group = {}, int tag = 0);

// ---- The default process group -------------------------------------------------------------

void init_process_group(const std::string& backend = "shm", const InitOptions& options = {});
bool is_initialized();
void destroy_process_group();

int get_rank(const Group& group = {});        // rank within group; -1 if not a member
int get_world_size(const Group& group = {});  // size of group; -1 if not a member
Group new_group(const std::vector<int>& ranks);  // every world rank calls it, same order
int get_group_rank(const Group& group, int global_rank);
int get_global_rank(const Group& group, int group_rank);
std::vector<int> get_process_group_ranks(const Group& group);

void send(const Tensor& tensor, int dst, const Group& group = {}, int tag = 0);
int recv(Tensor& tensor, int src = ANY_SOURCE, const Group& group = {}, int tag = 0);
Work isend(const Tensor& tensor, int dst, const Group& group = {}, int tag = 0);
Work irecv(Tensor& tensor, int src = ANY_SOURCE, const Group& group = {}, int tag = 0);
std::vector<Work> batch_isend_irecv(const std::vector<P2POp>& ops);
void barrier(const Group& group = {});

// ---- Collectives (every member of the group calls them, in the same order) -----------------
//
// src/dst are global ranks. With async_op = false the call blocks and returns a completed
// Work; with true it returns at once and the Work completes later, also while this rank
// blocks in other calls. Results are bitwise the same on every member and from run to run:
// each element is reduced over the members' values in group-rank order, ((x0 op x1) op x2)...;
// float16 and bfloat16 accumulate in float32 and round once. Mismatched calls (another
// collective, op, dtype, element count or root on some member) throw InvalidArgument on
// every member, naming the first disagreeing rank and both calls; the group stays usable.
// Which tensors each call writes is noted beside it; nothing else is written.

// torch.distributed.ReduceOp (same numbering as torch 1.13). AVG: floating dtypes only;
// BAND/BOR/BXOR: integer and bool only; on bool SUM and MAX are or, PRODUCT and MIN are and.
enum class ReduceOp { SUM = 0, AVG = 1, PRODUCT = 2, MIN = 3, MAX = 4, BAND = 5, BOR = 6, BXOR = 7 };

Work broadcast(Tensor& tensor, int src, const Group& group = {}, bool async_op = false);
// writes: tensor on every member but src
Work all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::SUM, const Group& group = {},
                bool async_op = false);  // writes: tensor on every member
Work reduce(Tensor& tensor, int dst, ReduceOp op = ReduceOp::SUM, const Group& group = {},
            bool async_op = false);  // writes: tensor on dst only; other inputs stay as they were
Work all_gather(std::vector<Tensor>& tensor_list, const Tensor& tensor, const Group& group = {},
                bool async_op = false);  // writes: every entry of tensor_list
Work all_gather_into_tensor(Tensor& output, const Tensor& input, const Group& group = {},
                            bool async_op = false);  // writes: output (group size x input)
Work gather(const Tensor& tensor, std::vector<Tensor>& gather_list, int dst = 0,
            const Group& group = {}, bool async_op = false);  // writes: gather_list on dst only
Work scatter(Tensor& tensor, const std::vector<Tensor>& scatter_list, int src = 0,
             const Group& group = {}, bool async_op = false);  // writes: tensor; list read on src
Work reduce_scatter(Tensor& output, const std::vector<Tensor>& input_list,
                    ReduceOp op = ReduceOp::SUM, const Group& group = {},
                    bool async_op = false);  // writes: output
Work reduce_scatter_tensor(Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::SUM,
                           const Group& group = {}, bool async_op = false);  // writes: output
Work all_to_all(std::vector<Tensor>& output_list, const std::vector<Tensor>& input_list,
                const Group& group = {}, bool async_op = false);  // writes: output_list
// Splits along dim 0, in rows; empty split lists mean equal splits.
Work all_to_all_single(Tensor& output, const Tensor& input,
                       const std::vector<std::int64_t>& output_split_sizes = {},
                       const std::vector<std::int64_t>& input_split_sizes = {},
                       const Group& group = {}, bool async_op = false);  // writes: output
// Rank 0 of the group waits up to `timeout` for every member; throws Timeout on every member
// that took part, naming the members that did not arrive (the first one, or all of them with
// wait_all_ranks).
void monitored_barrier(const Group& group = {},
                       std::chrono::milliseconds timeout = std::chrono::seconds(30),
                       bool wait_all_ranks = false);

// Raw bytes, matched and ordered exactly like tensors (a byte message is a uint8 tensor).
// recv_bytes into a span needs the exact size; the vector form takes any size.
void send_bytes(std::span<const std::byte> bytes, int dst, const Group& group = {}, int tag = 0);
int recv_bytes(std::span<std::byte> bytes, int src = ANY_SOURCE, const Group& group = {},
               int tag = 0);
std::vector<std::byte> recv_bytes(int src = ANY_SOURCE, const Group& group = {}, int tag = 0,
                                  int* source = nullptr);

namespace detail {
// The bytes of a trivially copyable value, for send_object / recv_object.
template <class T>
std::span<const std::byte> object_bytes(const T& value) {
  static_assert(std::is_trivially_copyable_v<T>, "send_object needs a trivially copyable type");
  return std::as_bytes(std::span<const T, 1>(&value, 1));
}
template <class T>
std::span<std::byte> object_bytes(T& value) {
  static_assert(std::is_trivially_copyable_v<T>, "recv_object needs a trivially copyable type");
  return std::as_writable_bytes(std::span<T, 1>(&value, 1));
}
}  // namespace detail

// Trivially copyable values, sent as their bytes (the receive needs the same size).
template <class T>
void send_object(const T& value, int dst, const Group& group = {}, int tag = 0) {
  send_bytes(detail::object_bytes(value), dst, group, tag);
}
template <class T>
int recv_object(T& value, int src = ANY_SOURCE, const Group& group = {}, int tag = 0) {
  return recv_bytes(detail::object_bytes(value), src, group, tag);
}

}  // namespace shmdist
