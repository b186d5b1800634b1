// Matching: where each incoming message goes. A message is routed when its first record
// arrives: to the first posted receive that matches it (posting order), or to the unexpected
// list (arrival order) until a receive claims it, even while it is still streaming in.

#include <sched.h>

#include <utility>
#include <cstring>
#include <new>
#include <optional>

#include "engine/engine.hpp"
#include "engine/group_name.hpp"

namespace shmdist::engine {
namespace {

bool matches(const Operation& op, const transport::Envelope& env) {
  return op.key.routes(env.key) && (op.peer < 0 || op.peer == env.src);
}

// Why `op` cannot take `env` although the key matches; nullopt when it can. The common case
// (it can) is decided inline; only a mismatch builds the text, out of line.
std::optional<std::string> explain_incompatibility(const Operation& op,
                                                   const transport::Envelope& env);
inline std::optional<std::string> incompatibility(const Operation& op,
                                                  const transport::Envelope& env) {
  if (op.key.group_sig == env.key.group_sig && (op.any_size || op.view.numel == env.numel))
      [[likely]]
    return std::nullopt;
  return explain_incompatibility(op, env);
}

[[gnu::noinline]] std::optional<std::string> explain_incompatibility(
    const Operation& op, const transport::Envelope& env) {
  if (op.key.group_sig != env.key.group_sig)
    return "the message from rank " + std::to_string(env.src) + " was sent on " +
           group_name(env.key.group_id) + " with different members than this rank's " +
           group_name(env.key.group_id) +
           ": every rank must call new_group with the same ranks, in the same order";
  if (op.any_size || op.view.numel == env.numel) return std::nullopt;
  return "recv expected " + std::to_string(op.view.numel) + " elements (" +
         std::string(dtype_name(op.view.dtype)) + ") but the message from rank " +
         std::to_string(env.src) + " with tag " + std::to_string(env.key.tag) + " has " +
         std::to_string(env.numel) + " elements (" + std::string(dtype_name(env.dtype)) + ", " +
         std::to_string(env.nbytes) +
         " bytes). The message stays queued: receive it with a tensor of " +
         std::to_string(env.numel) + " elements";
}

std::unique_ptr<std::byte[]> allocate(std::uint64_t n, const transport::Envelope& env) {
  std::unique_ptr<std::byte[]> p(new (std::nothrow) std::byte[n ? n : 1]);
  if (!p)
    throw Error("cannot allocate " + std::to_string(n) + " bytes for a message from rank " +
                std::to_string(env.src) + " (tag " + std::to_string(env.key.tag) +
                "); free memory or receive messages sooner so fewer wait unreceived");
  return p;
}

// Hands `n` bytes of a message, from offset `at`, to the receive's consumer if it has one
// (bytes the engine itself kept or converted).
void consume(const Operation& op, const std::byte* bytes, std::uint64_t at, std::uint64_t n) {
  if (op.consumer && n) op.consumer->consume(at, {bytes, static_cast<std::size_t>(n)});
}

// A receive of any size gets a byte tensor of the message's size.
void size_for(Operation& op, std::uint64_t nbytes) {
  op.keep = empty({static_cast<std::int64_t>(nbytes)}, kUInt8);
  op.set_view(op.keep);
}

}  // namespace

transport::InboundSink* Engine::on_message_start(const transport::Envelope& env) {
  if (env.key.group_id != 0) [[unlikely]]
    check_group(env);
  Inflight& f = inflight_[env.src];
  f.sink = {};
  f.env = env;
  f.receiver = nullptr;
  f.unexpected = nullptr;
  f.seq = ++arrivals_;
  if (Operation* op = take_posted_match(env)) {
    try {
      attach_receiver(f, *op);
      return &f.sink;
    } catch (...) {
      f.receiver = nullptr;
      fail_operation(*op, std::current_exception());
    }
  }
  to_unexpected(f);
  return &f.sink;
}

void Engine::on_message_complete(transport::InboundSink*, const transport::Envelope& env) {
  Inflight& f = inflight_[env.src];
  if (Operation* op = std::exchange(f.receiver, nullptr)) {
    finish_receive(*op, env);
  } else if (Unexpected* u = std::exchange(f.unexpected, nullptr)) {
    u->complete = true;
  }
}

// Unlinks and returns the first posted receive that matches `env`. Receives whose key matches
// but which cannot take the message (element count, group members) fail with InvalidArgument.
Operation* Engine::take_posted_match(const transport::Envelope& env) {
  for (auto it = posted_.begin(); it != posted_.end();) {
    Operation& op = *it;
    if (!matches(op, env)) {
      ++it;
      continue;
    }
    it = posted_.erase(it);
    if (auto why = incompatibility(op, env)) {
      fail_operation(op, std::make_exception_ptr(InvalidArgument(*why)));
      continue;
    }
    return &op;
  }
  return nullptr;
}

void Engine::attach_receiver(Inflight& f, Operation& op) {
  if (op.any_size) size_for(op, f.env.nbytes);
  if (op.any_size || op.view.dtype == f.env.dtype) {
    f.sink.dest = op.view.data;
    f.sink.consumer = op.consumer.get();
  } else {
    op.staging = allocate(f.env.nbytes, f.env);
    f.sink.dest = op.staging.get();
  }
  f.receiver = &op;
}

void Engine::to_unexpected(Inflight& f) {
  Unexpected u;
  u.env = f.env;
  u.seq = f.seq;
  u.buffer = allocate(f.env.nbytes, f.env);
  auto it = insert_unexpected(std::move(u));
  f.unexpected = &*it;
  f.sink.dest = it->buffer.get();
  f.sink.consumer = nullptr;
}

std::list<Engine::Unexpected>::iterator Engine::insert_unexpected(Unexpected u) {
  auto pos = unexpected_.end();
  while (pos != unexpected_.begin() && std::prev(pos)->seq > u.seq) --pos;
  ++unexpected_from_[u.env.src];
  return unexpected_.insert(pos, std::move(u));
}

void Engine::erase_unexpected(std::list<Unexpected>::iterator it) {
  --unexpected_from_[it->env.src];
  unexpected_.erase(it);
}

// A new receive looks at unexpected messages first (arrival order), then waits in the
// posted list.
void Engine::post_receive(Operation& op) {
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    if (!matches(op, it->env)) continue;
    if (auto why = incompatibility(op, it->env)) {
      fail_operation(op, std::make_exception_ptr(InvalidArgument(*why)));
      return;
    }
    if (it->complete) deliver(op, *it);
    else claim_inflight(op, *it);
    erase_unexpected(it);
    return;
  }
  posted_.push_back(op);
}

