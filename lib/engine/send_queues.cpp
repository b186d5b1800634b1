// The send queues: one FIFO per destination; a send may go straight into the ring only when
// nothing is queued before it, and progress pushes the heads of the queues.

#include "engine/engine.hpp"

#include <algorithm>
#include <cstring>

#include <shmdist/errors.hpp>

namespace shmdist::engine {

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
void Engine::withdraw_send(Operation& op, bool /*wait_failed*/) {
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

// A transport never throws from send_some for one message's failure (the call making
// progress may be an unrelated one): it marks the message, and the failure goes to its send.
void Engine::end_send(Operation& op) {
  if (op.out.failure) [[unlikely]]
    return fail_operation(op, std::make_exception_ptr(PeerFailure(*op.out.failure)));
  finish_operation(op);
}

}  // namespace shmdist::engine
