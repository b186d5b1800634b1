// An in-memory link (transport/link.hpp) for driving the engine in one process,
// deterministically: the test decides what arrives from whom, how many bytes of it have
// arrived so far, how much a destination takes (FakeTransport), and how every peer stands
// (FakePeers). FakeTransport is also the smallest complete implementation of
// transport/transport.hpp, the model for the next transports (tests/transport/
// test_contract.cpp runs it through the contract every transport passes).
//
// The link is owned by the engine (fake_link); the test keeps the FakeWire it talks through.
#pragma once

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <shmdist/errors.hpp>

#include "transport/link.hpp"

namespace shmdist::test {

struct FakeWire {
  struct Inbound {
    transport::Envelope env;
    std::vector<std::byte> bytes;
    std::uint64_t delivered = 0;
    bool started = false;
    transport::InboundSink* sink = nullptr;
  };
  struct Outbound {
    transport::Envelope env;
    std::vector<std::byte> bytes;  // what has left so far
  };

  explicit FakeWire(int own_rank, int world_size)
      : rank(own_rank), world(world_size), inbound(world_size), arrived(world_size),
        finished_bytes(world_size),
        outbound(world_size), room(world_size, ~std::uint64_t{0}), peers(world_size) {}

  // The peer `src` sends a message of `env` (its src and nbytes are set here) carrying
  // `bytes`. Everything it sent before has arrived whole; of this one, `allow` bytes have.
  void arrive(int src, transport::Envelope env, std::vector<std::byte> bytes,
              std::uint64_t allow = ~std::uint64_t{0}) {
    const std::uint64_t before = stream_end(src);
    env.src = src;
    env.nbytes = bytes.size();
    inbound[src].push_back({env, std::move(bytes), 0, false, nullptr});
    arrived[src] = before + std::min<std::uint64_t>(allow, env.nbytes);
  }
  // `n` more bytes from `src` arrive (in stream order, across its messages).
  void allow(int src, std::uint64_t n) { arrived[src] = std::min(arrived[src] + n, stream_end(src)); }
  void allow_all(int src) { arrived[src] = stream_end(src); }

  // Stream positions from `src`: every byte it sent, and every byte the engine took.
  std::uint64_t stream_end(int src) const {
    std::uint64_t n = finished_bytes[src];
    for (const Inbound& m : inbound[src]) n += m.bytes.size();
    return n;
  }
  std::uint64_t consumed_of(int src) const {
    std::uint64_t n = finished_bytes[src];
    for (const Inbound& m : inbound[src]) n += m.delivered;
    return n;
  }

  int rank;
  int world;
  std::vector<std::deque<Inbound>> inbound;  // by source, in stream order
  std::vector<std::uint64_t> arrived;        // by source: stream bytes that have arrived
  std::vector<std::uint64_t> finished_bytes;  // by source: bytes of messages completed
  std::vector<std::vector<Outbound>> outbound;  // by destination, in stream order
  std::vector<std::uint64_t> room;              // by destination: bytes it takes from now on
  std::vector<transport::PeerState> peers;
  bool job_aborted = false;
  std::string job_failure = "the job was aborted";
  std::vector<int> reported_failures;
  std::vector<transport::BlockedInfo> blocked;  // every set_blocked, in order
  int blocked_now = 0;                          // set_blocked minus clear_blocked
  // Called at every peer_state(peer) before it answers: lets a test change what a peer did
  // at the very moment the engine reads its state (an interleaving of two processes).
  std::function<void(int peer)> on_peer_state;
  bool finalized = false;
  int polls = 0;
  int sleeps = 0;  // calls of sleep(): the engine's waiting loop went to phase 2
  // Whether receive_direct takes a whole arrived message that is exactly the one expected
  // (as the shared-memory transport does); otherwise it declines every time.
  bool direct = false;
  int direct_receives = 0;  // messages taken by receive_direct
  // A receive with a consumer gets its bytes landed in its tensor first (as MPI does), not
  // handed over from the wire's own memory (as the rings do).
  bool land_first = false;

