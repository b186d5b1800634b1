// torch.distributed-style point-to-point messaging between processes on one host.
// The free functions act on the default process group (init_process_group creates it);
// ProcessGroup (process_group.hpp) offers the same calls as methods.
#pragma once

#include <chrono>
#include <cstddef>
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
  explicit Group(std::shared_ptr<const detail::GroupInfo> info) : info_(std::move(info)) {}
  std::shared_ptr<const detail::GroupInfo> info_;
};

struct InitOptions {
  std::string init_method = "env://";
  int rank = -1;        // -1: take from the environment
  int world_size = -1;  // -1: take from the environment
  std::chrono::milliseconds timeout = std::chrono::minutes(30);  // torch's default
};

// The handle of a non-blocking operation (isend, irecv, batch_isend_irecv).
// It keeps the operation's tensor storage alive until the operation is done.
class Work {
 public:
  Work() = default;
  void wait();                                   // throws what the operation failed with
  bool wait(std::chrono::milliseconds timeout);  // false if still pending at the timeout
  bool is_completed();                           // also makes progress
  int source_rank() const;                       // recv only: sender's global rank
  bool is_send() const;

 private:
  friend class ProcessGroup;
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
