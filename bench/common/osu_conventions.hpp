// OSU Micro-Benchmarks conventions, shared by shmdist-bench and its MPI twin so that both
// print figures that sit next to osu_latency / osu_bw output (reference/shm_transports.md §3):
// message sizes, iteration and warm-up counts, the output format, 64-byte aligned buffers,
// the data pattern used to check what arrived, and the clock.
//
// Header-only and free of any messaging library: the loops in osu_loops.hpp are written
// against a small Comm interface that each executable implements for its library.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

namespace bench {

// The project's version (bench/CMakeLists.txt passes PROJECT_VERSION), printed in titles.
#ifndef SHMDIST_BENCH_VERSION
#define SHMDIST_BENCH_VERSION "unknown"
#endif
inline constexpr const char* kBenchVersion = SHMDIST_BENCH_VERSION;

// osu_util.h: MIN_MESSAGE_SIZE 1 (latency tests start at 0), MAX_MESSAGE_SIZE 1<<22,
// LARGE_MESSAGE_SIZE 8192, FIELD_WIDTH 20, FLOAT_PRECISION 2, MESSAGE_ALIGNMENT 64.
inline constexpr std::size_t kMaxMessageSize = std::size_t{1} << 22;
inline constexpr std::size_t kLargeMessageSize = 8192;
inline constexpr int kFieldWidth = 20;
inline constexpr int kFloatPrecision = 2;
inline constexpr std::size_t kMessageAlignment = 64;
inline constexpr int kDefaultWindow = 64;  // WINDOW_SIZE_LARGE

enum class Test { Latency, Bandwidth, BiBandwidth, AnySource, Idle };

// What the command line asked for; -1 / unset means "OSU default for this test and size".
struct Options {
  long min_size = -1;
  long max_size = -1;
  long iterations = -1;  // timed iterations, for every size
  long warmup = -1;      // untimed iterations before them, for every size
  int window = kDefaultWindow;
  double idle_seconds = 2.0;  // idle test: how long a receive stays blocked
  // Collectives: the element type, "float32", "bfloat16" or "float16" (the 16-bit types only
  // in shmdist-bench; MPI has none). Sizes stay in bytes.
  std::string dtype = "float32";
};

struct LoopCount {
  long iterations;
  long skip;
};

// osu_latency: LAT_LOOP_SMALL 10,000 / LAT_SKIP_SMALL 100, above 8 KiB 1,000 / 10.
inline LoopCount latency_loop(std::size_t size, const Options& o) {
  LoopCount c = size > kLargeMessageSize ? LoopCount{1000, 10} : LoopCount{10000, 100};
  if (o.iterations > 0) c.iterations = o.iterations;
  if (o.warmup >= 0) c.skip = o.warmup;
  return c;
}

// osu_bw / osu_bibw: BW_LOOP_SMALL 100 / BW_SKIP_SMALL 10, above 8 KiB 20 / 2.
inline LoopCount bandwidth_loop(std::size_t size, const Options& o) {
  LoopCount c = size > kLargeMessageSize ? LoopCount{20, 2} : LoopCount{100, 10};
  if (o.iterations > 0) c.iterations = o.iterations;
  if (o.warmup >= 0) c.skip = o.warmup;
  return c;
}

// 0 (or min), then powers of two up to max, as OSU's `size = size ? size * 2 : 1`.
inline std::vector<std::size_t> message_sizes(const Options& o, std::size_t default_min) {
  const std::size_t min = o.min_size >= 0 ? static_cast<std::size_t>(o.min_size) : default_min;
  const std::size_t max = o.max_size >= 0 ? static_cast<std::size_t>(o.max_size) : kMaxMessageSize;
  std::vector<std::size_t> sizes;
  for (std::size_t s = min; s <= max; s = s ? s * 2 : 1) sizes.push_back(s);
  return sizes;
}

inline std::size_t largest(const std::vector<std::size_t>& sizes) {
  return sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
}

// ---- output ---------------------------------------------------------------------------------

// "# shmdist Latency Test v0.1.0", optionally followed by " (detail)".
inline void print_title(const std::string& impl, const char* test, const std::string& detail = {}) {
  std::printf("# %s %s Test v%s%s\n", impl.c_str(), test, kBenchVersion,
              detail.empty() ? "" : (" (" + detail + ")").c_str());
}
// osu_util.c: fprintf(stdout, "%-*s%*s\n", 10, "# Size", FIELD_WIDTH, "Latency (us)").
inline void print_header(const char* column) {
  std::printf("%-*s%*s\n", 10, "# Size", kFieldWidth, column);
}
inline void print_header(const char* column1, const char* column2) {
  std::printf("%-*s%*s%*s\n", 10, "# Size", kFieldWidth, column1, kFieldWidth, column2);
}
// "%-*d%*.*f\n", 10, size, FIELD_WIDTH, FLOAT_PRECISION, value.
inline void print_row(std::size_t size, double value) {
  std::printf("%-*d%*.*f\n", 10, static_cast<int>(size), kFieldWidth, kFloatPrecision, value);
  std::fflush(stdout);
}
inline void print_row(std::size_t size, double value1, double value2) {
  std::printf("%-*d%*.*f%*.*f\n", 10, static_cast<int>(size), kFieldWidth, kFloatPrecision,
              value1, kFieldWidth, kFloatPrecision, value2);
  std::fflush(stdout);
}

// ---- buffers --------------------------------------------------------------------------------

// A MESSAGE_ALIGNMENT-aligned buffer, touched at allocation so page faults stay out of timings.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(std::size_t bytes)
      : size_(bytes),
        data_(static_cast<std::byte*>(::operator new(
            std::max<std::size_t>(bytes, 1), std::align_val_t{kMessageAlignment}))) {
    std::memset(data_, 0, std::max<std::size_t>(bytes, 1));
  }
  ~AlignedBuffer() { ::operator delete(data_, std::align_val_t{kMessageAlignment}); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() { return data_; }
  std::size_t size() const { return size_; }

 private:
  std::size_t size_;
  std::byte* data_;
};

// The bytes rank `owner` sends at message size `size`; receivers check them after each size
// (outside the timed loop), so a transport that garbles data cannot post a good figure.
inline std::byte pattern_byte(std::size_t i, std::size_t size, int owner) {
  return static_cast<std::byte>((i * 131 + size * 7 + static_cast<std::size_t>(owner) * 29 + 1) &
                                0xff);
}
inline void fill_pattern(std::byte* p, std::size_t size, int owner) {
  for (std::size_t i = 0; i < size; ++i) p[i] = pattern_byte(i, size, owner);
}
// Returns the first offset that differs from the pattern, or -1.
inline long check_pattern(const std::byte* p, std::size_t size, int owner) {
  for (std::size_t i = 0; i < size; ++i)
    if (p[i] != pattern_byte(i, size, owner)) return static_cast<long>(i);
  return -1;
}

// ---- time -----------------------------------------------------------------------------------

// Seconds on the monotonic clock, like MPI_Wtime.
inline double wtime() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace bench
