// RoutingTransport over two fake transports: how often it looks at the remote (MPI) side.
// Looking at MPI costs microseconds, so a rank talking to local peers must not do it on every
// progress call; yet the remote side must never be starved (any-source hears both).
#include <boost/test/unit_test.hpp>

#include <memory>
#include <vector>

#include "transport/routing_transport.hpp"

using namespace shmdist::transport;

namespace {

// A transport that counts polls and, while `busy`, delivers one message per poll.
template <class Base>
class Fake : public Base {
 public:
  Fake(int rank, int world) : rank_(rank), world_(world) {}
  int polls = 0;
  int direct_any = 0;
  int delivered = 0;
  int pending = 0;      // messages to deliver, one per poll
  bool busy = false;    // always one more message to deliver

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  bool poll(InboundHandler&, int, bool) override {
    ++polls;
    return take();
  }
  DirectResult receive_direct(int, const Expectation&) override { return DirectResult::Empty; }
  int receive_direct_any(const Expectation&, DirectResult& result) override {
    ++direct_any;
    result = take() ? DirectResult::Received : DirectResult::Empty;
    return result == DirectResult::Received ? source : -1;
  }
  bool send_some(int, OutboundMessage&) override { return false; }
  void flush() override {}
  bool inbound_in_progress(int) const override { return false; }
  bool inbound_pending(int) const override { return false; }
  int source = 0;

 private:
  bool take() {
    if (busy) return ++delivered, true;
    if (pending == 0) return false;
    --pending;
    ++delivered;
    return true;
  }
  int rank_;
  int world_;
};

class FakeRemote : public Fake<RemoteTransport> {
 public:
  using Fake::Fake;
  std::chrono::nanoseconds poll_interval() override { return std::chrono::microseconds(10); }
  bool transfers_in_flight() const override { return in_flight; }
  bool peer_finalized(int) const override { return false; }
  void send_finalized() override {}
  bool send_some(int, OutboundMessage& msg) override {
    msg.started = true;
    in_flight = true;
    return true;
  }
  bool in_flight = false;
};

class NullWaker : public Waker {
 public:
  int awake_ranks() const override { return 1; }
  std::uint32_t arm() override { return 0; }
  void sleep(std::uint32_t, std::chrono::nanoseconds) override {}
  void disarm() override {}
};

class NullPeers : public Peers {
 public:
  PeerState peer_state(int) override { return {}; }
  void check_job() override {}
  void report_failure(int) override {}
  void set_blocked(const BlockedInfo&) override {}
  void clear_blocked() override {}
  void mark_finalized() override {}
};

class NullHandler : public InboundHandler {
 public:
  InboundSink* on_message_start(const Envelope&) override { return &sink; }
  void on_message_complete(InboundSink*, const Envelope&) override {}
  InboundSink sink;
};

// Global rank 0 of 3: ranks 0 and 1 on this host (local ranks 0, 1), rank 2 on another.
struct Routed {
  Routed() {
    auto l = std::make_unique<Fake<Transport>>(0, 2);
    auto r = std::make_unique<FakeRemote>(0, 3);
    l->source = 1;  // local rank 1 = global rank 1
    r->source = 2;
    local = l.get();
    remote = r.get();
    link = make_routing_link(
        0, std::vector<int>{0, 1}, std::vector<std::string>{"a", "a", "b"},
        Link{std::make_shared<NullPeers>(), std::make_shared<NullWaker>(), std::move(l)},
        std::move(r));
    routing = link.bytes.get();
  }
  Fake<Transport>* local;
  FakeRemote* remote;
  Link link;
  Transport* routing;
  NullHandler handler;
};

constexpr int kCalls = 3200;

}  // namespace

BOOST_AUTO_TEST_CASE(an_idle_remote_side_is_looked_at_rarely_but_regularly) {
  Routed t;
  for (int i = 0; i < kCalls; ++i) t.routing->poll(t.handler, -1, false);
  BOOST_TEST(t.local->polls == kCalls);  // the local side: every call
  // Backed off to one look per 33 calls, plus the ramp (1, 2, 4, ... 32).
  BOOST_TEST(t.remote->polls <= kCalls / 33 + 8);
  BOOST_TEST(t.remote->polls >= kCalls / 33);
}

BOOST_AUTO_TEST_CASE(a_remote_side_that_delivers_is_looked_at_on_every_call) {
  Routed t;
  t.local->busy = true;
  t.remote->busy = true;
  for (int i = 0; i < kCalls; ++i) t.routing->poll(t.handler, -1, false);
  BOOST_TEST(t.remote->polls == kCalls);
  BOOST_TEST(t.local->polls == kCalls);
}

