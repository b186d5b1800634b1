// A seeded, reproducible randomized message storm (issue 4).
//
// Every rank derives the same schedule from the seed: message i goes from src to dst on a tag,
// with a dtype and size (0 bytes to 4 MiB, skewed toward small) and the way it is sent (send,
// isend, batch_isend_irecv) and received (recv, irecv, batch). Each rank walks the schedule in
// index order, sending what it sends and posting a receive for what it receives, and at random
// points polls, waits the oldest or waits all of its outstanding Work.
//
// Deadlock-free by construction. Tags 0-1 are received only with ANY_SOURCE, tags 2-5 only from
// their exact source. By induction on the index: a rank reaches action i once its actions
// before i are done; a send always completes (every rank keeps draining its inbound rings while
// it is in any call, including destroy_process_group); the receive posted for message i needs
// only messages of index <= i (specific tags: message i itself, FIFO per source and tag;
// any-source tags: it is the k-th receive posted on (dst, tag), and the k messages of index
// <= i on (dst, tag) all get sent). Waiting on an earlier Work at step i needs nothing later.
//
// Checked: every payload carries its sender, its index and a checksum, and is compared with the
// bytes regenerated from the seed (no corruption); a specific-source receive must get exactly
// message i (FIFO); any-source receives, taken in posting order, must show for each (source,
// tag) exactly the scheduled sequence of indices (no loss, no duplicate, no reordering).
//
// CI runs 4 ranks (2-core machine: oversubscribed) and 10,000 messages in each launch mode
// (sanitizer builds: 3,000 in process mode).
// Bigger runs: SHMDIST_STORM_RANKS, SHMDIST_STORM_MESSAGES, SHMDIST_STORM_SEED.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>

#include "p2p_support.hpp"
#include "support/shm_check.hpp"

namespace dist = shmdist;
using namespace shmdist::test;
using namespace shmdist::test::p2p;

namespace {

constexpr int kAnySourceTags = 2;  // tags [0, 2): ANY_SOURCE receives only
constexpr int kTags = 6;
constexpr std::size_t kHeaderBytes = 24;  // sender, index, length, checksum
constexpr std::size_t kMaxOutstanding = 64;

// A tiny reproducible generator (no library distribution whose output could vary).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() { return splitmix64(state_++ * 0x9e3779b97f4a7c15ull); }
  std::uint64_t below(std::uint64_t n) { return n ? next() % n : 0; }
  std::uint64_t between(std::uint64_t lo, std::uint64_t hi) { return lo + below(hi - lo + 1); }
  bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }
  // Log-uniform in [lo, hi]: many small values, some large.
  std::uint64_t log_between(std::uint64_t lo, std::uint64_t hi) {
    const double x = static_cast<double>(next() >> 11) * 0x1.0p-53;
    const double l = std::log(double(lo)), h = std::log(double(hi));
    const double v = std::exp(l + x * (h - l));
    return std::clamp<std::uint64_t>(static_cast<std::uint64_t>(v), lo, hi);
  }

 private:
  std::uint64_t state_;
};

enum class SendKind : std::uint8_t { Blocking, Isend, Batch };
enum class RecvKind : std::uint8_t { Blocking, Irecv, Batch };

struct Message {
  int src = 0, dst = 0, tag = 0;
  dist::DType dtype = dist::kUInt8;
  std::int64_t numel = 0;
  SendKind send = SendKind::Blocking;
  RecvKind recv = RecvKind::Blocking;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel) * dist::element_size(dtype); }
};

constexpr dist::DType kStormDTypes[] = {dist::kUInt8,  dist::kInt16,   dist::kInt32,
                                        dist::kInt64,  dist::kFloat32, dist::kFloat64};

struct Shape {
  dist::DType dtype;
  std::int64_t numel;
};

std::int64_t elements_for(std::uint64_t bytes, dist::DType dtype, bool at_least_header) {
  const std::uint64_t es = dist::element_size(dtype);
  if (at_least_header) bytes = std::max<std::uint64_t>(bytes, kHeaderBytes) + es - 1;
  return static_cast<std::int64_t>(bytes / es);
}

struct Schedule {
  std::vector<Message> messages;
};

