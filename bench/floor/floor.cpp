// shmdist-floor: what this machine allows at best, to put transport figures in proportion.
//
//   cacheline   two processes bounce one cache line in shared memory, one per CPU, spinning:
//               one-way ns. No transport can hand a message over faster.
//   samecore    the same with both processes on one CPU, yielding while they wait: what a
//               hand-off costs when ranks outnumber CPUs.
//   futex       two processes on two CPUs that sleep in FUTEX_WAIT every time: one-way us of
//               a wake-up, what a receive pays once its spin phase is over.
//   memcpy      one core copying 64 KiB, 1 MiB and 4 MiB buffers: GB/s (10^9 B/s of data
//               copied). A two-copy transport moves large messages at some fraction of this.
//   crosscopy   (only when asked for: --only crosscopy) the copy a receiver makes of bytes the
//               other core has just written, two ways: memcpy out of shared memory (what each
//               of a ring's two copies does) and process_vm_readv out of the writer's private
//               memory (Open MPI's CMA single copy, and shmdist's between processes): GB/s of
//               the reader's copy alone, 64 KiB, 1 MiB and 4 MiB.
//
// Each probe runs several times; the median is the figure (the VM's host moves vCPUs around,
// so single runs can be off by 5x; see reference/shm_transports.md §8.5), min and max show
// the spread. Output: '#' comment lines, then "name median min max unit" rows.
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "osu_conventions.hpp"

namespace {

struct Settings {
  int runs = 7;
  long round_trips = 200'000;  // cacheline probe, per run
  long yield_round_trips = 20'000;
  long futex_round_trips = 2'000;
  double memcpy_bytes = 2e9;  // bytes copied per memcpy run
  std::vector<std::string> only;
  std::vector<int> cpus;  // the two CPUs to use; default: the first two allowed
};

// ---- two processes sharing one line ---------------------------------------------------------

struct alignas(128) SharedLine {
  std::atomic<std::uint64_t> value;  // the bounced line: parent writes odd, child even
  char pad[128 - sizeof(std::atomic<std::uint64_t>)];
};
static_assert(sizeof(SharedLine) == 128);

enum class WaitKind { Spin, Yield, Futex };

long futex(std::atomic<std::uint64_t>& word, int op, std::uint32_t val) {
  // The futex is the low 32 bits of the word (little-endian); values stay below 2^32.
  return syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), op, val, nullptr, nullptr, 0);
}

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set);
}

// Waits until `line` holds `want`. Every 2^20 polls checks that the partner still lives.
void await(std::atomic<std::uint64_t>& line, std::uint64_t want, WaitKind kind, pid_t partner) {
  for (std::uint64_t polls = 1;; ++polls) {
    const std::uint64_t seen = line.load(std::memory_order_acquire);
    if (seen == want) return;
    if (kind == WaitKind::Yield) sched_yield();
    if (kind == WaitKind::Futex) futex(line, FUTEX_WAIT, static_cast<std::uint32_t>(seen));
    if ((polls & ((1u << 20) - 1)) == 0 && partner > 0 && waitpid(partner, nullptr, WNOHANG) != 0) {
      std::fprintf(stderr, "shmdist-floor: the partner process ended early\n");
      std::exit(1);
    }
  }
}

void hand_over(std::atomic<std::uint64_t>& line, std::uint64_t value, WaitKind kind) {
  line.store(value, std::memory_order_release);
  if (kind == WaitKind::Futex) futex(line, FUTEX_WAKE, 1);
}

// Runs `runs` timed runs of `round_trips` bounces (after one untimed warm-up run of a tenth)
// between this process on cpu_a and a child on cpu_b; returns one-way ns per run.
std::vector<double> bounce(int cpu_a, int cpu_b, long round_trips, int runs, WaitKind kind) {
  void* mem = mmap(nullptr, sizeof(SharedLine), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("shmdist-floor: mmap");
    std::exit(1);
  }
  auto* shared = new (mem) SharedLine{};
  std::atomic<std::uint64_t>& line = shared->value;
  const long warmup = std::max(1L, round_trips / 10);
  const std::uint64_t total = static_cast<std::uint64_t>(warmup + round_trips * runs);
  std::fflush(stdout);
  const pid_t child = fork();
  if (child < 0) {
    std::perror("shmdist-floor: fork");
    std::exit(1);
  }
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    pin(cpu_b);
    for (std::uint64_t v = 1; v < 2 * total; v += 2) {
      await(line, v, kind, 0);
      hand_over(line, v + 1, kind);
    }
    _exit(0);
  }
  pin(cpu_a);
  std::uint64_t v = 1;
  auto bounce_n = [&](long n) {
    for (long i = 0; i < n; ++i, v += 2) {
      hand_over(line, v, kind);
      await(line, v + 1, kind, child);
    }
  };
  bounce_n(warmup);
  std::vector<double> one_way_ns;
  for (int r = 0; r < runs; ++r) {
    const double start = bench::wtime();
    bounce_n(round_trips);
    one_way_ns.push_back((bench::wtime() - start) * 1e9 / (2.0 * double(round_trips)));
  }
  waitpid(child, nullptr, 0);
  munmap(mem, sizeof(SharedLine));
  return one_way_ns;
}

