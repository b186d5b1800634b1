// The engine's point-to-point entry points (with the fast paths of blocking send and receive),
// entering the engine, progress, and failing what is pending. The matcher is matcher.cpp,
// the send queues send_queues.cpp, the waiter waiter.hpp and waiter.cpp.

#include "base/cpus.hpp"
#include "engine/engine.hpp"
#include "engine/operation_pool.hpp"

#include <utility>
#include <algorithm>
#include <cstring>

#include <shmdist/errors.hpp>

namespace shmdist::engine {

// Polls of the direct receive path before the general one takes over (a few microseconds
// of PAUSEs: a typical ping-pong turnaround, far below the spin phase of block_until).
constexpr unsigned kDirectSpins = 200;

Engine::Engine(transport::Link link, wait::SpinPolicy spin, std::chrono::milliseconds timeout)
    : peers_(std::move(link.peers)),
      waker_(std::move(link.waker)),
      transport_(std::move(link.bytes)),
      rank_(transport_->rank()),
      world_(transport_->world_size()),
      spin_(spin),
      timeout_(timeout),
      waiter_(*transport_, *waker_, *peers_, lock_, spin_, all_peers_) {
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
  for (std::size_t src = 0; src < inflight_.size(); ++src) {
    Inflight& f = inflight_[src];
    // The memory a message streams into goes away with its receiver or with the engine: the
    // transport gives the message up, and keeps that memory while it might still write there.
    if (f.receiver || f.unexpected) transport_->abandon_inbound(static_cast<int>(src), memory_of(f));
    if (Operation* op = std::exchange(f.receiver, nullptr)) fail_operation(*op, error);
    f.sink.consumer = nullptr;  // its owner (a schedule) is abandoned below
  }
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

// What owns the memory the message from `f`'s source streams into: its receive's tensor or
// staging buffer, or its unexpected buffer (taken: only a message nobody will receive any
// more is asked about).
std::shared_ptr<void> Engine::memory_of(Inflight& f) {
  if (f.unexpected) return std::shared_ptr<void>(std::move(f.unexpected->buffer));
  Operation& op = *f.receiver;
  if (op.staging) return std::shared_ptr<void>(std::move(op.staging));
  return op.any_size ? op.keep.storage_handle() : op.hold;
}

void Engine::finish_operation(Operation& op) {
  op.complete();
  auto keep = std::move(op.keepalive);  // may free `op` when this returns
}

void Engine::fail_operation(Operation& op, std::exception_ptr e) {
  op.fail(std::move(e));
  auto keep = std::move(op.keepalive);
}

// ---- progress ------------------------------------------------------------------------------

bool Engine::progress(int preferred, bool full_scan) {
  bool moved = transport_->poll(*this, preferred, full_scan);
  if (!tasks_.empty()) moved |= advance_tasks();
  if (!sending_to_.empty()) moved |= push_sends();
  transport_->flush();
  return moved;
}

void Engine::add_task(std::shared_ptr<BackgroundTask> task) {
  task->advance();
  if (!task->finished()) tasks_.push_back(std::move(task));
}

// Tasks advance in start order; a task may start point-to-point operations here, which
// push_sends (after this) and the next poll pick up.
bool Engine::advance_tasks() {
  bool moved = false;
  for (std::size_t i = 0; i < tasks_.size(); ++i) moved |= tasks_[i]->advance();
  std::erase_if(tasks_, [](const auto& t) { return t->finished(); });
  return moved;
}

std::size_t Engine::pending_operations() const {
  std::size_t n = 0;
  for (auto it = posted_.begin(); it != posted_.end(); ++it) ++n;
  for (const auto& q : send_queues_) n += q.size();
  for (const Inflight& f : inflight_) n += f.receiver != nullptr;
  return n + tasks_.size();
}

// ---- entry points ---------------------------------------------------------------------------

std::optional<Engine::Entry> Engine::try_enter(const char* call, Clock::duration limit) {
  if (lock_.held_by_this_thread()) return Entry{};
  // A free lock first: its deadline (a clock read) matters only to a thread that must wait.
  if (!lock_.try_acquire() && !lock_.acquire_until(Clock::now() + limit)) return std::nullopt;
  lock_.set_call(call);
  return Entry{&lock_};
}

Engine::Entry Engine::enter(const char* call, Clock::duration limit) {
  if (std::optional<Entry> entry = try_enter(call, limit)) [[likely]]
    return std::move(*entry);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(limit).count();
  throw Timeout(std::string(call) + " on rank " + std::to_string(rank_) + " timed out after " +
                std::to_string(ms) + " ms waiting to enter the engine: another thread of this "
                "process is inside it (in " + lock_.call() + ") and did not let it in. A call "
                "lets others in whenever it waits, so that thread is stuck in work that does "
                "not wait (stopped by a debugger or a signal?). Raise InitOptions::timeout if "
                "it is just slow.");
}

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
                            void (Engine::*withdraw)(Operation&, bool)) {
  bool done = false;
  try {
    done = block_until([&] { return !op.pending(); }, focus, timeout_);
  } catch (...) {
    (this->*withdraw)(op, true);
    throw;
  }
  if (!done) {
    (this->*withdraw)(op, false);
    waiter_.throw_timeout(focus, timeout_);
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
      cpus::oversubscribed(world_, spin_.cpus) && spin_.choose(waker_->awake_ranks()).yield;
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
  if (op.pending()) {
    // Kept only should the receive give its message up while MPI writes into the tensor.
    op.hold = tensor.storage_handle();
    await_blocking(op, {blocked_as, src, &candidates, key, tensor.nbytes()},
                   &Engine::withdraw_receive);
  }
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
                                         const std::vector<int>& candidates, bool any_size,
                                         std::shared_ptr<transport::ByteConsumer> consumer) {
  auto op = std::allocate_shared<Operation>(PooledAllocator<Operation>{});
  op->kind = Operation::Kind::Recv;
  op->peer = src;
  op->any_size = any_size;
  op->consumer = std::move(consumer);
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
      focus.subject = task.get();
    }
    const bool done = block_until([&] { return !op.pending(); }, focus, limit);
    if (!done) {
      if (timeout) return false;
      waiter_.throw_timeout(focus, limit);
    }
  }
  if (op.status == Operation::Status::Failed) std::rethrow_exception(op.error);
  return true;
}

}  // namespace shmdist::engine
