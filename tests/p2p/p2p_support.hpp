// Helpers shared by the point-to-point behaviour tests: reproducible byte patterns, a few
// counters shared by all ranks (in both launch modes), and scoped environment changes.
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include <shmdist/shmdist.hpp>

#include "support/job.hpp"

namespace shmdist::test::p2p {

// Sanitizer builds run 5-20x slower, and mostly in the instrumented loops that fill and check
// payloads. There the largest payloads shrink (they still stream through rings many times
// smaller): big_payload(normal, sanitized) picks one.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif
#else
inline constexpr bool kSanitizerBuild = false;
#endif

constexpr std::int64_t big_payload(std::int64_t normal, std::int64_t sanitized) {
  return kSanitizerBuild ? sanitized : normal;
}

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The pattern's 8-byte word `i` for a given seed; every byte position depends on seed and offset,
// so a lost, duplicated or shifted chunk shows up as a mismatch.
inline std::uint64_t pattern_word(std::uint64_t seed, std::uint64_t i) {
  return splitmix64(seed * 0x100000001b3ull + i);
}

inline void fill_pattern(void* data, std::size_t nbytes, std::uint64_t seed) {
  auto* p = static_cast<unsigned char*>(data);
  std::size_t i = 0;
  for (; i + 8 <= nbytes; i += 8) {
    const std::uint64_t w = pattern_word(seed, i / 8);
    std::memcpy(p + i, &w, 8);
  }
  if (i < nbytes) {
    const std::uint64_t w = pattern_word(seed, i / 8);
    std::memcpy(p + i, &w, nbytes - i);
  }
}

// Offset of the first byte that differs from the pattern, or nullopt if all match.
inline std::optional<std::size_t> pattern_mismatch(const void* data, std::size_t nbytes,
                                                   std::uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < nbytes; i += 8) {
    const std::uint64_t w = pattern_word(seed, i / 8);
    const std::size_t n = nbytes - i < 8 ? nbytes - i : 8;
    if (std::memcmp(p + i, &w, n) != 0) {
      for (std::size_t b = 0; b < n; ++b)
        if (p[i + b] != reinterpret_cast<const unsigned char*>(&w)[b]) return i + b;
    }
  }
  return std::nullopt;
}

inline void fill_pattern(Tensor& t, std::uint64_t seed) {
  fill_pattern(t.data_ptr(), t.nbytes(), seed);
}

// Throws (failing the rank) if `t` does not hold the pattern of `seed`.
inline void require_pattern(const Tensor& t, std::uint64_t seed, const std::string& what) {
  if (auto at = pattern_mismatch(t.data_ptr(), t.nbytes(), seed))
    throw std::runtime_error(what + ": payload of " + std::to_string(t.nbytes()) +
                             " bytes differs from what was sent at byte " + std::to_string(*at));
}

// Counters visible to every rank of a job in both launch modes: a MAP_SHARED anonymous mapping
// made before launch() is shared by forked ranks and, trivially, by thread ranks. Used to
// sequence ranks without going through the library (which would make progress as a side
// effect), e.g. "the senders are done, nothing has been received yet".
class SharedCounters {
 public:
  explicit SharedCounters(std::size_t n) : n_(n) {
    void* p = mmap(nullptr, bytes(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap of shared counters failed");
    counters_ = static_cast<std::atomic<std::int64_t>*>(p);
    for (std::size_t i = 0; i < n_; ++i) new (&counters_[i]) std::atomic<std::int64_t>(0);
  }
  ~SharedCounters() { munmap(counters_, bytes()); }
  SharedCounters(const SharedCounters&) = delete;
  SharedCounters& operator=(const SharedCounters&) = delete;

  std::atomic<std::int64_t>& operator[](std::size_t i) const { return counters_[i]; }

  // Waits (sleeping, outside the library) until counter i reaches `value`; throws after
  // `limit` so that a broken test fails instead of hanging.
  void wait_at_least(std::size_t i, std::int64_t value,
                     std::chrono::milliseconds limit = std::chrono::seconds(60)) const {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (counters_[i].load(std::memory_order_acquire) < value) {
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("timed out waiting for shared counter " + std::to_string(i) +
                                 " to reach " + std::to_string(value));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  std::size_t bytes() const { return n_ * sizeof(std::atomic<std::int64_t>); }
  std::size_t n_;
  std::atomic<std::int64_t>* counters_ = nullptr;
};

// Sets (or unsets, with nullopt) an environment variable for the scope, restoring it after.
// Only for the test's main thread, outside any job.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, std::optional<std::string> value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    if (value) setenv(name_.c_str(), value->c_str(), 1);
    else unsetenv(name_.c_str());
  }
  ~ScopedEnv() {
    if (old_) setenv(name_.c_str(), old_->c_str(), 1);
    else unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

inline JobOptions job_options(Mode mode, std::uint64_t ring_size = 0) {
  JobOptions o;
  o.mode = mode;
  o.ring_size = ring_size;
  return o;
}

// Runs fn(); requires it to throw E whose message contains every one of `parts`.
// Returns the message. For use inside rank functions.
template <class E, class Fn>
std::string require_throws(Fn&& fn, std::initializer_list<std::string> parts,
                           const std::string& what) {
  try {
    fn();
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& part : parts)
      if (msg.find(part) == std::string::npos)
        throw std::runtime_error(what + ": the error message lacks '" + part + "': " + msg);
    return msg;
  } catch (const std::exception& e) {
    throw std::runtime_error(what + ": threw the wrong exception type: " + e.what());
  }
  throw std::runtime_error(what + ": did not throw");
}

}  // namespace shmdist::test::p2p
