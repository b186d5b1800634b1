// The Transport contract (tests/transport/test_contract.cpp) over the MPI transport, for the
// cases that make sense between processes: run under `mpiexec -n 3` (test_across_hosts.cpp
// starts it). Rank 0 receives, ranks 1 and 2 send. Left out: streaming through a ring and
// release_outbound (MPI takes a message whole; release_outbound is the default no-op), and
// the any-source fairness case, whose bound is in calls, not in time, and so depends on when
// MPI delivers. Each rank prints "FAIL rank R: ..." and aborts the job on a broken promise;
// rank 0 prints "OK" when all held. Every wait is bounded (kDeadline, and mpiexec --timeout).
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <cstddef>
#include <iostream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "transport/mpi_transport.hpp"
#include "support/recording_consumer.hpp"

using namespace shmdist;
using namespace shmdist::transport;

namespace {

constexpr std::chrono::seconds kDeadline{30};

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

std::vector<std::byte> pattern(std::size_t n, int seed) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((i * 7 + seed * 31) & 0xff);
  return b;
}

Envelope envelope(int src, int tag, std::size_t nbytes) {
  Envelope e;
  e.src = src;
  e.key.tag = tag;
  e.dtype = DType::UInt8;
  e.numel = nbytes;
  e.nbytes = nbytes;
  return e;
}

struct Got {
  Envelope env;
  std::vector<std::byte> bytes;
};

class Collector final : public InboundHandler {
 public:
  InboundSink* on_message_start(const Envelope& env) override {
    auto& slot = open_[env.src];
    check(!slot, "a message began before the last one from its source ended");
    slot = std::make_unique<Open>();
    slot->bytes.resize(env.nbytes);
    slot->sink.dest = slot->bytes.data();
    if (consume) slot->sink.consumer = &slot->recorder;
    return &slot->sink;
  }
  void on_message_complete(InboundSink* sink, const Envelope& env) override {
    auto& slot = open_[env.src];
    check(slot && sink == &slot->sink && sink->received == env.nbytes,
          "a message completed that was not started, or short");
    if (consume) {
      check(slot->recorder.in_order, "a consumer was handed bytes out of order");
      slot->bytes = std::move(slot->recorder.bytes);
    }
    got.push_back({env, std::move(slot->bytes)});
    slot.reset();
  }
  std::vector<Got> got;
  bool consume = false;  // hand the bytes to a consumer (InboundSink::consumer), not dest

 private:
  struct Open {
    InboundSink sink;
    std::vector<std::byte> bytes;
    test::RecordingConsumer recorder;
  };
  std::map<int, std::unique_ptr<Open>> open_;
};

template <class Done>
void until(Transport& t, Done&& done, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (!done()) {
    check(std::chrono::steady_clock::now() < deadline, "timed out: " + what);
    t.flush();
  }
}

void send_all(Transport& t, int dst, std::vector<std::vector<std::byte>>& payloads, int tag0) {
  for (std::size_t i = 0; i < payloads.size(); ++i) {
    OutboundMessage m;
    m.env = envelope(t.rank(), tag0 + static_cast<int>(i), payloads[i].size());
    m.next = payloads[i].data();
    until(t, [&] { return (t.send_some(dst, m), m.done()); }, "a send did not complete");
  }
}

