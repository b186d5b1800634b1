// How single-copy offers end when the other side does not play along, in one process (ranks
// of one segment, not thread mode, so copies are real process_vm_readv calls): a revoke after
// a claim that never finishes returns (its deadline), a receiver whose copy was revoked
// discards it and takes the streamed bytes, a failed offer fails its own send and no other
// call (and every later send to that receiver), and memory only its owner may read
// (memfd_secret) is streamed instead. The engine-level cases run an Engine on rank 0's
// transport and play rank 1 by hand.
#include <boost/test/unit_test.hpp>

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include <shmdist/errors.hpp>
#include <shmdist/tensor.hpp>

#include "engine/engine.hpp"
#include "offer_support.hpp"
#include "support/recording_consumer.hpp"

using namespace shmdist;
using namespace shmdist::test::offers;
using namespace std::chrono_literals;

namespace {

// A generous bound for anything that must happen "soon" (the revoke's deadline is 200 ms
// plus 1 ns per byte); the unfixed code never returns at all.
constexpr auto kSoon = 10s;

// Rank 0 is an Engine over its ShmTransport; rank 1 is a bare transport the test drives.
struct EnginePair {
  explicit EnginePair(std::chrono::milliseconds timeout = 5s) {
    wait::SpinPolicy spin;
    spin.spin_alone = spin.spin_crowded = std::chrono::microseconds(1);
    spin.health_check = std::chrono::milliseconds(1);
    engine = std::make_shared<engine::Engine>(
        transport::make_shm_link(seg, 0, true, config::kDefaultHealthCheck, kThreshold), spin,
        timeout);
  }
  std::shared_ptr<segment::Segment> seg =
      std::make_shared<segment::Segment>(segment::Segment::create_anonymous(2, 64 * 1024));
  std::shared_ptr<engine::Engine> engine;
  transport::ShmTransport rank1{seg, 1, true, config::kDefaultHealthCheck, kThreshold};
  GuardedHandler handler;
  std::shared_ptr<detail::Operation> pump;
  const std::vector<int> all{0, 1};