Schedule make_schedule(std::uint64_t seed, int ranks, int count) {
  Rng rng(seed);
  // Any-source receives need the size in advance: one (dtype, size >= header) per (dst, tag).
  std::vector<Shape> any_shape(static_cast<std::size_t>(ranks) * kAnySourceTags);
  for (auto& s : any_shape) {
    s.dtype = kStormDTypes[rng.below(std::size(kStormDTypes))];
    s.numel = elements_for(rng.log_between(kHeaderBytes, 64 << 10), s.dtype, true);
  }
  Schedule sch;
  sch.messages.reserve(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) {
    Message m;
    m.src = static_cast<int>(rng.below(ranks));
    m.dst = static_cast<int>(rng.below(ranks - 1));
    if (m.dst >= m.src) ++m.dst;
    m.tag = rng.chance(0.3) ? static_cast<int>(rng.below(kAnySourceTags))
                            : static_cast<int>(rng.between(kAnySourceTags, kTags - 1));
    if (m.tag < kAnySourceTags) {
      const Shape& s = any_shape[static_cast<std::size_t>(m.dst) * kAnySourceTags + m.tag];
      m.dtype = s.dtype;
      m.numel = s.numel;
    } else {
      m.dtype = kStormDTypes[rng.below(std::size(kStormDTypes))];
      const std::uint64_t r = rng.below(1000);
      const std::uint64_t bytes = r < 700   ? rng.between(0, 256)
                                  : r < 985 ? rng.log_between(257, 64 << 10)
                                            : rng.log_between((64 << 10) + 1, 4 << 20);
      m.numel = elements_for(bytes, m.dtype, false);
    }
    const std::uint64_t s = rng.below(10);
    m.send = s < 5 ? SendKind::Blocking : s < 9 ? SendKind::Isend : SendKind::Batch;
    const std::uint64_t r = rng.below(10);
    m.recv = r < 5 ? RecvKind::Blocking : r < 9 ? RecvKind::Irecv : RecvKind::Batch;
    sch.messages.push_back(m);
  }
  return sch;
}

std::uint64_t body_checksum(const unsigned char* p, std::size_t n) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::uint64_t payload_seed(std::uint64_t storm_seed, int index) {
  return splitmix64(storm_seed ^ (0x51ed270b27ull * static_cast<std::uint64_t>(index + 1)));
}

// The bytes of message `index`: the seed's pattern, then (if there is room) a header with the
// sender, the index, the length and a checksum of the bytes after the header.
void fill_payload(void* data, std::size_t n, std::uint64_t storm_seed, int index, int src) {
  fill_pattern(data, n, payload_seed(storm_seed, index));
  if (n < kHeaderBytes) return;
  auto* p = static_cast<unsigned char*>(data);
  const std::uint32_t s = static_cast<std::uint32_t>(src), i = static_cast<std::uint32_t>(index);
  const std::uint64_t len = n, sum = body_checksum(p + kHeaderBytes, n - kHeaderBytes);
  std::memcpy(p, &s, 4);
  std::memcpy(p + 4, &i, 4);
  std::memcpy(p + 8, &len, 8);
  std::memcpy(p + 16, &sum, 8);
}

struct Header {
  std::uint32_t src, index;
  std::uint64_t len, sum;
};
Header read_header(const void* data) {
  Header h;
  const auto* p = static_cast<const unsigned char*>(data);
  std::memcpy(&h.src, p, 4);
  std::memcpy(&h.index, p + 4, 4);
  std::memcpy(&h.len, p + 8, 8);
  std::memcpy(&h.sum, p + 16, 8);
  return h;
}

struct StormConfig {
  int ranks = 4;
  int messages = 10000;
  std::uint64_t seed = 0x5eed2024;
};

StormConfig storm_config(std::uint64_t default_seed, int default_messages = 10000) {
  StormConfig c;
  c.seed = default_seed;
  c.messages = default_messages;
  if (const char* v = std::getenv("SHMDIST_STORM_RANKS")) c.ranks = std::max(2, std::atoi(v));
  if (const char* v = std::getenv("SHMDIST_STORM_MESSAGES")) c.messages = std::max(1, std::atoi(v));
  if (const char* v = std::getenv("SHMDIST_STORM_SEED")) c.seed = std::strtoull(v, nullptr, 0);
  return c;
}

// One rank's walk through the schedule.
class StormRank {
 public:
  StormRank(dist::ProcessGroup& pg, const Schedule& sch, std::uint64_t seed)
      : pg_(pg), sch_(sch), seed_(seed), me_(pg.get_rank()),
        rng_(splitmix64(seed ^ (0xabcdefull + static_cast<std::uint64_t>(me_)))) {}

  void run() {
    const int n = static_cast<int>(sch_.messages.size());
    for (int i = 0; i < n; ++i) {
      const Message& m = sch_.messages[i];
      if (m.src == me_) send(i, m);
      if (m.dst == me_) receive(i, m);
      maintain();
    }
    while (!pending_.empty()) finish_oldest();
    check_any_source_order();
  }

