// Two threads bounce a message over one ring pair (0->1 and 1->0) of an anonymous segment,
// with the transport's record handling (check, decode, copy out, release, publish the tail)
// but none of the engine above it: the ring's own share of shmdist-bench latency.
// Time per iteration is the round trip; the one_way counter is half of it.
// BM_RingStream streams records one way, as a window of isends does, with or without the
// notification ShmTransport::notify_receiver does after every send (a seq_cst fence, then a
// look at the receiver's ready hint and doorbell): the fence's price for small messages.
// The two threads are pinned to the first two allowed CPUs (if there are two), as
// shmrun --bind-to core does.
#include <benchmark/benchmark.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <thread>

#include "ring_fixture.hpp"
#include "wait/doorbell.hpp"
#include "wait/spin.hpp"

namespace {

using shmdist::ring::RecordKind;
using shmdist::segment::Segment;

// Pins the calling thread to the `index`-th CPU it may run on; false if there is none.
bool pin_to_nth_allowed_cpu(int index) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return false;
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed) || seen++ != index) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    return pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0;
  }
  return false;
}

// Undoes the pinning of the benchmark's main thread when a benchmark ends.
class PinnedScope {
 public:
  PinnedScope() {
    CPU_ZERO(&saved_);
    saved_ok_ = pthread_getaffinity_np(pthread_self(), sizeof saved_, &saved_) == 0;
    pinned_ = saved_ok_ && CPU_COUNT(&saved_) >= 2 && pin_to_nth_allowed_cpu(0);
  }
  ~PinnedScope() {
    if (saved_ok_) pthread_setaffinity_np(pthread_self(), sizeof saved_, &saved_);
  }
  PinnedScope(const PinnedScope&) = delete;
  PinnedScope& operator=(const PinnedScope&) = delete;
  bool pinned() const { return pinned_; }

 private:
  cpu_set_t saved_;
  bool saved_ok_ = false;
  bool pinned_ = false;
};

void send_message(shmdist::ring::RingProducer& producer, const shmdist::transport::MessageHeader& h,
                  const std::vector<std::byte>& payload) {
  while (producer.writable(sizeof h + payload.size()) < sizeof h + payload.size())
    shmdist::wait::cpu_relax();
  producer.publish(RecordKind::Start, micro::bytes_of(h), payload);
}

void BM_RingPingPong(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Segment segment = Segment::create_anonymous(2, micro::kRingSize);
  micro::RingView to_echo(segment, 0, 1), from_echo(segment, 1, 0);
  const auto header = micro::header_for(n);
  std::atomic<bool> stop{false};
  // The echo thread is created before the main thread pins itself, so it may use any CPU
  // until it pins itself to the second one.
  std::thread echo([&] {
    pin_to_nth_allowed_cpu(1);
    std::vector<std::byte> buf(n, std::byte{2});
    while (!stop.load(std::memory_order_relaxed)) {
      if (!micro::take_message(to_echo.consumer, buf.data(), 0)) {
        shmdist::wait::cpu_relax();
        continue;
      }
      to_echo.consumer.publish();
      send_message(from_echo.producer, header, buf);
    }
  });

  PinnedScope pinned;
  if (!pinned.pinned()) state.SetLabel("not pinned (fewer than 2 CPUs allowed)");
  std::vector<std::byte> out(n, std::byte{1}), in(n);
  for (auto _ : state) {
    send_message(to_echo.producer, header, out);
    while (!micro::take_message(from_echo.consumer, in.data(), 1)) shmdist::wait::cpu_relax();
    from_echo.consumer.publish();
  }
  stop.store(true, std::memory_order_relaxed);
  echo.join();
  state.counters["one_way"] = benchmark::Counter(
      2.0 * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetBytesProcessed(static_cast<std::int64_t>(2 * state.iterations() * n));
}
BENCHMARK(BM_RingPingPong)->Arg(8)->Arg(1024)->Arg(64 << 10)->UseRealTime();

// The sender's half of the notification protocol, as ShmTransport::notify_receiver does it.
void notify(shmdist::segment::RankControl& receiver, int sender) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  auto& word = receiver.ready[sender / 64];
  const std::uint64_t bit = std::uint64_t{1} << (sender % 64);
  if (!(word.load(std::memory_order_relaxed) & bit)) word.fetch_or(bit, std::memory_order_relaxed);
  if (receiver.armed.load(std::memory_order_relaxed) != 0) shmdist::wait::wake(receiver.doorbell_seq);
}

void BM_RingStream(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const bool with_notify = state.range(1) != 0;
  Segment segment = Segment::create_anonymous(2, micro::kRingSize);
  micro::RingView ring(segment, 0, 1);
  shmdist::segment::RankControl& receiver = segment.rank_control(1);
  const auto header = micro::header_for(n);
  std::atomic<bool> stop{false};
  std::thread consumer([&] {
    pin_to_nth_allowed_cpu(1);
    std::vector<std::byte> buf(n);
    while (!stop.load(std::memory_order_relaxed)) {
      bool took = false;
      while (micro::take_message(ring.consumer, buf.data(), 0)) took = true;
      if (took) ring.consumer.publish();
      else shmdist::wait::cpu_relax();
    }
  });
  PinnedScope pinned;
  std::vector<std::byte> out(n, std::byte{1});
  for (auto _ : state) {
    send_message(ring.producer, header, out);
    if (with_notify) notify(receiver, 0);
  }
  stop.store(true, std::memory_order_relaxed);
  consumer.join();
  state.SetLabel(with_notify ? "fence + notify per record" : "no notify");
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
}
BENCHMARK(BM_RingStream)->ArgsProduct({{8, 1024}, {0, 1}})->UseRealTime();

}  // namespace
