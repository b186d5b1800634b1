// The SPSC byte ring on its own: records, stamps, wrap-around, free-space accounting, and a
// two-thread stream (ThreadSanitizer checks its memory orderings).
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "ring/ring.hpp"
#include "segment/segment.hpp"

using namespace shmdist;
using ring::RecordKind;

namespace {

struct RingPair {
  segment::Segment seg;
  ring::RingProducer producer;
  ring::RingConsumer consumer;
  explicit RingPair(std::uint64_t size) : seg(segment::Segment::create_anonymous(2, size)) {
    producer = ring::RingProducer(&seg.ring_control(0, 1), seg.ring_data(0, 1), size);
    consumer = ring::RingConsumer(&seg.ring_control(0, 1), seg.ring_data(0, 1), size);
  }
};

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::byte((i * 131 + seed * 7) & 0xff);
  return v;
}

// Reads the record at the consumer's tail into a vector and releases it.
std::vector<std::byte> take(ring::RingConsumer& c, RecordKind* kind = nullptr) {
  const ring::RecordHeader* rec = c.peek();
  BOOST_REQUIRE(rec != nullptr);
  std::vector<std::byte> out(rec->length);
  if (kind) *kind = static_cast<RecordKind>(rec->kind);
  c.copy_payload(0, out.data(), out.size());
  c.release(rec->length);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(empty_ring_has_no_record) {
  RingPair r(4096);
  BOOST_TEST(r.consumer.peek() == nullptr);
}

BOOST_AUTO_TEST_CASE(record_round_trip_with_prefix_and_payload) {
  RingPair r(4096);
  const auto prefix = pattern(32, 1), payload = pattern(100, 2);
  BOOST_REQUIRE_GE(r.producer.writable(132), 132u);
  r.producer.publish(RecordKind::Start, prefix, payload);
  RecordKind kind{};
  const auto got = take(r.consumer, &kind);
  BOOST_TEST(static_cast<int>(kind) == static_cast<int>(RecordKind::Start));
  BOOST_REQUIRE_EQUAL(got.size(), 132u);
  BOOST_TEST(std::memcmp(got.data(), prefix.data(), 32) == 0);
  BOOST_TEST(std::memcmp(got.data() + 32, payload.data(), 100) == 0);
  BOOST_TEST(r.consumer.peek() == nullptr);
}

BOOST_AUTO_TEST_CASE(small_record_takes_one_cache_line) {
  BOOST_TEST(ring::padded_record_size(48) == 64u);  // header 16 + 32 + 8-byte payload = 56
  BOOST_TEST(ring::padded_record_size(49) == 128u);
  BOOST_TEST(ring::padded_record_size(0) == 64u);
}

BOOST_AUTO_TEST_CASE(full_ring_refuses_until_consumer_publishes) {
  RingPair r(4096);
  std::size_t records = 0;
  while (r.producer.writable(1000) >= 1000) {
    r.producer.publish(RecordKind::Continuation, {}, pattern(1000, unsigned(records)));
    ++records;
  }
  BOOST_TEST(records == 3u);  // 3 x 1024 padded + the next stamp slot fit in 4096
  take(r.consumer);
  // Consumed but not published: the producer must still see a full ring.
  BOOST_TEST(r.producer.writable(1000) < 1000u);
  BOOST_TEST(r.consumer.publish());
  BOOST_TEST(r.producer.writable(1000) >= 1000u);
  BOOST_TEST(!r.consumer.publish());  // nothing new
}

// Many laps with sizes that land records and payloads on every offset: every record is read
// back exactly, and a stale stamp from an earlier lap is never taken for a new record even
// when payload bytes happen to look like one.
BOOST_AUTO_TEST_CASE(wraps_many_times_without_stale_records) {
  RingPair r(4096);
  std::mt19937 rng(42);
  std::uint64_t expected_tail = 0;
  for (int i = 0; i < 20000; ++i) {
    const std::size_t n = rng() % 3000;
    auto payload = pattern(n, unsigned(i));
    // Poison the payload with values that are valid stamps for nearby future positions.
    for (std::size_t k = 0; k + 8 <= n; k += 64) {
      const std::uint64_t fake = expected_tail + 4096 + k + 1;
      std::memcpy(payload.data() + k, &fake, 8);
    }
    BOOST_REQUIRE_GE(r.producer.writable(n), n);
    r.producer.publish(RecordKind::Continuation, {}, payload);
    const auto got = take(r.consumer);
    BOOST_REQUIRE_EQUAL(got.size(), n);
    BOOST_REQUIRE(got == payload);
    BOOST_REQUIRE(r.consumer.peek() == nullptr);
    r.consumer.publish();
    expected_tail += ring::padded_record_size(n);
    BOOST_REQUIRE_EQUAL(r.consumer.tail(), expected_tail);
  }
}

BOOST_AUTO_TEST_CASE(max_record_length_fits_an_empty_ring) {
  RingPair r(4096);
  const std::size_t max = r.consumer.max_record_length();
  BOOST_TEST(r.producer.writable(1 << 20) == max);
  r.producer.publish(RecordKind::Continuation, {}, pattern(max, 9));
  BOOST_TEST(take(r.consumer).size() == max);
}

// Producer and consumer on two threads stream records of random sizes through a small ring.
BOOST_AUTO_TEST_CASE(two_thread_stream_delivers_every_byte_in_order) {
  RingPair r(8192);
  constexpr int kRecords = 200000;
  std::thread producer([&] {
    std::mt19937 rng(7);
    for (int i = 0; i < kRecords; ++i) {
      const std::size_t n = 8 + rng() % 600;
      auto payload = pattern(n, unsigned(i));
      std::memcpy(payload.data(), &i, sizeof i);
      while (r.producer.writable(n) < n) std::this_thread::yield();
      r.producer.publish(RecordKind::Continuation, {}, payload);
    }
  });
  std::mt19937 rng(7);
  int bad = 0;
  for (int i = 0; i < kRecords; ++i) {
    const std::size_t n = 8 + rng() % 600;
    const ring::RecordHeader* rec;
    while ((rec = r.consumer.peek()) == nullptr) std::this_thread::yield();
    std::vector<std::byte> got(rec->length);
    r.consumer.copy_payload(0, got.data(), got.size());
    r.consumer.release(rec->length);
    r.consumer.publish();
    auto expect = pattern(n, unsigned(i));
    std::memcpy(expect.data(), &i, sizeof i);
    if (got != expect) ++bad;
  }
  producer.join();
  BOOST_TEST(bad == 0);
}

// The fast path's small copies (two overlapping fixed-size moves up to 16 bytes) copy exactly
// n bytes: nothing before, nothing after, at every length around the thresholds.
BOOST_AUTO_TEST_CASE(small_copies_copy_exactly_n_bytes) {
  const auto src = pattern(64, 3);
  for (std::size_t n = 0; n <= 40; ++n) {
    std::vector<std::byte> dst(n + 32, std::byte{0xEE});
    ring::copy_bytes(dst.data() + 16, src.data(), n);
    for (std::size_t i = 0; i < dst.size(); ++i) {
      const bool inside = i >= 16 && i < 16 + n;
      BOOST_TEST_CONTEXT("n " << n << ", byte " << i) {
        BOOST_TEST((dst[i] == (inside ? src[i - 16] : std::byte{0xEE})));
      }
    }
  }
  ring::copy_bytes(nullptr, nullptr, 0);  // the empty copy accepts null pointers
}