 private:
  struct Pending {
    dist::Work work;
    dist::Tensor tensor;  // receives: where the message lands
    bool is_recv = false;
    int index = -1;       // the message a specific-source receive must get; -1 for any-source
    int tag = 0;
    long ordinal = 0;     // posting order among this rank's receives
  };

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("storm (seed " + std::to_string(seed_) + ") rank " +
                             std::to_string(me_) + ": " + what);
  }

  void send(int i, const Message& m) {
    dist::Tensor t = dist::empty({m.numel}, m.dtype);
    fill_payload(t.data_ptr(), t.nbytes(), seed_, i, me_);
    switch (m.send) {
      case SendKind::Blocking: pg_.send(t, m.dst, {}, m.tag); break;
      case SendKind::Isend:
        pending_.push_back({pg_.isend(t, m.dst, {}, m.tag), {}, false, i, m.tag, 0});
        break;
      case SendKind::Batch: {
        auto works = pg_.batch_isend_irecv({dist::P2PSend(t, m.dst, {}, m.tag)});
        pending_.push_back({std::move(works.at(0)), {}, false, i, m.tag, 0});
      }
    }
  }

  void receive(int i, const Message& m) {
    const bool any = m.tag < kAnySourceTags;
    const int from = any ? dist::ANY_SOURCE : m.src;
    Pending p;
    p.tensor = dist::full({m.numel}, 0, m.dtype);
    p.is_recv = true;
    p.index = any ? -1 : i;
    p.tag = m.tag;
    p.ordinal = next_ordinal_++;
    switch (m.recv) {
      case RecvKind::Blocking: {
        const int src = pg_.recv(p.tensor, from, {}, m.tag);
        check_received(p, src);
        return;
      }
      case RecvKind::Irecv: p.work = pg_.irecv(p.tensor, from, {}, m.tag); break;
      case RecvKind::Batch:
        p.work = pg_.batch_isend_irecv({dist::P2PRecv(p.tensor, from, {}, m.tag)}).at(0);
        break;
    }
    pending_.push_back(std::move(p));
  }

  // Random progress: poll one, wait the oldest, or wait everything.
  void maintain() {
    if (pending_.empty()) return;
    if (pending_.size() > kMaxOutstanding || rng_.chance(0.05)) finish_oldest();
    if (rng_.chance(0.01))
      while (!pending_.empty()) finish_oldest();
    if (!pending_.empty() && rng_.chance(0.15)) {
      const std::size_t k = rng_.below(pending_.size());
      if (pending_[k].work.is_completed()) {
        Pending done = std::move(pending_[k]);
        pending_.erase(pending_.begin() + static_cast<long>(k));
        complete(done);
      }
    }
  }

  void finish_oldest() {
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    p.work.wait();
    complete(p);
  }

  void complete(Pending& p) {
    RANK_REQUIRE(p.work.is_completed());
    if (p.is_recv) check_received(p, p.work.source_rank());
  }

  void check_received(const Pending& p, int src) {
    const std::size_t n = p.tensor.nbytes();
    const void* data = p.tensor.data_ptr();
    int index = p.index;
    if (index >= 0) {  // specific source: exactly message `index` (FIFO per source and tag)
      if (src != sch_.messages[index].src)
        fail("receive for message " + std::to_string(index) + " returned source " +
             std::to_string(src));
    } else {           // any source: the header says which message this is
      const Header h = read_header(data);
      if (h.src != static_cast<std::uint32_t>(src) || h.index >= sch_.messages.size())
        fail("any-source receive (tag " + std::to_string(p.tag) + ") from " + std::to_string(src) +
             " carries sender " + std::to_string(h.src) + ", index " + std::to_string(h.index));
      index = static_cast<int>(h.index);
      const Message& m = sch_.messages[index];
      if (m.src != src || m.dst != me_ || m.tag != p.tag)
        fail("any-source receive got message " + std::to_string(index) + " which is not for (" +
             std::to_string(src) + " -> " + std::to_string(me_) + ", tag " +
             std::to_string(p.tag) + ")");
      any_seen_[{src, p.tag}].push_back({p.ordinal, index});
    }
    if (n >= kHeaderBytes) {
      const Header h = read_header(data);
      const auto* bytes = static_cast<const unsigned char*>(data);
      if (h.src != static_cast<std::uint32_t>(src) ||
          h.index != static_cast<std::uint32_t>(index) || h.len != n ||
          h.sum != body_checksum(bytes + kHeaderBytes, n - kHeaderBytes))
        fail("message " + std::to_string(index) + " from " + std::to_string(src) +
             ": header or checksum wrong (header says sender " + std::to_string(h.src) +
             ", index " + std::to_string(h.index) + ", length " + std::to_string(h.len) + ")");
    }
    std::vector<unsigned char> want(n);
    fill_payload(want.data(), n, seed_, index, src);
    if (n && std::memcmp(want.data(), data, n) != 0)
      fail("message " + std::to_string(index) + " from " + std::to_string(src) + " (" +
           std::to_string(n) + " bytes, tag " + std::to_string(p.tag) + ") is corrupted");
    ++received_;
  }

  // Any-source receives in posting order must show, for every (source, tag), exactly the
  // scheduled indices in order: no loss, no duplicate, no reordering.
  void check_any_source_order() {
    std::map<std::pair<int, int>, std::vector<int>> expected;
    int to_me = 0;
    for (int i = 0; i < static_cast<int>(sch_.messages.size()); ++i) {
      const Message& m = sch_.messages[i];
      if (m.dst != me_) continue;
      ++to_me;
      if (m.tag < kAnySourceTags) expected[{m.src, m.tag}].push_back(i);
    }
    if (received_ != to_me)
      fail("received " + std::to_string(received_) + " messages, expected " +
           std::to_string(to_me));
    for (auto& [key, seen] : any_seen_) {
      std::sort(seen.begin(), seen.end());
      std::vector<int> got;
      for (const auto& s : seen) got.push_back(s.second);
      if (got != expected[key])
        fail("any-source messages from " + std::to_string(key.first) + " on tag " +
             std::to_string(key.second) + " were not received exactly once in sending order");
    }
    for (const auto& [key, want] : expected)
      if (!want.empty() && !any_seen_.count(key))
        fail("no any-source message from " + std::to_string(key.first) + " on tag " +
             std::to_string(key.second) + " was received");
  }

  dist::ProcessGroup& pg_;
  const Schedule& sch_;
  std::uint64_t seed_;
  int me_;
  Rng rng_;
  std::deque<Pending> pending_;
  long next_ordinal_ = 0;
  int received_ = 0;
  std::map<std::pair<int, int>, std::vector<std::pair<long, int>>> any_seen_;
};