void run(RemoteTransport& t, MpiSession& session) {
  const int me = t.rank();
  int phase = 0;
  auto barrier = [&] {
    if (std::getenv("CONTRACT_DEBUG"))  // names the phase a hang is in
      std::cerr << "rank " << me << " phase " << ++phase << std::endl;
    session.allgather("-");
  };
  Collector c;
  // Empty: nothing has been sent yet.
  for (int peer = 0; peer < 3; ++peer) {
    if (peer == me) continue;
    check(!t.inbound_pending(peer), "inbound_pending before anything was sent");
    check(!t.inbound_in_progress(peer), "inbound_in_progress before anything was sent");
    std::vector<std::byte> buf(8);
    check(t.receive_direct(peer, {envelope(-1, 0, 8), buf.data()}) == DirectResult::Empty,
          "receive_direct is not Empty before anything was sent");
  }
  check(!t.poll(c, -1, false) && !t.poll(c, -1, true), "a poll moved something from nothing");
  DirectResult result = DirectResult::Received;
  std::vector<std::byte> buf(8);
  check(t.receive_direct_any({envelope(-1, 0, 8), buf.data()}, result) == -1 &&
            result != DirectResult::Received,
        "receive_direct_any received from nothing");
  barrier();

  // Order per peer, with zero-byte messages and one past the packed limit.
  std::vector<std::vector<std::byte>> payloads;
  for (int i = 0; i < 40; ++i)
    payloads.push_back(pattern(i % 10 == 0 ? 0 : i == 25 ? 200 << 10 : (i * 97) % 1500, i));
  if (me == 1) send_all(t, 0, payloads, 0);
  if (me == 0) {
    until(t, [&] { return (t.poll(c, -1, false), c.got.size() == payloads.size()); },
          "40 messages from rank 1");
    for (std::size_t i = 0; i < payloads.size(); ++i)
      check(c.got[i].env.src == 1 && c.got[i].env.key.tag == static_cast<int>(i) &&
                c.got[i].bytes == payloads[i],
            "message " + std::to_string(i) + " from rank 1 arrived out of order or changed");
    c.got.clear();
  }
  barrier();

  // A sink with a consumer is handed every byte once, in order: packed messages, one past the
  // packed limit, zero bytes.
  if (me == 1) send_all(t, 0, payloads, 100);
  if (me == 0) {
    c.consume = true;
    until(t, [&] { return (t.poll(c, -1, false), c.got.size() == payloads.size()); },
          "40 messages from rank 1 to a consumer");
    for (std::size_t i = 0; i < payloads.size(); ++i)
      check(c.got[i].env.key.tag == 100 + static_cast<int>(i) && c.got[i].bytes == payloads[i],
            "message " + std::to_string(i) + " from rank 1 reached the consumer changed");
    c.got.clear();
    c.consume = false;
  }
  barrier();

  // receive_direct: the exact next message, Other for another key (which stays for poll),
  // Empty for a silent source, and a zero-byte message with no destination.
  std::vector<std::vector<std::byte>> two{pattern(100, 4), pattern(100, 5)};
  if (me == 1) send_all(t, 0, two, 5);  // tags 5, 6
  if (me == 0) {
    std::vector<std::byte> into(100);
    DirectResult r = DirectResult::Empty;
    until(t, [&] { return (r = t.receive_direct(1, {envelope(-1, 5, 100), into.data()})) !=
                          DirectResult::Empty; }, "rank 1's tag 5");
    check(r == DirectResult::Received && into == two[0], "the exact message was not taken");
    until(t, [&] { return (r = t.receive_direct(1, {envelope(-1, 9, 100), into.data()})) !=
                          DirectResult::Empty; }, "rank 1's tag 6");
    check(r == DirectResult::Other, "receive_direct took a message of another key");
    check(t.receive_direct(2, {envelope(-1, 6, 100), into.data()}) == DirectResult::Empty,
          "receive_direct from a silent source is not Empty");
    until(t, [&] { return (t.poll(c, -1, false), c.got.size() == 1); }, "tag 6 by poll");
    check(c.got[0].env.key.tag == 6 && c.got[0].bytes == two[1], "tag 6 changed");
  }
  barrier();
  std::vector<std::vector<std::byte>> none{{}};
  if (me == 1) send_all(t, 0, none, 7);  // tag 7, zero bytes
  if (me == 0) {
    DirectResult r = DirectResult::Empty;
    until(t, [&] { return (r = t.receive_direct(1, {envelope(-1, 7, 0), nullptr})) !=
                          DirectResult::Empty; }, "rank 1's zero-byte tag 7");
    check(r == DirectResult::Received, "a zero-byte message was not taken directly");
  }
  barrier();
  // Finalize as the engine does: say so, then wait until every peer did.
  t.send_finalized();
  until(t, [&] {
    t.poll(c, -1, true);
    for (int peer = 0; peer < 3; ++peer)
      if (peer != me && !t.peer_finalized(peer)) return false;
    return true;
  }, "every peer's finalize marker");
}

}  // namespace

int main() {
  int rank = -1;
  try {
    auto session = MpiSession::start();
    rank = session->rank();
    check(session->size() == 3, "run under mpiexec -n 3");
    std::vector<int> others;
    for (int r = 0; r < 3; ++r)
      if (r != rank) others.push_back(r);
    {
      auto t = make_mpi_transport(session, others);
      check(t->rank() == rank && t->world_size() == 3, "rank or world size is wrong");
      run(*t, *session);
    }
    session->allgather("-");
    if (rank == 0) std::cout << "OK" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "FAIL rank " << rank << ": " << e.what() << std::endl;
    MPI_Abort(MPI_COMM_WORLD, 1);  // the other ranks may wait for this one: end them now
    return 1;
  }
}