void Engine::deliver(Operation& op, Unexpected& u) {
  if (op.any_size) size_for(op, u.env.nbytes);
  if (op.any_size || op.view.dtype == u.env.dtype) {
    if (op.consumer) consume(op, u.buffer.get(), 0, u.env.nbytes);
    else if (u.env.nbytes) std::memcpy(op.view.data, u.buffer.get(), u.env.nbytes);
  } else {
    convert_elements(u.env.nbytes ? u.buffer.get() : nullptr, u.env.dtype, op.view.data,
                     op.view.dtype, u.env.numel);
    consume(op, op.view.data, 0, op.view.nbytes);
  }
  op.source = u.env.src;
  finish_operation(op);
}

// `op` takes over a message that is still streaming into an unexpected buffer: what arrived
// so far moves into the tensor and the rest streams there directly; unless the transport
// cannot stop writing into the buffer (MPI matched a payload's piece to it), in which case
// the message goes on arriving there and is copied into the tensor when it is whole.
void Engine::claim_inflight(Operation& op, Unexpected& u) {
  Inflight& f = inflight_[u.env.src];
  if (op.any_size) size_for(op, u.env.nbytes);
  if ((op.any_size || op.view.dtype == u.env.dtype) && transport_->release_inbound(u.env.src)) {
    if (op.consumer) consume(op, u.buffer.get(), 0, f.sink.received);
    else if (f.sink.received) std::memcpy(op.view.data, u.buffer.get(), f.sink.received);
    f.sink.dest = op.view.data;
    f.sink.consumer = op.consumer.get();
  } else {
    op.staging = std::move(u.buffer);  // keeps receiving there; converted (or copied) at completion
  }
  f.unexpected = nullptr;
  f.receiver = &op;
}

