// The measurement loops, written once against a small Comm interface: shmdist-bench and the
// MPI twin (bench/mpi/) instantiate the very same code, so their figures differ only by the
// library underneath. The loops follow OSU Micro-Benchmarks 5.x/7.x (osu_latency, osu_bw,
// osu_bibw) as described in reference/shm_transports.md §3; anysource and idle are ours.
// Only rank 0 prints.
#pragma once

#include <sys/resource.h>
#include <time.h>

#include <chrono>
#include <concepts>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "osu_conventions.hpp"

namespace bench {

// What a messaging library must offer to be measured. Buffers are prepared once per message
// size (outside the timed loops), so building a handle costs nothing per message.
template <class C>
concept Comm = requires(C c, typename C::Buffer b, std::vector<typename C::Request> reqs,
                        std::byte* p, std::size_t n, int peer, int tag, const std::string& why) {
  { C::kAnySource } -> std::convertible_to<int>;
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  { c.name() } -> std::convertible_to<std::string>;    // "shmdist", "MPI"
  { c.detail() } -> std::convertible_to<std::string>;  // library version, for the title
  { c.buffer(p, n) } -> std::same_as<typename C::Buffer>;
  c.barrier();
  c.send(b, peer, tag);
  { c.recv(b, peer, tag) } -> std::convertible_to<int>;  // returns the sender's rank
  { c.isend(b, peer, tag) } -> std::same_as<typename C::Request>;
  { c.irecv(b, peer, tag) } -> std::same_as<typename C::Request>;
  c.wait_all(reqs);
  c.fail(why);  // reports and ends the whole job with a non-zero status
};

namespace detail {

constexpr int kDataTag = 100;
constexpr int kReplyTag = 10;  // bibw: the other direction
constexpr int kAckTag = 101;
constexpr int kStopTag = 102;
constexpr int kResultTag = 103;

template <Comm C>
void require_ranks(C& c, int min, int max, const char* test) {
  if (c.size() >= min && c.size() <= max) return;
  const std::string want = min == max ? "exactly " + std::to_string(min)
                                      : "at least " + std::to_string(min);
  c.fail(std::string(test) + " needs " + want + " ranks, found " + std::to_string(c.size()) +
         " (run it as: shmrun -n " + std::to_string(min) + " shmdist-bench " + test + ")");
}

template <Comm C>
void check_received(C& c, const std::byte* p, std::size_t size, int sender, const char* test) {
  const long bad = check_pattern(p, size, sender);
  if (bad >= 0)
    c.fail(std::string(test) + ": rank " + std::to_string(c.rank()) + " received wrong data at " +
           "byte " + std::to_string(bad) + " of a " + std::to_string(size) +
           "-byte message from rank " + std::to_string(sender));
}

struct CpuSample {
  double wall = 0;        // s
  double process = 0;     // s of CPU, all threads of the process (user + system)
  double thread = 0;      // s of CPU, the calling thread
  double voluntary = 0;   // context switches of the calling thread: sleeps
  double involuntary = 0;
};

inline double seconds(const timeval& tv) { return double(tv.tv_sec) + double(tv.tv_usec) * 1e-6; }

inline CpuSample cpu_sample() {
  CpuSample s;
  s.wall = wtime();
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  s.thread = double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
  rusage self{}, thread{};
  getrusage(RUSAGE_SELF, &self);
  getrusage(RUSAGE_THREAD, &thread);
  s.process = seconds(self.ru_utime) + seconds(self.ru_stime);
  s.voluntary = double(thread.ru_nvcsw);
  s.involuntary = double(thread.ru_nivcsw);
  return s;
}

}  // namespace detail

// osu_latency: rank 0 sends and waits for the echo; half the round trip, averaged, in us.
// Ranks beyond 0 and 1 are bystanders: they only join the barrier before each size (so that
// the pair can be measured inside a larger job, e.g. two ranks of one host in a job that
// spans hosts).
template <Comm C>
void run_latency(C& c, const Options& o) {
  detail::require_ranks(c, 2, std::numeric_limits<int>::max(), "latency");
  const auto sizes = message_sizes(o, 0);
  const int me = c.rank(), peer = 1 - me;
  if (me > 1) {
    for (std::size_t i = 0; i < sizes.size(); ++i) c.barrier();
    return;
  }
  AlignedBuffer sbuf(largest(sizes)), rbuf(largest(sizes));
  if (me == 0) {
    print_title(c.name(), "Latency", c.detail());
    print_header("Latency (us)");
  }
  for (const std::size_t size : sizes) {
    const LoopCount loop = latency_loop(size, o);
    fill_pattern(sbuf.data(), size, me);
    auto s = c.buffer(sbuf.data(), size);
    auto r = c.buffer(rbuf.data(), size);
    c.barrier();
    double start = 0;
    if (me == 0) {
      for (long i = 0; i < loop.iterations + loop.skip; ++i) {
        if (i == loop.skip) start = wtime();
        c.send(s, peer, detail::kDataTag);
        c.recv(r, peer, detail::kDataTag);
      }
    } else {
      for (long i = 0; i < loop.iterations + loop.skip; ++i) {
        c.recv(r, peer, detail::kDataTag);
        c.send(s, peer, detail::kDataTag);
      }
    }
    const double elapsed = wtime() - start;
    detail::check_received(c, rbuf.data(), size, peer, "latency");
    if (me == 0) print_row(size, elapsed * 1e6 / (2.0 * double(loop.iterations)));
  }
}

// osu_bw: rank 0 posts a window of isends, waits for them, then for a 4-byte ack that rank 1
// sends once its window of irecvs completed. MB/s with MB = 10^6 bytes.
template <Comm C>
void run_bandwidth(C& c, const Options& o) {
  detail::require_ranks(c, 2, 2, "bw");
  const auto sizes = message_sizes(o, 1);
  const int me = c.rank(), peer = 1 - me;
  AlignedBuffer sbuf(largest(sizes)), rbuf(largest(sizes)), ackbuf(4);
  auto ack = c.buffer(ackbuf.data(), 4);
  std::vector<typename C::Request> reqs(static_cast<std::size_t>(o.window));
  if (me == 0) {
    print_title(c.name(), "Bandwidth", c.detail());
    print_header("Bandwidth (MB/s)");
  }
  for (const std::size_t size : sizes) {
    const LoopCount loop = bandwidth_loop(size, o);
    fill_pattern(sbuf.data(), size, me);
    auto s = c.buffer(sbuf.data(), size);
    auto r = c.buffer(rbuf.data(), size);
    c.barrier();
    double start = 0;
    if (me == 0) {
      for (long i = 0; i < loop.iterations + loop.skip; ++i) {
        if (i == loop.skip) start = wtime();
        for (auto& req : reqs) req = c.isend(s, peer, detail::kDataTag);
        c.wait_all(reqs);
        c.recv(ack, peer, detail::kAckTag);
      }
    } else {
      for (long i = 0; i < loop.iterations + loop.skip; ++i) {
        for (auto& req : reqs) req = c.irecv(r, peer, detail::kDataTag);
        c.wait_all(reqs);
        c.send(ack, peer, detail::kAckTag);
      }
    }
    const double elapsed = wtime() - start;
    if (me == 1) detail::check_received(c, rbuf.data(), size, peer, "bw");
    if (me == 0)
      print_row(size, double(size) / 1e6 * double(loop.iterations) * o.window / elapsed);
  }
}

// osu_bibw: both ranks post a window of irecvs and a window of isends per iteration; the
// figure counts both directions.
template <Comm C>
void run_bibandwidth(C& c, const Options& o) {
  detail::require_ranks(c, 2, 2, "bibw");
  const auto sizes = message_sizes(o, 1);
  const int me = c.rank(), peer = 1 - me;
  const int out_tag = me == 0 ? detail::kDataTag : detail::kReplyTag;
  const int in_tag = me == 0 ? detail::kReplyTag : detail::kDataTag;
  AlignedBuffer sbuf(largest(sizes)), rbuf(largest(sizes));
  std::vector<typename C::Request> sends(static_cast<std::size_t>(o.window));
  std::vector<typename C::Request> recvs(static_cast<std::size_t>(o.window));
  if (me == 0) {
    print_title(c.name(), "Bi-Directional Bandwidth", c.detail());
    print_header("Bandwidth (MB/s)");
  }
  for (const std::size_t size : sizes) {
    const LoopCount loop = bandwidth_loop(size, o);
    fill_pattern(sbuf.data(), size, me);
    auto s = c.buffer(sbuf.data(), size);
    auto r = c.buffer(rbuf.data(), size);
    c.barrier();
    double start = 0;
    for (long i = 0; i < loop.iterations + loop.skip; ++i) {
      if (i == loop.skip) start = wtime();
      for (auto& req : recvs) req = c.irecv(r, peer, in_tag);
      for (auto& req : sends) req = c.isend(s, peer, out_tag);
      c.wait_all(sends);
      c.wait_all(recvs);
    }
    const double elapsed = wtime() - start;
    detail::check_received(c, rbuf.data(), size, peer, "bibw");
    if (me == 0)
      print_row(size, double(size) / 1e6 * double(loop.iterations) * o.window * 2.0 / elapsed);
  }
}

// Any-source, rank 0 receiving from N-1 senders.
//  Latency: ping-pong between rank 0 and rank 1, where rank 0 receives with ANY_SOURCE while
//  ranks 2..N-1 sit blocked in a receive that completes only at the end (what an idle peer
//  costs the active pair, for example on an oversubscribed host).
//  Messages/s: all N-1 senders stream windows of isends; rank 0 posts (N-1) * window
//  any-source irecvs per iteration, then acks every sender.
inline constexpr long kAnySourceWarmup = 20'000;  // untimed round trips before the first size

template <Comm C>
void run_anysource(C& c, const Options& o) {
  detail::require_ranks(c, 2, 1 << 20, "anysource");
  const auto sizes = message_sizes(o, 0);
  const int me = c.rank(), world = c.size(), senders = world - 1;
  AlignedBuffer sbuf(largest(sizes)), rbuf(largest(sizes)), ackbuf(4);
  auto ack = c.buffer(ackbuf.data(), 4);
  std::vector<double> latency(sizes.size(), 0), rate(sizes.size(), 0);

  // Phase 1: latency against one active sender. An untimed warm-up first, long enough for the
  // idle ranks to have settled into their blocked receive (past any spin phase, asleep or
  // yielding), so that the first size measures the receive, not the job's start-up.
  c.barrier();
  if (me >= 2) {
    c.recv(ack, 0, detail::kStopTag);
  } else {
    {
      auto s = c.buffer(sbuf.data(), sizes.front());
      auto r = c.buffer(rbuf.data(), sizes.front());
      for (long i = 0; i < kAnySourceWarmup; ++i) {
        if (me == 0) {
          c.send(s, 1, detail::kDataTag);
          c.recv(r, C::kAnySource, detail::kDataTag);
        } else {
          c.recv(r, 0, detail::kDataTag);
          c.send(s, 0, detail::kDataTag);
        }
      }
    }
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const std::size_t size = sizes[k];
      const LoopCount loop = latency_loop(size, o);
      fill_pattern(sbuf.data(), size, me);
      auto s = c.buffer(sbuf.data(), size);
      auto r = c.buffer(rbuf.data(), size);
      double start = 0;
      for (long i = 0; i < loop.iterations + loop.skip; ++i) {
        if (me == 0) {
          if (i == loop.skip) start = wtime();
          c.send(s, 1, detail::kDataTag);
          const int from = c.recv(r, C::kAnySource, detail::kDataTag);
          if (from != 1)
            c.fail("anysource: rank 0 expected the reply from rank 1, received from rank " +
                   std::to_string(from));
        } else {
          c.recv(r, 0, detail::kDataTag);
          c.send(s, 0, detail::kDataTag);
        }
      }
      latency[k] = (wtime() - start) * 1e6 / (2.0 * double(loop.iterations));
      detail::check_received(c, rbuf.data(), size, 1 - me, "anysource");
    }
    if (me == 0)
      for (int idle = 2; idle < world; ++idle) c.send(ack, idle, detail::kStopTag);
  }

