// Work handles and P2POp builders.

#include "engine/engine.hpp"

#include <algorithm>

#include <shmdist/distributed.hpp>

namespace shmdist {
namespace {

detail::Operation& checked(const std::shared_ptr<detail::Operation>& op, const char* call) {
  if (!op)
    throw InvalidArgument(std::string("Work::") + call +
                          ": this Work is empty (default-constructed); use the Work returned by "
                          "isend, irecv or batch_isend_irecv");
  return *op;
}

// The engine that can still make progress on `op`, or a clear error if it is gone.
std::shared_ptr<engine::Engine> engine_of(detail::Operation& op) {
  auto engine = op.engine.lock();
  if (!engine && op.pending())
    throw NotInitialized(
        "the process group of this Work was destroyed before the operation completed");
  return engine;
}

}  // namespace

// The operation's status is written by whichever thread of the rank makes progress, under
// the engine's lock: it is read under that lock too, while the engine lives. Once the engine
// is gone (the weak_ptr expired) nothing writes it any more.
void Work::wait() {
  detail::Operation& op = checked(op_, "wait");
  if (auto engine = op.engine.lock()) {
    const auto entry = engine->enter("Work::wait");
    engine->wait(op, std::nullopt);
    return;
  }
  if (op.status == detail::Operation::Status::Done) return;  // no engine needed
  engine_of(op);  // pending without an engine: NotInitialized
  if (op.status == detail::Operation::Status::Failed) std::rethrow_exception(op.error);
}

bool Work::wait(std::chrono::milliseconds timeout) {
  detail::Operation& op = checked(op_, "wait");
  if (auto engine = op.engine.lock()) {
    // The time spent waiting to enter counts against the caller's limit.
    const auto start = engine::Clock::now();
    const auto entry = engine->try_enter("Work::wait", timeout);
    if (!entry) return false;  // another thread held the engine all that time: still pending
    const auto left = std::max(std::chrono::milliseconds::zero(),
                               timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                                             engine::Clock::now() - start));
    return engine->wait(op, left);
  }
  if (op.status == detail::Operation::Status::Done) return true;
  engine_of(op);
  if (op.status == detail::Operation::Status::Failed) std::rethrow_exception(op.error);
  return true;
}

bool Work::is_completed() {
  detail::Operation& op = checked(op_, "is_completed");
  if (auto engine = op.engine.lock()) {
    const auto entry = engine->enter("Work::is_completed");
    return engine->test(op);
  }
  return !op.pending();
}

int Work::source_rank() const {
  const detail::Operation& op = checked(op_, "source_rank");
  if (op.kind != detail::Operation::Kind::Recv)
    throw InvalidArgument("Work::source_rank: this Work is a send; only receives have a source");
  if (op.status == detail::Operation::Status::Failed) std::rethrow_exception(op.error);
  if (op.pending())
    throw InvalidArgument(
        "Work::source_rank: the receive has not completed yet; call wait() first");
  return op.source;
}

bool Work::is_send() const {
  return checked(op_, "is_send").kind == detail::Operation::Kind::Send;
}

P2POp P2PSend(const Tensor& t, int peer, const Group& group, int tag) {
  return P2POp{P2POp::Kind::Send, t, peer, group, tag};
}

P2POp P2PRecv(Tensor& t, int peer, const Group& group, int tag) {
  return P2POp{P2POp::Kind::Recv, t, peer, group, tag};
}

}  // namespace shmdist