bool Engine::cancel_receive(Operation& op) {
  if (!op.posted_hook.is_linked()) return false;
  posted_.erase(posted_.iterator_to(op));
  fail_operation(op, std::make_exception_ptr(Error(
                         "the receive was cancelled before a message matched it (rank " +
                         std::to_string(rank_) + ")")));
  return true;
}

// A receive gives up (its blocking call timed out or failed). If a message was already
// streaming into it, the message goes back to being unexpected (or to the next posted
// receive that matches), so that no byte and no ordering is lost. Only Engine::recv
// withdraws, and its receive has no consumer (a consumer's bytes could not be put back).
// A message the transport could not let go of in time is given up instead (settle_inbound).
void Engine::withdraw_receive(Operation& op, bool wait_failed) {
  if (op.posted_hook.is_linked()) {
    posted_.erase(posted_.iterator_to(op));
    return;
  }
  for (Inflight& f : inflight_) {
    if (f.receiver != &op) continue;
    if (!op.staging && !settle_inbound(f, wait_failed)) return;  // given up: nothing to keep
    Unexpected u;
    u.env = f.env;
    u.seq = f.seq;
    if (op.staging) {
      u.buffer = std::move(op.staging);
    } else {
      u.buffer = allocate(f.env.nbytes, f.env);
      if (f.sink.received) std::memcpy(u.buffer.get(), f.sink.dest, f.sink.received);
    }
    f.sink.dest = u.buffer.get();
    f.receiver = nullptr;
    auto it = insert_unexpected(std::move(u));
    f.unexpected = &*it;
    if (Operation* next = take_posted_match(it->env)) {
      claim_inflight(*next, *it);
      erase_unexpected(it);
    }
    return;
  }
}

// The caller's memory (the tensor of a receive that gives up) is about to go: wait until the
// transport writes nothing more into it. Only MPI may be unable to stop at once (it matched
// a payload's piece to the memory, and the piece lands when its sender pushes it), so this
// asks again, for at most one more timeout: each ask looks at that piece alone (it is not a
// poll: no other message moves, no peer's failure interrupts it, and the message cannot
// complete into `op` meanwhile). Past that the message is given up (abandon_inbound, which
// keeps the tensor's memory alive while MPI may write into it, and breaks the stream from
// the sender), and the receive raises PeerFailure naming the sender; nothing refers to `op`
// any more. A receive whose wait failed gives the message up at once: its call raises that
// failure anyway, and the sender may be gone. Returns false if the message was given up.
bool Engine::settle_inbound(Inflight& f, bool wait_failed) {
  const int src = f.env.src;
  if (transport_->release_inbound(src)) return true;
  if (wait_failed) {  // the call fails anyway: no wait for a sender that may be gone
    transport_->abandon_inbound(src, memory_of(f));
    f.receiver = nullptr;
    return false;
  }
  const auto deadline = Clock::now() + timeout_;
  while (!transport_->release_inbound(src)) {
    if (Clock::now() >= deadline) {
      transport_->abandon_inbound(src, memory_of(f));
      f.receiver = nullptr;
      throw PeerFailure(
          "rank " + std::to_string(src) + " stopped sending a " + std::to_string(f.env.nbytes) +
          "-byte message midway: its receive on rank " + std::to_string(rank_) +
          " gave up, and the transfer into the receive's tensor did not finish within the "
          "timeout after that. MPI may still write the rest into that tensor (its memory is "
          "kept): do not rely on its contents. Nothing more is received from rank " +
          std::to_string(src) + ". A sender must keep calling into shmdist (a wait, a test) "
          "while a large message of its leaves");
    }
    sched_yield();  // the sender may need this CPU to push the piece
  }
  return true;
}

void Engine::finish_receive(Operation& op, const transport::Envelope& env) {
  if (op.staging) {
    // Staged for another dtype (converted), or because the transport could not move the
    // message out of its unexpected buffer (claim_inflight: copied, as bytes for any_size).
    if (op.any_size || op.view.dtype == env.dtype) {
      if (env.nbytes) std::memcpy(op.view.data, op.staging.get(), env.nbytes);
    } else {
      convert_elements(op.staging.get(), env.dtype, op.view.data, op.view.dtype, env.numel);
    }
    op.staging.reset();
    consume(op, op.view.data, 0, op.view.nbytes);
  }
  op.source = env.src;
  finish_operation(op);
}

}  // namespace shmdist::engine