BOOST_AUTO_TEST_CASE(waiting_for_a_remote_peer_or_scanning_fully_looks_at_once) {
  Routed t;
  for (int i = 0; i < 100; ++i) t.routing->poll(t.handler, -1, false);  // backed off
  const int before = t.remote->polls;
  for (int i = 0; i < 10; ++i) t.routing->poll(t.handler, 2, false);    // prefers rank 2
  BOOST_TEST(t.remote->polls == before + 10);
  for (int i = 0; i < 10; ++i) t.routing->poll(t.handler, 1, true);     // full scans
  BOOST_TEST(t.remote->polls == before + 20);
  for (int i = 0; i < 100; ++i) t.routing->poll(t.handler, 1, false);   // backed off again
  const int slept = t.remote->polls;
  // A sleep as the engine makes it: arm, sleep, disarm (the reset happens in disarm, which
  // runs under the engine's lock; sleep runs without it, in several threads at once).
  const std::uint32_t token = t.link.waker->arm();
  t.link.waker->sleep(token, std::chrono::nanoseconds(0));
  t.link.waker->disarm();
  t.routing->poll(t.handler, -1, false);  // the first call after a sleep looks
  BOOST_TEST(t.remote->polls == slept + 1);
}

// Any-source fairness while the local side floods: a remote message that turns up after the
// remote side went quiet is heard within the back-off bound, by poll() and by the direct path.
BOOST_AUTO_TEST_CASE(a_flooding_local_side_never_starves_the_remote_one) {
  for (bool direct : {false, true}) {
    Routed t;
    t.local->busy = true;
    auto call = [&] {
      if (direct) {
        DirectResult result;
        t.routing->receive_direct_any(Expectation{}, result);
      } else {
        t.routing->poll(t.handler, -1, false);
      }
    };
    for (int i = 0; i < 1000; ++i) call();  // the remote side is quiet: fully backed off
    t.remote->pending = 1;
    int calls = 0;
    while (t.remote->delivered == 0 && calls < 1000) {
      call();
      ++calls;
    }
    BOOST_TEST_INFO("direct path: " << direct);
    BOOST_TEST(t.remote->delivered == 1);
    BOOST_TEST(calls <= 33);
  }
}

// A wait for a local peer (a named receive from a rank on this host) backs off much further
// while no remote send is in flight: a local ping-pong almost never enters MPI. It still
// looks now and then (a remote sender may need this rank's MPI progress to finish).
BOOST_AUTO_TEST_CASE(a_wait_for_a_local_peer_looks_at_mpi_rarely_but_still_looks) {
  Routed t;
  constexpr int kLong = 20000;
  for (int i = 0; i < kLong; ++i) t.routing->poll(t.handler, 1, false);
  BOOST_TEST(t.local->polls == kLong);
  // Ramp 1, 2, ..., 1024 (11 looks over 2047 calls), then one look per 1025 calls.
  BOOST_TEST(t.remote->polls <= 11 + kLong / 1025 + 1);
  BOOST_TEST(t.remote->polls >= kLong / 1025);
  // The same wait while a remote send is in flight keeps the ordinary bound (1 in 33).
  Routed u;
  u.remote->in_flight = true;
  for (int i = 0; i < kCalls; ++i) u.routing->poll(u.handler, 1, false);
  BOOST_TEST(u.remote->polls >= kCalls / 33);
}

// After a long wait for a local peer, an any-source call (poll or direct) still hears a remote
// message within the ordinary bound: the longer back-off does not carry over.
BOOST_AUTO_TEST_CASE(a_local_wait_does_not_delay_a_following_any_source_receive) {
  for (bool direct : {false, true}) {
    Routed t;
    t.local->busy = true;
    for (int i = 0; i < 5000; ++i) t.routing->poll(t.handler, 1, false);  // fully backed off
    t.remote->pending = 1;
    int calls = 0;
    while (t.remote->delivered == 0 && calls < 2000) {
      if (direct) {
        DirectResult result;
        t.routing->receive_direct_any(Expectation{}, result);
      } else {
        t.routing->poll(t.handler, -1, false);
      }
      ++calls;
    }
    BOOST_TEST_INFO("direct path: " << direct);
    BOOST_TEST(t.remote->delivered == 1);
    BOOST_TEST(calls <= 33);
  }
}

// Starting a send to a remote peer makes the next call look at MPI (a reply is likely), even
// in the middle of a back-off.
BOOST_AUTO_TEST_CASE(starting_a_remote_send_makes_the_next_call_look) {
  Routed t;
  for (int i = 0; i < 1000; ++i) t.routing->poll(t.handler, -1, false);  // backed off
  const int before = t.remote->polls;
  OutboundMessage msg;
  t.routing->send_some(2, msg);
  t.routing->poll(t.handler, -1, false);
  BOOST_TEST(t.remote->polls == before + 1);
}
