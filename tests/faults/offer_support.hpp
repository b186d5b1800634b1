// What the single-copy offer tests share (test_hostile_offers.cpp, test_offer_outcomes.cpp):
// guarded receive buffers, patterns, and two ranks of one segment in this process.
#pragma once

#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <shmdist/errors.hpp>

#include "base/config.hpp"
#include "ring/ring.hpp"
#include "segment/segment.hpp"
#include "transport/frame.hpp"
#include "transport/shm_transport.hpp"
#include "transport/single_copy.hpp"

namespace shmdist::test::offers {

using transport::Envelope;
using transport::MessageHeader;
using transport::OfferDescriptor;
using transport::OfferState;
using transport::offer_word;


inline constexpr std::uint64_t kThreshold = 4096;

inline bool peer_failure_says(const std::function<void()>& f, const std::string& words) {
  try {
    f();
  } catch (const PeerFailure& e) {
    BOOST_TEST_INFO("message: " << e.what());
    BOOST_TEST(std::string(e.what()).find(words) != std::string::npos);
    return true;
  }
  BOOST_ERROR("no PeerFailure (expected one saying '" << words << "')");
  return false;
}

// Buffers with a guard zone behind them: nothing may be written past a message's size.
struct GuardedHandler : transport::InboundHandler {
  static constexpr std::size_t kGuard = 256;
  std::vector<std::unique_ptr<std::vector<std::byte>>> buffers;
  std::vector<transport::InboundSink> sinks;
  std::vector<Envelope> started, completed;
  transport::ByteConsumer* consumer = nullptr;  // set on every sink, when set
  GuardedHandler() { sinks.reserve(64); }
  transport::InboundSink* on_message_start(const Envelope& env) override {
    buffers.push_back(
        std::make_unique<std::vector<std::byte>>(env.nbytes + kGuard, std::byte{0xA5}));
    sinks.push_back({buffers.back()->data(), 0, consumer});
    started.push_back(env);
    return &sinks.back();
  }
  void on_message_complete(transport::InboundSink*, const Envelope& env) override {
    completed.push_back(env);
  }
  bool guards_intact() const {
    for (std::size_t i = 0; i < buffers.size(); ++i)
      for (std::size_t b = started[i].nbytes; b < buffers[i]->size(); ++b)
        if ((*buffers[i])[b] != std::byte{0xA5}) return false;
    return true;
  }
};

inline std::vector<std::byte> pattern(std::size_t n) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(i * 7 + i / 251);
  return v;
}

inline transport::OutboundMessage message_of(const std::vector<std::byte>& bytes, int src) {
  transport::OutboundMessage msg;
  msg.env = {src, {}, kUInt8, bytes.size(), bytes.size()};
  msg.next = bytes.data();
  return msg;
}

// Two ranks of one segment in this process (not thread mode: the copy is a real
// process_vm_readv of our own pid); rank 0 offers, rank 1 receives.
struct Pair {
  std::shared_ptr<segment::Segment> seg =
      std::make_shared<segment::Segment>(segment::Segment::create_anonymous(2, 64 * 1024));
  transport::ShmTransport sender{seg, 0, true, config::kDefaultHealthCheck, kThreshold};
  transport::ShmTransport receiver{seg, 1, true, config::kDefaultHealthCheck, kThreshold};
  GuardedHandler handler;
  std::atomic<std::uint64_t>& state() { return seg->ring_control(0, 1).offer_state; }
  std::uint64_t ring_tail() { return seg->ring_control(0, 1).tail.load(); }
  void drain() {
    for (int i = 0; i < 8; ++i) {
      receiver.poll(handler, 0, true);
      receiver.flush();
    }
  }
};

}  // namespace shmdist::test::offers