  // As MPI once it matched a payload's piece: the bytes of the message now arriving from
  // `src` go on landing where its sink points now, and release_inbound(src) says it cannot
  // stop them until unpin(src). Polls check that the engine leaves the sink's dest alone.
  void pin(int src) { pinned_dest[src] = inbound[src].front().sink->dest; }
  void unpin(int src) { pinned_dest[src] = nullptr; }
  std::vector<std::byte*> pinned_dest = std::vector<std::byte*>(static_cast<std::size_t>(world));
  bool repointed_while_pinned = false;
  // Called at every release_inbound(src) before it answers (the moment MPI would look at the
  // pinned piece): lets a test unpin it, as MPI completing the piece would.
  std::function<void(int src)> on_release;
  std::vector<int> abandoned;  // abandon_inbound's sources, in order
  std::vector<std::shared_ptr<void>> kept;  // ... and the memory each gave (kept alive)
};

class FakeTransport final : public transport::Transport {
 public:
  explicit FakeTransport(std::shared_ptr<FakeWire> wire) : w_(std::move(wire)) {}

  int rank() const override { return w_->rank; }
  int world_size() const override { return w_->world; }

  bool poll(transport::InboundHandler& handler, int, bool) override {
    ++w_->polls;
    bool moved = false;
    for (int src = 0; src < w_->world; ++src) moved |= poll_source(handler, src);
    return moved;
  }

  // The direct path is an optimisation a transport may decline: "Other" sends the engine
  // to poll(), which every case here goes through unless the test sets wire.direct.
  transport::DirectResult receive_direct(int src, const transport::Expectation& want) override {
    if (!w_->direct) return transport::DirectResult::Other;
    auto& q = w_->inbound[src];
    if (q.empty() || w_->arrived[src] < w_->finished_bytes[src] + q.front().bytes.size())
      return q.empty() ? transport::DirectResult::Empty : transport::DirectResult::Other;
    FakeWire::Inbound& m = q.front();
    const transport::Envelope& e = want.env;
    if (m.started || !(m.env.key == e.key) || m.env.dtype != e.dtype || m.env.numel != e.numel ||
        m.env.nbytes != e.nbytes)
      return transport::DirectResult::Other;
    if (!m.bytes.empty()) std::memcpy(want.dest, m.bytes.data(), m.bytes.size());
    w_->finished_bytes[src] += m.bytes.size();
    q.pop_front();
    ++w_->direct_receives;
    return transport::DirectResult::Received;
  }
  int receive_direct_any(const transport::Expectation&, transport::DirectResult& result) override {
    result = transport::DirectResult::Other;
    return -1;
  }

  bool send_some(int dst, transport::OutboundMessage& msg) override {
    auto& out = w_->outbound[dst];
    bool moved = false;
    if (!msg.started) {
      if (w_->room[dst] == 0 && msg.env.nbytes != 0) return false;
      out.push_back({msg.env, {}});
      msg.started = moved = true;
    }
    const std::uint64_t n = std::min(msg.env.nbytes - msg.sent, w_->room[dst]);
    out.back().bytes.insert(out.back().bytes.end(), msg.next, msg.next + n);
    msg.next += n;
    msg.sent += n;
    w_->room[dst] -= n;
    return moved || n > 0;  // true only if something moved: the engine spins while it does
  }
  void flush() override {}
  bool release_inbound(int src) override {
    if (w_->on_release) w_->on_release(src);
    return w_->pinned_dest[src] == nullptr;
  }
  void abandon_inbound(int src, std::shared_ptr<void> memory) override {
    w_->abandoned.push_back(src);
    w_->kept.push_back(std::move(memory));
  }