// ---- memcpy ---------------------------------------------------------------------------------

std::vector<double> copy_bandwidth(std::size_t size, double bytes_per_run, int runs) {
  bench::AlignedBuffer src(size), dst(size);
  std::memset(src.data(), 0x5a, size);
  const long reps = std::max(1L, static_cast<long>(bytes_per_run / double(size)));
  // Through a volatile pointer so that the compiler cannot drop or merge the copies.
  void* (*volatile copy)(void*, const void*, std::size_t) = std::memcpy;
  copy(dst.data(), src.data(), size);  // warm the caches and the TLB
  std::vector<double> gbps;
  for (int r = 0; r < runs; ++r) {
    const double start = bench::wtime();
    for (long i = 0; i < reps; ++i) copy(dst.data(), src.data(), size);
    gbps.push_back(double(size) * double(reps) / (bench::wtime() - start) / 1e9);
  }
  if (dst.data()[size / 2] != std::byte{0x5a}) std::fprintf(stderr, "shmdist-floor: bad copy\n");
  return gbps;
}

// ---- crosscopy ------------------------------------------------------------------------------

// A child on cpu_b writes `size` bytes into a private buffer and the same into shared memory,
// then hands over through a cache line; this process, on cpu_a, times its copy of them, with
// memcpy from the shared mapping (cma false) or process_vm_readv from the child's buffer.
// Returns GB/s of the timed copies, one figure per run of `rounds` hand-overs.
std::vector<double> cross_copy(int cpu_a, int cpu_b, std::size_t size, bool cma, int runs,
                               long rounds) {
  struct Control {
    SharedLine line;
    std::atomic<std::uint64_t> address;
  };
  void* mem = mmap(nullptr, sizeof(Control) + size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("shmdist-floor: mmap");
    std::exit(1);
  }
  auto* control = new (mem) Control{};
  std::byte* shared = static_cast<std::byte*>(mem) + sizeof(Control);
  const long warmup = std::max(1L, rounds / 10);
  const std::uint64_t total = static_cast<std::uint64_t>(warmup + rounds * runs);
  std::fflush(stdout);
  const pid_t child = fork();
  if (child < 0) {
    std::perror("shmdist-floor: fork");
    std::exit(1);
  }
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    pin(cpu_b);
    bench::AlignedBuffer own(size);
    control->address.store(reinterpret_cast<std::uintptr_t>(own.data()), std::memory_order_relaxed);
    for (std::uint64_t v = 1; v < 2 * total; v += 2) {
      await(control->line.value, v - 1, WaitKind::Spin, 0);
      std::memset(own.data(), static_cast<int>(v & 0x7f), size);
      std::memset(shared, static_cast<int>(v & 0x7f), size);
      hand_over(control->line.value, v, WaitKind::Spin);
    }
    _exit(0);
  }
  pin(cpu_a);
  bench::AlignedBuffer dst(size);
  std::memset(dst.data(), 0, size);
  void* (*volatile copy)(void*, const void*, std::size_t) = std::memcpy;
  std::uint64_t v = 1;
  double copied_s = 0;
  bool ok = true;
  auto copy_n = [&](long n) {
    copied_s = 0;
    for (long i = 0; i < n; ++i, v += 2) {
      await(control->line.value, v, WaitKind::Spin, child);
      const double start = bench::wtime();
      if (cma) {
        iovec local{dst.data(), size};
        iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(
                         control->address.load(std::memory_order_relaxed))),
                     size};
        const ssize_t got = process_vm_readv(child, &local, 1, &remote, 1, 0);
        if (got != static_cast<ssize_t>(size))
          std::fprintf(stderr, "shmdist-floor: process_vm_readv read %zd of %zu bytes: %s\n", got,
                       size, std::strerror(errno));
        ok &= got == static_cast<ssize_t>(size);
      } else {
        copy(dst.data(), shared, size);
      }
      copied_s += bench::wtime() - start;
      ok &= dst.data()[size / 2] == static_cast<std::byte>(v & 0x7f);
      hand_over(control->line.value, v + 1, WaitKind::Spin);
    }
  };
  copy_n(warmup);
  std::vector<double> gbps;
  for (int r = 0; r < runs; ++r) {
    copy_n(rounds);
    gbps.push_back(double(size) * double(rounds) / copied_s / 1e9);
  }
  waitpid(child, nullptr, 0);
  munmap(mem, sizeof(Control) + size);
  if (!ok) {
    std::fprintf(stderr, "shmdist-floor: crosscopy %s: a copy failed or read stale bytes%s\n",
                 cma ? "process_vm_readv" : "memcpy",
                 cma ? " (is ptrace_scope above 1, or the call forbidden?)" : "");
    return {0.0};
  }
  return gbps;
}

