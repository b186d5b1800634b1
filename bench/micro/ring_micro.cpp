// Single-threaded cost of the ring's hot path, per message of 8 B, 1 KiB and 64 KiB (one
// record each; 64 KiB is ShmTransport's largest chunk): publishing a Start record (header +
// payload), taking it (peek, check, decode, copy out, release), and both in turn.
#include <benchmark/benchmark.h>

#include <cstdlib>

#include "ring_fixture.hpp"

namespace {

using shmdist::ring::RecordKind;
using shmdist::segment::Segment;

void payload_sizes(benchmark::internal::Benchmark* b) {
  b->Arg(8)->Arg(1024)->Arg(64 << 10);
}

// Publish, then take, one message at a time: the ring stays nearly empty (a latency-bound
// stream). Both sides also publish their index as the transport does once per poll.
void BM_RingRoundTrip(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Segment segment = Segment::create_anonymous(2, micro::kRingSize);
  micro::RingView ring(segment, 0, 1);
  std::vector<std::byte> src(n, std::byte{1}), dst(n);
  const auto header = micro::header_for(n);
  for (auto _ : state) {
    if (ring.producer.writable(sizeof header + n) < sizeof header + n) std::abort();
    ring.producer.publish(RecordKind::Start, micro::bytes_of(header), src);
    if (!micro::take_message(ring.consumer, dst.data(), 0)) std::abort();
    ring.consumer.publish();
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RingRoundTrip)->Apply(payload_sizes);

// Publishing only: the ring fills up; it is drained, untimed, whenever it is full.
void BM_RingPublish(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Segment segment = Segment::create_anonymous(2, micro::kRingSize);
  micro::RingView ring(segment, 0, 1);
  std::vector<std::byte> src(n, std::byte{1}), dst(n);
  const auto header = micro::header_for(n);
  for (auto _ : state) {
    if (ring.producer.writable(sizeof header + n) < sizeof header + n) {
      state.PauseTiming();
      while (micro::take_message(ring.consumer, dst.data(), 0)) {
      }
      ring.consumer.publish();
      state.ResumeTiming();
    }
    ring.producer.publish(RecordKind::Start, micro::bytes_of(header), src);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RingPublish)->Apply(payload_sizes);

// Taking only: the ring is refilled, untimed, whenever it runs empty; the tail is published
// once per message, as a receiver that polls one message at a time does.
void BM_RingTake(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Segment segment = Segment::create_anonymous(2, micro::kRingSize);
  micro::RingView ring(segment, 0, 1);
  std::vector<std::byte> src(n, std::byte{1}), dst(n);
  const auto header = micro::header_for(n);
  for (auto _ : state) {
    if (ring.consumer.peek() == nullptr) {
      state.PauseTiming();
      while (ring.producer.writable(sizeof header + n) >= sizeof header + n)
        ring.producer.publish(RecordKind::Start, micro::bytes_of(header), src);
      state.ResumeTiming();
    }
    micro::take_message(ring.consumer, dst.data(), 0);
    ring.consumer.publish();
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RingTake)->Apply(payload_sizes);

// writable() when the cached tail already says there is room: the producer's common case.
void BM_RingWritable(benchmark::State& state) {
  Segment segment = Segment::create_anonymous(2, micro::kRingSize);
  micro::RingView ring(segment, 0, 1);
  for (auto _ : state) benchmark::DoNotOptimize(ring.producer.writable(64));
}
BENCHMARK(BM_RingWritable);

}  // namespace