  bool inbound_in_progress(int src) const override {
    return !w_->inbound[src].empty() && w_->inbound[src].front().started;
  }
  bool inbound_pending(int src) const override {
    return w_->arrived[src] > w_->consumed_of(src);
  }

 private:
  // Delivers what has arrived from `src`: starts messages, fills their sinks (re-reading
  // sink->dest every time: the engine may repoint it), completes them.
  bool poll_source(transport::InboundHandler& handler, int src) {
    bool moved = false;
    auto& queue = w_->inbound[src];
    while (!queue.empty()) {
      FakeWire::Inbound& m = queue.front();
      const std::uint64_t available = w_->arrived[src] - w_->consumed_of(src);
      if (!m.started) {
        if (available == 0 && !m.bytes.empty()) break;
        m.sink = handler.on_message_start(m.env);
        m.started = true;
        moved = true;
      }
      const std::uint64_t n = std::min(available, m.bytes.size() - m.delivered);
      if (w_->pinned_dest[src] && m.sink->dest != w_->pinned_dest[src])
        w_->repointed_while_pinned = true;
      if (n) {
        transport::InboundSink& sink = *m.sink;
        if (sink.consumer && !w_->land_first) {
          // As the rings do: straight from the transport's own memory, here in pieces of
          // at most 5 bytes (so that elements split between calls).
          for (std::uint64_t done = 0; done < n;) {
            const std::size_t piece = static_cast<std::size_t>(std::min<std::uint64_t>(5, n - done));
            sink.consumer->consume(sink.received, {m.bytes.data() + m.delivered + done, piece});
            sink.received += piece;
            done += piece;
          }
        } else {  // as MPI does: into dest, then to the consumer if there is one
          std::memcpy(sink.dest + sink.received, m.bytes.data() + m.delivered, n);
          sink.landed(n);
        }
        m.delivered += n;
        moved = true;
      }
      if (m.delivered < m.bytes.size()) break;
      const transport::Envelope env = m.env;
      transport::InboundSink* sink = m.sink;
      w_->finished_bytes[src] += m.bytes.size();
      queue.pop_front();
      handler.on_message_complete(sink, env);
      moved = true;
    }
    return moved;
  }

  std::shared_ptr<FakeWire> w_;
};

class FakeWaker final : public transport::Waker {
 public:
  explicit FakeWaker(std::shared_ptr<FakeWire> wire) : w_(std::move(wire)) {}
  int awake_ranks() const override { return 1; }
  std::uint32_t arm() override { return 0; }
  void sleep(std::uint32_t, std::chrono::nanoseconds) override { ++w_->sleeps; }
  void disarm() override {}

 private:
  std::shared_ptr<FakeWire> w_;
};

class FakePeers final : public transport::Peers {
 public:
  explicit FakePeers(std::shared_ptr<FakeWire> wire) : w_(std::move(wire)) {}
  transport::PeerState peer_state(int peer) override {
    if (w_->on_peer_state) w_->on_peer_state(peer);
    return w_->peers[peer];
  }
  void check_job() override {
    if (w_->job_aborted) throw PeerFailure(w_->job_failure);
  }
  void report_failure(int peer) override {
    w_->reported_failures.push_back(peer);
    w_->job_aborted = true;
    w_->job_failure = "peer failure: " + w_->peers[peer].how;
  }

  void set_blocked(const transport::BlockedInfo& info) override {
    w_->blocked.push_back(info);
    ++w_->blocked_now;
  }
  void clear_blocked() override { --w_->blocked_now; }
  void mark_finalized() override { w_->finalized = true; }

 private:
  std::shared_ptr<FakeWire> w_;
};

// The three over one wire, for an engine.
inline transport::Link fake_link(const std::shared_ptr<FakeWire>& wire) {
  return {std::make_shared<FakePeers>(wire), std::make_shared<FakeWaker>(wire),
          std::make_unique<FakeTransport>(wire)};
}

}  // namespace shmdist::test
