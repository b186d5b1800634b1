// One point-to-point operation: what a Work refers to, and what blocking calls keep on their
// stack. Receives sit in the engine's posted list (in posting order) until a message is
// routed to them; sends sit in their destination's queue until all bytes are in the ring.
#pragma once

#include <boost/intrusive/list.hpp>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include <shmdist/tensor.hpp>

#include "transport/transport.hpp"

namespace shmdist::engine {
class Engine;
class BackgroundTask;

// What a receive matches on, besides the source (transport/envelope.hpp).
using transport::MatchKey;

using PostedHook = boost::intrusive::list_member_hook<>;
}  // namespace shmdist::engine

namespace shmdist::detail {

struct Operation {
  // Collective: the completion of a BackgroundTask (lib/coll/), which sets the status.
  enum class Kind : std::uint8_t { Send, Recv, Collective };
  enum class Status : std::uint8_t { Pending, Done, Failed };

  Kind kind = Kind::Send;
  Status status = Status::Pending;
  std::exception_ptr error;
  int source = -1;  // receive: the sender's global rank once done
  int peer = -1;    // send: destination; receive: wanted source or -1 (any)

  // The memory the operation reads or fills. Blocking calls borrow the caller's tensor (it
  // outlives the call); non-blocking ones hold its storage in `hold`, so that a Work keeps the
  // storage alive (the storage only: copying the Tensor would copy its shape vector, a
  // malloc and a free per message). A receive of any size allocates `keep` once it knows the
  // size.
  struct View {
    std::byte* data = nullptr;
    DType dtype = DType::UInt8;
    std::uint64_t numel = 0;
    std::uint64_t nbytes = 0;
  } view;
  Tensor keep;
  std::shared_ptr<void> hold;
  void set_view(const Tensor& t) {
    view.data = static_cast<std::byte*>(const_cast<void*>(t.data_ptr()));
    view.dtype = t.dtype();
    view.numel = static_cast<std::uint64_t>(t.numel());
    view.nbytes = t.nbytes();
  }
  std::weak_ptr<engine::Engine> engine;
  std::shared_ptr<Operation> keepalive;  // set while a non-blocking operation is pending
  std::weak_ptr<engine::BackgroundTask> task;  // Collective: the task that completes it

  // Receive side.
  engine::MatchKey key;
  // Any-source receive: who may send (the group's members), owned by the engine (its
  // interned lists); read only by the engine's waits, so only while the engine lives.
  const std::vector<int>* candidates = nullptr;
  bool any_size = false;            // receive a byte message of whatever size (recv_bytes)
  engine::PostedHook posted_hook;   // linked while posted and not yet routed
  std::unique_ptr<std::byte[]> staging;  // bytes of another dtype, converted at completion
  // Takes the message's bytes as they arrive (transport::ByteConsumer) instead of the tensor,
  // which then only holds bytes on their way to it: landed by a transport that must land them
  // somewhere first, or converted from another dtype by the engine. Only receives that are
  // never withdrawn have one (a schedule's: the bytes consumed could not be put back).
  std::shared_ptr<transport::ByteConsumer> consumer;

  // Send side.
  transport::OutboundMessage out;
  std::unique_ptr<std::byte[]> owned_copy;  // unsent remainder of a withdrawn blocking send

  bool pending() const { return status == Status::Pending; }
  void complete() { status = Status::Done; }
  void fail(std::exception_ptr e) {
    status = Status::Failed;
    error = std::move(e);
  }
};

}  // namespace shmdist::detail