void run_storm(Mode mode, const StormConfig& c, std::uint64_t ring_size) {
  BOOST_TEST_MESSAGE("storm: mode " << mode_name(mode) << ", " << c.ranks << " ranks, "
                                    << c.messages << " messages, seed " << c.seed);
  const Schedule sch = make_schedule(c.seed, c.ranks, c.messages);
  JobOptions o = job_options(mode, ring_size);
  o.timeout = std::chrono::seconds(60);
  o.job_timeout = std::chrono::seconds(std::max(120, c.messages / 50));
  BOOST_TEST_CONTEXT("storm seed " << c.seed << " (rerun with SHMDIST_STORM_SEED=" << c.seed
                                   << "), mode " << mode_name(mode)) {
    expect_job_ok(c.ranks, [&](dist::ProcessGroup& pg) { StormRank(pg, sch, c.seed).run(); }, o);
  }
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(storm, ShmLeakCheck)

BOOST_AUTO_TEST_CASE(schedule_is_reproducible_and_covers_the_mix) {
  const StormConfig c = storm_config(0x5eed2024);
  const Schedule a = make_schedule(c.seed, c.ranks, c.messages);
  const Schedule b = make_schedule(c.seed, c.ranks, c.messages);
  BOOST_REQUIRE_EQUAL(a.messages.size(), b.messages.size());
  std::size_t any = 0, big = 0, empty = 0, nonblocking = 0, batch = 0;
  for (std::size_t i = 0; i < a.messages.size(); ++i) {
    const Message& x = a.messages[i];
    const Message& y = b.messages[i];
    BOOST_REQUIRE(x.src == y.src && x.dst == y.dst && x.tag == y.tag && x.numel == y.numel &&
                  x.dtype == y.dtype && x.send == y.send && x.recv == y.recv);
    BOOST_REQUIRE(x.src != x.dst);
    any += x.tag < kAnySourceTags;
    big += x.nbytes() > (1u << 20);
    empty += x.nbytes() == 0;
    nonblocking += x.send != SendKind::Blocking || x.recv != RecvKind::Blocking;
    batch += x.send == SendKind::Batch || x.recv == RecvKind::Batch;
    BOOST_REQUIRE(x.nbytes() <= (4u << 20));
  }
  if (c.messages >= 10000) {  // the mix the storm is meant to have
    BOOST_CHECK_GT(any, a.messages.size() / 5);
    BOOST_CHECK_GT(big, 10u);
    BOOST_CHECK_GT(empty, 5u);
    BOOST_CHECK_GT(nonblocking, a.messages.size() / 2);
    BOOST_CHECK_GT(batch, a.messages.size() / 20);
  }
}

BOOST_AUTO_TEST_CASE(randomized_storm_processes) {
  // ThreadSanitizer cannot see across processes: its builds spend their time on the thread run.
  run_storm(Mode::Processes, storm_config(0x5eed2024, kSanitizerBuild ? 3000 : 10000), 0);
}

BOOST_AUTO_TEST_CASE(randomized_storm_threads_small_ring) {
  // Another seed, and a 64 KiB ring so that most sizes stream through it.
  run_storm(Mode::Threads, storm_config(0x5eed2025), 64 << 10);
}

BOOST_AUTO_TEST_SUITE_END()
