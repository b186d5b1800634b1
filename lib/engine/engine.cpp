// The engine's point-to-point entry points and its send queues.

#include "base/cpus.hpp"
#include "engine/block_until.hpp"
#include "engine/operation_pool.hpp"

#include <utility>
#include <algorithm>
#include <cstring>

#include <shmdist/errors.hpp>

namespace shmdist::engine {

// Polls of the direct receive path before the general one takes over (a few microseconds
// of PAUSEs: a typical ping-pong turnaround, far below the spin phase of block_until).
constexpr unsigned kDirectSpins = 200;

Engine::Engine(std::unique_ptr<transport::Transport> transport, wait::SpinPolicy spin,
               std::chrono::milliseconds timeout)
    : transport_(std::move(transport)),
      rank_(transport_->rank()),
      world_(transport_->world_size()),
      spin_(spin),
      timeout_(timeout) {
  const int world = transport_->world_size();
  inflight_.resize(world);
  unexpected_from_.resize(world);
  send_queues_.resize(world);
  for (int p = 0; p < world; ++p)
    if (p != transport_->rank()) all_peers_.push_back(p);
}

Engine::~Engine() {
  fail_all_pending(std::make_exception_ptr(
      NotInitialized("the process group was destroyed while this operation was pending")));
}

// Operations still pending belong to Work handles (or to nobody, if the handles were
// dropped): unlink and fail them, and break their self-references so they are freed.
// Unfinished collectives fail their completions. Returns how many sends it failed. Only the
// destructor, finalize and abandon call it: nothing drives the engine afterwards, so a
// message still streaming in is never written into a receiver failed here.
std::size_t Engine::fail_all_pending(std::exception_ptr error) {
  while (!posted_.empty()) {
    Operation& op = posted_.front();
    posted_.pop_front();
    fail_operation(op, error);
  }
  for (Inflight& f : inflight_)
    if (Operation* op = std::exchange(f.receiver, nullptr)) fail_operation(*op, error);
  std::size_t sends = 0;
  for (auto& queue : send_queues_) {
    sends += queue.size();
    for (Operation* op : queue) drop_send(*op, error);
    queue.clear();
  }
  sending_to_.clear();
  for (auto& task : std::exchange(tasks_, {})) task->abandon(error);
  wake_sleepers();  // another thread's wait may be among them
  return sends;
}

// ---- sends ----------------------------------------------------------------------------------

void Engine::setup_send(Operation& op, const Tensor& tensor, int dst, const MatchKey& key) {
  op.kind = Operation::Kind::Send;
  op.peer = dst;
  op.set_view(tensor);
  op.out.env = {rank(), key, op.view.dtype, op.view.numel, op.view.nbytes};
  op.out.next = op.view.data;
}

// Sends to one destination leave in call order: a send may write straight into the ring only
// when nothing is queued before it.
void Engine::start_send(Operation& op) {
  auto& queue = send_queues_[op.peer];
  if (queue.empty()) {
    transport_->send_some(op.peer, op.out);
    if (op.out.done()) {
      end_send(op);
      return;
    }
    sending_to_.push_back(op.peer);
  }
  queue.push_back(&op);
}

bool Engine::push_sends() {
  bool moved = false;
  for (std::size_t i = 0; i < sending_to_.size();) {
    const int dst = sending_to_[i];
    auto& queue = send_queues_[dst];
    while (!queue.empty()) {
      Operation* op = queue.front();
      moved |= transport_->send_some(dst, op->out);
      if (!op->out.done()) break;
      queue.pop_front();
      end_send(*op);
    }
    if (queue.empty()) {
      sending_to_[i] = sending_to_.back();
      sending_to_.pop_back();
    } else {
      ++i;
    }
  }
  return moved;
}

// A blocking send gives up. Not yet started: it is simply dropped. Already started: the
// receiver is in the middle of the message, so the rest is copied and finished in the
// background; otherwise the stream to that peer would be cut mid-message.
void Engine::withdraw_send(Operation& op) {
  auto& queue = send_queues_[op.peer];
  auto it = std::find(queue.begin(), queue.end(), &op);
  if (it == queue.end()) return;
  // A single-copy offer is revoked, or (if the receiver is reading the buffer right now)
  // waited for; the send may turn out complete.
  if (op.out.started) transport_->release_outbound(op.peer, op.out);
  if (!op.out.started || op.out.done()) {
    const bool head = it == queue.begin();
    queue.erase(it);
    if (queue.empty()) std::erase(sending_to_, op.peer);
    // The next send to that peer may start now: if another thread of this rank sleeps on
    // it, no peer would ring for this.
    if (head) wake_sleepers();
    return;
  }
  auto orphan = std::make_shared<Operation>();
  orphan->kind = Operation::Kind::Send;
  orphan->peer = op.peer;
  orphan->out = op.out;
  const std::uint64_t rest = op.out.env.nbytes - op.out.sent;
  orphan->owned_copy.reset(new std::byte[rest ? rest : 1]);
  if (rest) std::memcpy(orphan->owned_copy.get(), op.out.next, rest);
  orphan->out.next = orphan->owned_copy.get();
  orphan->keepalive = orphan;
  *it = orphan.get();
}

// A queued send fails without being withdrawn (the group ends): its memory may go away, so
// the transport must stop referring to it first.
void Engine::drop_send(Operation& op, std::exception_ptr e) {
  if (op.kind == Operation::Kind::Send && op.out.started && !op.out.done())
    transport_->release_outbound(op.peer, op.out);
  fail_operation(op, std::move(e));
}

void Engine::finish_operation(Operation& op) {
  op.complete();
  auto keep = std::move(op.keepalive);  // may free `op` when this returns
}

void Engine::fail_operation(Operation& op, std::exception_ptr e) {
  op.fail(std::move(e));
  auto keep = std::move(op.keepalive);
}

// A transport never throws from send_some for one message's failure (the call making
// progress may be an unrelated one): it marks the message, and the failure goes to its send.
void Engine::end_send(Operation& op) {
  if (op.out.failure) [[unlikely]]
    return fail_operation(op, std::make_exception_ptr(PeerFailure(*op.out.failure)));
  finish_operation(op);
}

// ---- entry points ---------------------------------------------------------------------------

// The fast path of a blocking send: nothing is queued to `dst` and the whole message goes
// into the ring at once, so no Operation is built (building and destroying one costs more
// than the send itself). Otherwise what was sent so far carries over into one.
void Engine::send(const Tensor& tensor, int dst, const MatchKey& key) {
  if (!send_queues_[dst].empty()) return send_blocking(tensor, dst, key, nullptr);
  transport::OutboundMessage out;
  out.env = {rank_, key, tensor.dtype(), static_cast<std::uint64_t>(tensor.numel()),
             tensor.nbytes()};
  out.next = static_cast<const std::byte*>(tensor.data_ptr());
  transport_->send_some(dst, out);
  if (out.done()) [[likely]] {
    if (out.failure) [[unlikely]]
      throw PeerFailure(*out.failure);
    return;
  }
  send_blocking(tensor, dst, key, &out);
}

// The rest of a blocking send, with an Operation: queued behind earlier sends to `dst`, or,
// when `begun` is set, the message that send() could not finish (nothing queued before it).
void Engine::send_blocking(const Tensor& tensor, int dst, const MatchKey& key,
                           const transport::OutboundMessage* begun) {
  Operation op;
  setup_send(op, tensor, dst, key);
  if (begun) {
    op.out = *begun;
    sending_to_.push_back(dst);
    send_queues_[dst].push_back(&op);
  } else {
    start_send(op);
  }
  if (op.pending())
    await_blocking(op, {kBlockedSend, dst, nullptr, key, op.out.env.nbytes},
                   &Engine::withdraw_send);
  if (op.status == Operation::Status::Failed) std::rethrow_exception(op.error);
}

// Waits for the operation of a blocking call. If the wait fails or times out, the operation
// is withdrawn first (nothing may keep pointing at the caller's stack), then the error goes on.
void Engine::await_blocking(Operation& op, const WaitFocus& focus,
                            void (Engine::*withdraw)(Operation&)) {
  bool done = false;
  try {
    done = block_until([&] { return !op.pending(); }, focus, timeout_);
  } catch (...) {
    (this->*withdraw)(op);
    throw;
  }
  if (!done) {
    (this->*withdraw)(op);
    throw_timeout(focus, timeout_);
  }
}

// The direct path of a blocking receive: when no other receive is posted and no message
// that this receive could take waits as unexpected, the next matching message from `src`
// (or, for ANY_SOURCE, from the next source in rotation) is the one this receive must get,
// so it may be taken straight from the ring into the tensor. For a named source only that
// source's unexpected messages count: order holds per (source, group, tag), so a message
// from another rank waiting as unexpected (a remote peer's early barrier message in a job
// across hosts, say) cannot be one this receive must take first, and must not push every
// receive onto the general path while it waits. Spins briefly for it (a ping-pong
// turnaround); anything else falls back to the general path, which also drives every other
// pending operation.
int Engine::try_receive_direct(Tensor& tensor, int src, const MatchKey& key) {
  if (!posted_.empty()) return -1;
  if (src >= 0 ? unexpected_from_[src] != 0 : !unexpected_.empty()) return -1;
  const transport::Expectation want{
      {src, key, tensor.dtype(), static_cast<std::uint64_t>(tensor.numel()), tensor.nbytes()},
      static_cast<std::byte*>(tensor.data_ptr())};
  auto attempt = [&](transport::DirectResult& result) {
    if (src >= 0) {
      result = transport_->receive_direct(src, want);
      return src;
    }
    return transport_->receive_direct_any(want, result);
  };
  transport::DirectResult result;
  int from = attempt(result);
  if (result != transport::DirectResult::Empty) [[likely]]
    return result == transport::DirectResult::Received ? from : -1;
  // Not there yet: spin for it, unless more ranks are awake than there are CPUs.
  const bool crowded =
      cpus::oversubscribed(world_, spin_.cpus) && spin_.choose(transport_->awake_ranks()).yield;
  const unsigned tries = crowded ? 0 : kDirectSpins;
  for (unsigned i = 0; i < tries; ++i) {
    wait::cpu_relax();
    from = attempt(result);
    if (result == transport::DirectResult::Received) return from;
    if (result == transport::DirectResult::Other) return -1;
  }
  return -1;
}

int Engine::recv(Tensor& tensor, int src, const MatchKey& key, const std::vector<int>& candidates,
                 bool any_size, std::uint32_t blocked_as) {
  if (!any_size) {
    const int from = try_receive_direct(tensor, src, key);
    if (from >= 0) [[likely]]
      return from;
  }
  Operation op;
  op.kind = Operation::Kind::Recv;
  op.peer = src;
  op.key = key;
  op.set_view(tensor);
  op.any_size = any_size;
  post_receive(op);
  if (op.pending())
    await_blocking(op, {blocked_as, src, &candidates, key, tensor.nbytes()},
                   &Engine::withdraw_receive);
  if (op.status == Operation::Status::Failed) std::rethrow_exception(op.error);
  if (any_size) tensor = op.keep;
  return op.source;
}

// An any-source receive keeps who may send, for the "every sender is gone" check: one copy
// per distinct list (a group's members) for the engine's life, not one per receive.
const std::vector<int>* Engine::intern_candidates(const std::vector<int>& candidates) {
  for (auto it = candidate_lists_.rbegin(); it != candidate_lists_.rend(); ++it)
    if (*it == candidates) return &*it;
  return &candidate_lists_.emplace_back(candidates);
}

// A Work for an isend that left whole at once: one never-pending operation shared by all of
// them (per process, never destroyed, read-only once built), referred to without ownership
// (an aliasing shared_ptr with no control block), so such an isend allocates nothing and
// touches no reference count. Its data is in the ring already: nothing needs keeping alive.
std::shared_ptr<Operation> Engine::completed_send() {
  static Operation* const done = [] {
    auto* op = new Operation;  // intentionally never freed: Works may outlive everything
    op->kind = Operation::Kind::Send;
    op->complete();
    return op;
  }();
  return std::shared_ptr<Operation>(std::shared_ptr<Operation>(), done);
}

// As send(): with nothing queued to `dst`, a message that goes into the ring whole needs no
// Operation; otherwise what went out so far carries over into one.
std::shared_ptr<Operation> Engine::isend(const Tensor& tensor, int dst, const MatchKey& key) {
  transport::OutboundMessage out;
  const bool first = send_queues_[dst].empty();
  if (first) {
    out.env = {rank_, key, tensor.dtype(), static_cast<std::uint64_t>(tensor.numel()),
               tensor.nbytes()};
    out.next = static_cast<const std::byte*>(tensor.data_ptr());
    transport_->send_some(dst, out);
    if (out.done() && !out.failure) [[likely]]
      return completed_send();
  }
  auto op = std::allocate_shared<Operation>(PooledAllocator<Operation>{});
  setup_send(*op, tensor, dst, key);
  op->hold = tensor.storage_handle();
  op->engine = weak_from_this();
  op->keepalive = op;
  if (first) {
    op->out = out;
    if (out.done()) {  // failed at once (out.failure): the Work says why
      end_send(*op);
      return op;
    }
    sending_to_.push_back(dst);
    send_queues_[dst].push_back(op.get());
  } else {
    start_send(*op);
  }
  return op;
}

std::shared_ptr<Operation> Engine::irecv(const Tensor& tensor, int src, const MatchKey& key,
                                         const std::vector<int>& candidates) {
  auto op = std::allocate_shared<Operation>(PooledAllocator<Operation>{});
  op->kind = Operation::Kind::Recv;
  op->peer = src;
  if (src < 0) op->candidates = intern_candidates(candidates);
  op->key = key;
  op->set_view(tensor);
  op->hold = tensor.storage_handle();
  op->engine = weak_from_this();
  op->keepalive = op;
  post_receive(*op);
  return op;
}

bool Engine::test(Operation& op) {
  if (op.pending()) progress(op.kind == Operation::Kind::Recv ? op.peer : -1, false);
  // A collective that moved may complete only after its next step is posted: once more.
  if (op.pending() && op.kind == Operation::Kind::Collective) progress(-1, false);
  return !op.pending();
}

bool Engine::wait(Operation& op, std::optional<std::chrono::milliseconds> timeout) {
  if (op.pending()) {
    const auto limit = timeout ? *timeout : timeout_;
    WaitFocus focus{kBlockedWait, op.peer, nullptr, op.key, op.view.nbytes};
    if (op.kind == Operation::Kind::Recv && op.peer < 0) focus.candidates = op.candidates;
    if (op.kind == Operation::Kind::Send) focus.key = op.out.env.key;
    std::shared_ptr<BackgroundTask> task;  // held: the engine drops it once it finishes
    if (op.kind == Operation::Kind::Collective) {
      task = op.task.lock();
      focus.op = kBlockedCollective;
      focus.task = task.get();
    }
    const bool done = block_until([&] { return !op.pending(); }, focus, limit);
    if (!done) {
      if (timeout) return false;
      throw_timeout(focus, limit);
    }
  }
  if (op.status == Operation::Status::Failed) std::rethrow_exception(op.error);
  return true;
}

}  // namespace shmdist::engine