  std::atomic<std::uint64_t>& state() { return seg->ring_control(0, 1).offer_state; }
  static engine::MatchKey key(int tag) { return {0, 0, tag, transport::kUserChannel}; }
  // Rank 1 sends one int64 with `tag` (it fits the ring: no progress needed).
  void rank1_sends(std::int64_t value, int tag) {
    transport::OutboundMessage msg;
    msg.env = {1, key(tag), kInt64, 1, sizeof value};
    msg.next = reinterpret_cast<const std::byte*>(&value);
    BOOST_REQUIRE(rank1.send_some(0, msg));
    BOOST_REQUIRE(msg.done());
  }
  // One round of progress on both ranks (rank 0 through a receive nobody sends to).
  void progress_both() {
    if (!pump)
      pump = engine->irecv(zeros(1, kUInt8), 1,
                           engine::MatchKey{0, 0, 1 << 20, transport::kInternalChannel}, all);
    engine->test(*pump);
    rank1.poll(handler, 0, true);
    rank1.flush();
  }
};

Tensor pattern_tensor(std::int64_t n) {
  Tensor t = empty({n}, kUInt8);
  const auto bytes = pattern(static_cast<std::size_t>(n));
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(single_copy_outcomes)

// A sink with a consumer gets an offered message's bytes once, in order: copied (landed in
// the sink's memory, then handed over), or, when the offer was revoked, from the records
// streamed instead.
BOOST_AUTO_TEST_CASE(a_consumer_gets_an_offers_bytes_once_copied_or_streamed) {
  for (const bool revoked : {false, true}) {
    BOOST_TEST_CONTEXT("revoked: " << revoked) {
      Pair p;
      test::RecordingConsumer recorder;
      p.handler.consumer = &recorder;
      const auto bytes = pattern(100000);
      auto msg = message_of(bytes, 0);
      p.sender.send_some(1, msg);
      BOOST_REQUIRE(p.state().load() == offer_word(1, OfferState::Offered));
      std::vector<std::byte> copy(bytes);  // what a revoked send streams from
      if (revoked) {
        p.state().store(offer_word(1, OfferState::Claimed));  // as if rank 1 were copying
        p.sender.release_outbound(1, msg);  // returns at its deadline, having revoked
        msg.next = copy.data();
      }
      for (int i = 0; i < 16 && p.handler.completed.empty(); ++i) {
        if (!msg.done()) p.sender.send_some(1, msg);
        p.drain();
      }
      BOOST_REQUIRE(p.handler.completed.size() == 1u);
      BOOST_TEST(recorder.in_order);
      BOOST_TEST((recorder.bytes == bytes));
    }
  }
}

// F1: a peer that wrote Claimed (a receiver stopped mid-copy, or a hostile one) and never
// finishes: release_outbound returns by its deadline, having revoked the offer; the receiver,
// when it looks, acknowledges and takes the bytes streamed from a private copy.
BOOST_AUTO_TEST_CASE(a_revoke_after_a_claim_that_never_finishes_returns) {
  Pair p;
  const auto bytes = pattern(100000);
  auto msg = message_of(bytes, 0);
  p.sender.send_some(1, msg);
  BOOST_REQUIRE(p.state().load() == offer_word(1, OfferState::Offered));
  p.state().store(offer_word(1, OfferState::Claimed));  // rank 1 stays Running
  auto revoking = std::async(std::launch::async, [&] { p.sender.release_outbound(1, msg); });
  const bool returned = revoking.wait_for(kSoon) == std::future_status::ready;
  if (!returned) p.state().store(offer_word(1, OfferState::Done));  // frees the thread
  revoking.get();
  BOOST_REQUIRE(returned);
  BOOST_TEST(p.state().load() == offer_word(1, OfferState::Revoked));
  BOOST_TEST(msg.offer == 0u);
  BOOST_TEST(!msg.done());
  BOOST_TEST(msg.failure == nullptr);
  const std::vector<std::byte> copy(bytes);  // what the engine streams from
  msg.next = copy.data();
  for (int i = 0; i < 16 && !msg.done(); ++i) {
    p.sender.send_some(1, msg);
    p.drain();
  }
  BOOST_TEST(msg.done());
  BOOST_REQUIRE(p.handler.completed.size() == 1u);
  BOOST_TEST(std::memcmp(p.handler.buffers[0]->data(), bytes.data(), bytes.size()) == 0);
  BOOST_TEST(p.state().load() == offer_word(1, OfferState::Streaming));
}

// F1, the receiver's half: its final CAS from Claimed(id) races the sender's deadline revoke.
// Sender first: the receiver discards its copy (Stream) and acknowledges. Receiver first: the
// revoke finds Done and the send is complete.
BOOST_AUTO_TEST_CASE(the_final_cas_and_the_deadline_revoke_exclude_each_other) {
  const auto source = pattern(8192);
  const OfferDescriptor d{7, reinterpret_cast<std::uintptr_t>(source.data()), source.size(),
                          getpid(), 0};
  transport::SingleCopy sender(kThreshold, false, 2);
  for (const bool sender_first : {true, false}) {
    BOOST_TEST_CONTEXT("sender first: " << sender_first) {
      std::atomic<std::uint64_t> state{offer_word(7, OfferState::Offered)};
      auto msg = message_of(source, 0);
      msg.started = true;
      msg.offer = 7;
      BOOST_REQUIRE(transport::SingleCopy::claim(0, state, d));
      BOOST_TEST(!sender.revoke(1, state, msg));  // claimed: wait or revoke at the deadline
      std::vector<std::byte> dest(source.size());
      BOOST_TEST(transport::SingleCopy(kThreshold, false, 2).copy(d, dest.data()) == 0);
      if (sender_first) {
        sender.force_revoke(1, state, msg);
        BOOST_TEST(state.load() == offer_word(7, OfferState::Revoked));
        BOOST_TEST((transport::SingleCopy::finish(0, state, d, 0, true) ==
                    transport::SingleCopy::Claim::Stream));
        BOOST_TEST(state.load() == offer_word(7, OfferState::Streaming));
        BOOST_TEST(!msg.done());  // to be streamed
      } else {
        BOOST_TEST((transport::SingleCopy::finish(0, state, d, 0, true) ==
                    transport::SingleCopy::Claim::Copied));
        sender.force_revoke(1, state, msg);
        BOOST_TEST(state.load() == offer_word(7, OfferState::Done));
        BOOST_TEST(msg.done());
      }
      BOOST_TEST(msg.offer == 0u);
    }
  }
}

// F1 through the engine: a blocking send (timeout 500 ms) to a receiver that claims the offer
// and then does nothing for 5 s throws Timeout long before the 5 s are over, and the message
// still arrives whole once the receiver looks (streamed from a private copy).
BOOST_AUTO_TEST_CASE(a_send_to_a_stalled_claimer_times_out_and_still_arrives) {
  EnginePair e(500ms);
  constexpr std::int64_t kBytes = 4 << 20;
  Tensor big = pattern_tensor(kBytes);
  const auto expected = pattern(kBytes);
  std::promise<void> send_returned;
  bool returned_in_time = false;
  std::thread stalled_receiver([&, returned = send_returned.get_future()] {
    const auto give_up = std::chrono::steady_clock::now() + kSoon;
    while (e.state().load() != offer_word(1, OfferState::Offered) &&
           std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(1ms);
    e.state().store(offer_word(1, OfferState::Claimed));
    returned_in_time = returned.wait_for(5s) == std::future_status::ready;
    if (!returned_in_time) e.state().store(offer_word(1, OfferState::Done));  // frees rank 0
  });
  bool timed_out = false;
  try {
    e.engine->send(big, 1, EnginePair::key(3));
  } catch (const Timeout& t) {
    timed_out = true;
    BOOST_TEST_MESSAGE("send: " << t.what());
  }
  send_returned.set_value();
  stalled_receiver.join();
  BOOST_TEST(timed_out);
  BOOST_TEST(returned_in_time);
  std::memset(big.data_ptr(), 0, kBytes);  // the caller owns its tensor again
  const auto give_up = std::chrono::steady_clock::now() + kSoon;
  while (e.handler.completed.empty() && std::chrono::steady_clock::now() < give_up)
    e.progress_both();
  BOOST_REQUIRE(e.handler.completed.size() == 1u);
  BOOST_TEST(std::memcmp(e.handler.buffers[0]->data(), expected.data(), kBytes) == 0);
  BOOST_TEST(e.handler.guards_intact());
}

// F2: rank 0 isends 4 MiB (offered) and waits for a small message from rank 1; rank 1 marks
// the offer failed and sends the small one. The unrelated receive succeeds; the isend's Work
// fails with PeerFailure.
BOOST_AUTO_TEST_CASE(a_failed_offer_fails_its_own_send_and_no_other_call) {
  EnginePair e;
  Tensor big = pattern_tensor(4 << 20);
  auto w = e.engine->isend(big, 1, EnginePair::key(1));
  BOOST_REQUIRE(e.state().load() == offer_word(1, OfferState::Offered));
  Tensor small = zeros(1, kInt64);
  auto r = e.engine->irecv(small, 1, EnginePair::key(9), e.all);
  e.state().store(offer_word(1, OfferState::Failed));
  e.rank1_sends(42, 9);
  BOOST_CHECK_NO_THROW(e.engine->wait(*r, std::nullopt));
  BOOST_TEST(small.data<std::int64_t>()[0] == 42);
  peer_failure_says([&] { e.engine->wait(*w, std::nullopt); }, "rank 1 could not read the 4194304 bytes");
}

// F8: after a failed offer, rank 1 reads nothing more from rank 0 (its receive failed), so
// every later send to it fails at once with PeerFailure (no new offer is posted), instead of
// a Timeout or a silent loss.
BOOST_AUTO_TEST_CASE(a_failed_offer_fails_every_later_send_to_that_receiver) {
  EnginePair e;
  Tensor big = pattern_tensor(4 << 20);
  auto w = e.engine->isend(big, 1, EnginePair::key(1));
  e.state().store(offer_word(1, OfferState::Failed));
  peer_failure_says([&] { e.engine->wait(*w, 2s); }, "could not read");
  auto w2 = e.engine->isend(big, 1, EnginePair::key(2));
  peer_failure_says([&] { BOOST_TEST(e.engine->wait(*w2, kSoon)); }, "takes nothing more");
  Tensor small = pattern_tensor(16);
  peer_failure_says([&] { e.engine->send(small, 1, EnginePair::key(3)); }, "takes nothing more");
  BOOST_TEST(e.state().load() == offer_word(1, OfferState::Failed));
}

// F3: memfd_secret memory is readable by its owner only; process_vm_readv gets EFAULT. The
// sender is alive, so the offer is answered Streaming and the message arrives whole.
BOOST_AUTO_TEST_CASE(memory_only_the_sender_can_read_is_streamed) {
#ifdef SYS_memfd_secret
  const int fd = static_cast<int>(syscall(SYS_memfd_secret, 0));
  if (fd < 0 && (errno == ENOSYS || errno == EPERM || errno == EINVAL)) {
    BOOST_TEST_MESSAGE("memfd_secret unavailable here (" << std::strerror(errno)
                                                         << "): case skipped");
    return;
  }
  BOOST_REQUIRE(fd >= 0);
  constexpr std::size_t kBytes = 128 * 1024;  // twice the ring: offered
  BOOST_REQUIRE(ftruncate(fd, kBytes) == 0);
  void* mem = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (mem == MAP_FAILED) {
    BOOST_TEST_MESSAGE("cannot map memfd_secret memory (" << std::strerror(errno)
                                                          << ", RLIMIT_MEMLOCK?): case skipped");
    return;
  }
  const auto bytes = pattern(kBytes);
  std::memcpy(mem, bytes.data(), kBytes);
  Pair p;
  transport::OutboundMessage msg;
  msg.env = {0, {}, kUInt8, kBytes, kBytes};
  msg.next = static_cast<const std::byte*>(mem);
  p.sender.send_some(1, msg);
  BOOST_TEST(p.state().load() == offer_word(1, OfferState::Offered));
  for (int i = 0; i < 64 && !msg.done(); ++i) {
    p.drain();
    p.sender.send_some(1, msg);
  }
  p.drain();
  BOOST_TEST(msg.done());
  BOOST_TEST(msg.failure == nullptr);
  BOOST_TEST(p.state().load() == offer_word(1, OfferState::Streaming));
  BOOST_REQUIRE(p.handler.completed.size() == 1u);
  BOOST_TEST(std::memcmp(p.handler.buffers[0]->data(), bytes.data(), kBytes) == 0);
  BOOST_TEST(p.handler.guards_intact());
  // Not sticky: the next message from readable memory is offered again.
  auto next = message_of(bytes, 0);
  p.sender.send_some(1, next);
  BOOST_TEST(p.state().load() == offer_word(2, OfferState::Offered));
  munmap(mem, kBytes);
#else
  BOOST_TEST_MESSAGE("no SYS_memfd_secret in these headers: case skipped");
#endif
}

// F5: where Yama's ptrace_scope is 1 a rank names its parent (the launcher, whose descendants
// are the peers) as its tracer, never any process; with no launcher parent, or scopes 2-3,
// it does not offer.
BOOST_AUTO_TEST_CASE(the_ptracer_is_the_launcher_never_any_process) {
  using transport::SingleCopy;
  const auto none = SingleCopy::ptrace_policy(0, 1234);
  BOOST_TEST(none.offer);
  BOOST_TEST(none.tracer == 0);
  const auto parent = SingleCopy::ptrace_policy(1, 1234);
  BOOST_TEST(parent.offer);
  BOOST_TEST(parent.tracer == 1234);
  BOOST_TEST(!SingleCopy::ptrace_policy(1, 1).offer);  // reparented to init: no launcher
  BOOST_TEST(!SingleCopy::ptrace_policy(2, 1234).offer);
  BOOST_TEST(!SingleCopy::ptrace_policy(3, 1234).offer);
}

BOOST_AUTO_TEST_SUITE_END()