  // Phase 2: message rate with every sender streaming.
  const std::size_t per_iter = static_cast<std::size_t>(senders) * static_cast<std::size_t>(o.window);
  std::vector<typename C::Request> reqs(me == 0 ? per_iter : static_cast<std::size_t>(o.window));
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const std::size_t size = sizes[k];
    const LoopCount loop = bandwidth_loop(size, o);
    fill_pattern(sbuf.data(), size, me);
    auto s = c.buffer(sbuf.data(), size);
    auto r = c.buffer(rbuf.data(), size);
    c.barrier();
    double start = 0;
    for (long i = 0; i < loop.iterations + loop.skip; ++i) {
      if (me == 0) {
        if (i == loop.skip) start = wtime();
        for (auto& req : reqs) req = c.irecv(r, C::kAnySource, detail::kDataTag);
        c.wait_all(reqs);
        for (int src = 1; src < world; ++src) c.send(ack, src, detail::kAckTag);
      } else {
        for (auto& req : reqs) req = c.isend(s, 0, detail::kDataTag);
        c.wait_all(reqs);
        c.recv(ack, 0, detail::kAckTag);
      }
    }
    rate[k] = double(per_iter) * double(loop.iterations) / (wtime() - start);
  }

  if (me == 0) {
    print_title(c.name(), "Any-Source", c.detail());
    std::printf("# [ ranks: %d ] [ senders: %d ] [ latency: rank 1 active, %d idle, after %ld "
                "untimed round trips ] [ window size: %d ]\n",
                world, senders, world - 2, kAnySourceWarmup, o.window);
    print_header("Latency (us)", "Messages/s");
    for (std::size_t k = 0; k < sizes.size(); ++k) print_row(sizes[k], latency[k], rate[k]);
  }
}