// ---- output ---------------------------------------------------------------------------------

void print_probe(const std::string& name, std::vector<double> values, const char* unit) {
  std::sort(values.begin(), values.end());
  const double median = values.size() % 2
                            ? values[values.size() / 2]
                            : 0.5 * (values[values.size() / 2 - 1] + values[values.size() / 2]);
  std::printf("%-*s%*.*f%*.*f%*.*f  %s\n", 28, name.c_str(), 14, 2, median, 14, 2,
              values.front(), 14, 2, values.back(), unit);
  std::fflush(stdout);
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return {0};
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shmdist-floor: the machine's floor for shared-memory messaging "
               "(cache-line hand-off, yield and futex wake-up, single-core memcpy)"};
  Settings s;
  bool quick = false;
  app.add_flag("--quick", quick, "fewer and shorter runs (smoke tests, drift probes)");
  app.add_option("--runs", s.runs, "runs per probe; the median is reported")
      ->check(CLI::Range(1, 1000));
  app.add_option("--iterations", s.round_trips, "cacheline probe: round trips per run")
      ->check(CLI::Range(1L, 1'000'000'000L));
  app.add_option("--only", s.only,
                 "probes to run: cacheline samecore futex memcpy (default: these), crosscopy")
      ->check(CLI::IsMember({"cacheline", "samecore", "futex", "memcpy", "crosscopy"}))
      ->delimiter(',');
  app.add_option("--cpus", s.cpus, "the two CPUs for the cross-core probes (default: first two "
                                   "allowed)")
      ->expected(2)
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    s.runs = std::min(s.runs, 5);
    s.round_trips = std::min(s.round_trips, 50'000L);
    s.yield_round_trips = 5'000;
    s.futex_round_trips = 300;
    s.memcpy_bytes = 3e8;
  }
  auto wanted = [&](const char* probe) {
    return s.only.empty() || std::find(s.only.begin(), s.only.end(), probe) != s.only.end();
  };
  const std::vector<int> allowed = allowed_cpus();
  if (s.cpus.empty()) s.cpus = allowed;
  const bool two_cpus = s.cpus.size() >= 2;
  const int a = s.cpus[0], b = two_cpus ? s.cpus[1] : s.cpus[0];

  std::printf("# shmdist Floor Probe v%s\n", bench::kBenchVersion);
  std::printf("# [ cpus: %d and %d of %zu allowed ] [ runs: %d ] [ median, min, max over runs ]\n",
              a, b, allowed.size(), s.runs);
  std::printf("%-*s%*s%*s%*s  %s\n", 28, "# Probe", 14, "Median", 14, "Min", 14, "Max", "Unit");
  std::fflush(stdout);
  if (wanted("cacheline")) {
    if (two_cpus) print_probe("cacheline_one_way", bounce(a, b, s.round_trips, s.runs, WaitKind::Spin), "ns");
    else std::printf("# cacheline_one_way: skipped, only one CPU allowed\n");
  }
  if (wanted("samecore"))
    print_probe("samecore_yield_one_way",
                bounce(a, a, s.yield_round_trips, s.runs, WaitKind::Yield), "ns");
  if (wanted("futex")) {
    std::vector<double> ns = bounce(a, b, s.futex_round_trips, s.runs, WaitKind::Futex);
    for (double& x : ns) x /= 1000.0;
    print_probe("futex_wake_one_way", ns, "us");
  }
  if (wanted("memcpy")) {
    const std::pair<std::size_t, const char*> sizes[] = {
        {std::size_t{64} << 10, "memcpy_64KiB"},
        {std::size_t{1} << 20, "memcpy_1MiB"},
        {std::size_t{4} << 20, "memcpy_4MiB"}};
    for (const auto& [size, name] : sizes)
      print_probe(name, copy_bandwidth(size, s.memcpy_bytes, s.runs), "GB/s");
  }
  if (std::find(s.only.begin(), s.only.end(), "crosscopy") != s.only.end()) {
    const std::pair<std::size_t, const char*> sizes[] = {
        {std::size_t{64} << 10, "64KiB"}, {std::size_t{1} << 20, "1MiB"}, {std::size_t{4} << 20, "4MiB"}};
    for (const auto& [size, name] : sizes) {
      // About 0.2 GB written and read per run (a tenth with --quick), at least 20 hand-overs.
      const long rounds = std::max(20L, static_cast<long>((quick ? 2e7 : 2e8) / double(size)));
      const int runs = std::max(3, s.runs);
      if (!two_cpus) std::printf("# crosscopy: one CPU allowed, both sides on it\n");
      print_probe(std::string("crosscopy_memcpy_") + name, cross_copy(a, b, size, false, runs, rounds), "GB/s");
      print_probe(std::string("crosscopy_cma_") + name, cross_copy(a, b, size, true, runs, rounds), "GB/s");
    }
  }
  return 0;
}
