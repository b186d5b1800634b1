// The seam between "how bytes move" (a Transport) and "what a message means" (the engine's
// matching and progress). A transport moves whole messages as ordered byte streams per peer:
// it tells the engine when a message from a source begins, asks it where the bytes go, and
// fills that memory; on the way out it streams a message's bytes as space allows. That is
// all it does: sleeping is the Waker's (waker.hpp), peers' health and this rank's hang state
// are the Peers' (peers.hpp); link.hpp bundles the three for the engine. The shared-memory
// rings are one implementation (ShmTransport), the MPI transport and the routing transport
// (which picks one of them per peer) others; tests/transport/test_contract.cpp is the
// contract every implementation passes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "transport/envelope.hpp"

namespace shmdist::transport {

// Takes a message's bytes as they arrive instead of having them kept (a receive that reduces
// them into memory of its own, lib/coll/): consume() gets every byte of the message once, in
// order, `at` being the offset of `bytes` in the message. The bytes are valid only during the
// call; they may be a peer's shared memory, so a consumer reads each byte once and trusts
// nothing in them but their count.
class ByteConsumer {
 public:
  virtual ~ByteConsumer() = default;
  virtual void consume(std::uint64_t at, std::span<const std::byte> bytes) = 0;
};

// Where an incoming message's bytes go. Owned by the engine; the transport writes
// bytes at dest + received and advances `received`. The engine may repoint `dest`
// (copying what arrived so far) while a message streams in.
// With a `consumer`, the bytes go to it instead: a transport that holds them in memory of its
// own (the shared-memory rings) hands them over from there, and one that receives into memory
// (MPI, a single-copy read) writes them at dest + received first and hands over those
// (landed()); `dest` stays valid for that.
struct InboundSink {
  std::byte* dest = nullptr;
  std::uint64_t received = 0;
  ByteConsumer* consumer = nullptr;
  // `n` bytes were written at dest + received: counts them and hands them to the consumer.
  void landed(std::uint64_t n) {
    if (consumer && n) consumer->consume(received, {dest + received, static_cast<std::size_t>(n)});
    received += n;
  }
};

class InboundHandler {
 public:
  virtual ~InboundHandler() = default;
  // A message from env.src begins; return where its env.nbytes bytes go.
  virtual InboundSink* on_message_start(const Envelope& env) = 0;
  // All its bytes have arrived.
  virtual void on_message_complete(InboundSink* sink, const Envelope& env) = 0;
};

// A message on its way out. The transport advances `next` and `sent` and sets `started`.
struct OutboundMessage {
  Envelope env;
  const std::byte* next = nullptr;  // the first byte not yet sent
  std::uint64_t sent = 0;
  bool started = false;
  std::uint64_t offer = 0;  // a single-copy offer the receiver may still read `next` for
  // Set (with the message done) when the send failed on the receiver's side: why, owned by
  // the transport and valid while it lives. The engine fails this send alone with it.
  const std::string* failure = nullptr;
  bool done() const { return started && sent == env.nbytes; }
};

// A receive that knows exactly what it wants (the direct path): every field of `env` but the
// source must match, and the bytes go to `dest`.
struct Expectation {
  Envelope env;
  std::byte* dest = nullptr;
};

enum class DirectResult {
  Received,  // the next message from the source was exactly the expected one: it is in dest
  Empty,     // nothing from the source yet
  Other,     // something else is next (another key, a large message): use poll()
};

// Every method is on the fast path (called per message or per progress step); keep it free
// of anything else (a slow-path concern belongs to the Waker or the Peers).
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // Moves incoming bytes. `preferred` (a rank or -1) is looked at first; `full_scan` looks at
  // every source, not only those with a ready hint. Returns true if anything moved.
  virtual bool poll(InboundHandler& handler, int preferred, bool full_scan) = 0;
  // Takes the next message from `src` straight into want.dest if it is whole (one record) and
  // matches `want` in every field; the engine uses it only when no other receive is posted
  // and nothing from `src` is queued as unexpected, so this cannot take a message out of
  // turn. It must touch only `src`'s inbound state: messages of other sources may be
  // mid-stream meanwhile.
  virtual DirectResult receive_direct(int src, const Expectation& want) = 0;
  // The same for an any-source receive (used only when nothing at all is queued as
  // unexpected): looks at the sources that may hold records, starting where the last scan
  // stopped (fairness). Returns the source it received from, or -1 with `result` saying Empty
  // (nothing anywhere) or Other (use poll()).
  virtual int receive_direct_any(const Expectation& want, DirectResult& result) = 0;
  // Streams as much of `msg` to `dst` as the ring takes now. Returns true if anything moved.
  virtual bool send_some(int dst, OutboundMessage& msg) = 0;
  // The memory `msg` reads from is about to go away although `msg` is not done (its send
  // gave up): afterwards the transport refers to it only through msg.next and msg.sent (a
  // single-copy offer is revoked, or waited for, for a bounded time, while the receiver is
  // reading it). Never waits forever.
  virtual void release_outbound(int dst, OutboundMessage& msg) {
    (void)dst;
    (void)msg;
  }
  // The engine is about to move the message arriving from `src` to other memory: it will
  // copy the sink's `received` bytes and repoint sink.dest. Returns true if the transport
  // writes nothing more at the old dest from now on (it goes on at the new dest + received);
  // false if bytes are on their way there that it cannot stop (MPI matched a payload's
  // receive to them): the old dest stays in use, untouched by the engine, until a later call
  // returns true or the message completes. A transport that writes only inside poll() (the
  // rings) always returns true. Never waits.
  virtual bool release_inbound(int src) {
    (void)src;
    return true;
  }
  // The engine gives up the message arriving from `src` (it ends, or a receive's wait for
  // release_inbound ran out): the transport forgets the message, and the stream from `src` is
  // broken from then on if it was mid-message. `memory` owns what sink.dest points into (may
  // be null): a transport that might still write there (MPI, a matched piece) keeps it alive
  // for as long as it might, so that no write lands in freed memory. Never waits.
  virtual void abandon_inbound(int src, std::shared_ptr<void> memory) {
    (void)src;
    (void)memory;
  }
  // Makes consumed space visible to producers and wakes those waiting for it.
  virtual void flush() = 0;
  // Whether a message from `src` is partly received (its sender still owes bytes).
  virtual bool inbound_in_progress(int src) const = 0;
  // Whether the ring from `src` holds a record not yet consumed.
  virtual bool inbound_pending(int src) const = 0;
};

}  // namespace shmdist::transport