// Idle cost: every rank but 0 blocks in a receive that rank 0 satisfies only after
// `idle_seconds` (plus 10 ms, well past any spin phase); each measures the CPU it used
// meanwhile, first for a receive from rank 0, then for an any-source receive.
template <Comm C>
void run_idle(C& c, const Options& o) {
  detail::require_ranks(c, 2, 1 << 20, "idle");
  const int me = c.rank(), world = c.size();
  AlignedBuffer tokbuf(4), resbuf(sizeof(detail::CpuSample));
  auto token = c.buffer(tokbuf.data(), 4);
  auto result = c.buffer(resbuf.data(), sizeof(detail::CpuSample));
  if (me == 0) {
    print_title(c.name(), "Idle CPU", c.detail());
    std::printf("# [ ranks: %d ] [ receive blocked for %.2f s ] [ CPU = user + system ]\n", world,
                o.idle_seconds);
    std::printf("%-*s%*s%*s%*s%*s%*s\n", 10, "# Rank", 10, "Source", kFieldWidth, "Blocked (s)",
                kFieldWidth, "CPU (%)", kFieldWidth, "Thread CPU (%)", kFieldWidth, "Sleeps");
  }
  for (const bool any : {false, true}) {
    c.barrier();
    if (me == 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(o.idle_seconds + 0.01));
      for (int r = 1; r < world; ++r) c.send(token, r, detail::kStopTag);
      for (int r = 1; r < world; ++r) {
        c.recv(result, r, detail::kResultTag);
        detail::CpuSample d;
        std::memcpy(&d, resbuf.data(), sizeof d);
        std::printf("%-*d%*s%*.*f%*.*f%*.*f%*.0f\n", 10, r, 10, any ? "any" : "0", kFieldWidth,
                    kFloatPrecision, d.wall, kFieldWidth, kFloatPrecision,
                    100.0 * d.process / d.wall, kFieldWidth, kFloatPrecision,
                    100.0 * d.thread / d.wall, kFieldWidth, d.voluntary);
        std::fflush(stdout);
      }
    } else {
      const detail::CpuSample before = detail::cpu_sample();
      c.recv(token, any ? C::kAnySource : 0, detail::kStopTag);
      const detail::CpuSample after = detail::cpu_sample();
      const detail::CpuSample d{after.wall - before.wall, after.process - before.process,
                                after.thread - before.thread, after.voluntary - before.voluntary,
                                after.involuntary - before.involuntary};
      std::memcpy(resbuf.data(), &d, sizeof d);
      c.send(result, 0, detail::kResultTag);
    }
  }
}

template <Comm C>
void run_test(C& c, Test test, const Options& o) {
  switch (test) {
    case Test::Latency: run_latency(c, o); break;
    case Test::Bandwidth: run_bandwidth(c, o); break;
    case Test::BiBandwidth: run_bibandwidth(c, o); break;
    case Test::AnySource: run_anysource(c, o); break;
    case Test::Idle: run_idle(c, o); break;
  }
}

}  // namespace bench
