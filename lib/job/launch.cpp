// shmdist::launch: a job started from inside a program, as forked processes or as threads.

#include <cxxabi.h>
#include <fcntl.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>
#include <typeinfo>

#include <shmdist/launch.hpp>

#include "job/diagnosis.hpp"
#include "job/spawn.hpp"
#include "job/supervisor.hpp"
#include "pg/default_group.hpp"
#include "pg/env.hpp"
#include "pg/impl.hpp"
#include "segment/job_state.hpp"

namespace shmdist {
namespace {

std::string describe_exception(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    int status = 0;
    char* name = abi::__cxa_demangle(typeid(ex).name(), nullptr, nullptr, &status);
    std::string type = status == 0 && name ? name : typeid(ex).name();
    std::free(name);
    return type + ": " + ex.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// Runs one rank: joins, runs fn, destroys the group. A throw is recorded in the segment as
// this rank's failure before the group is torn down, so peers stop waiting at once.
std::string run_rank(const std::shared_ptr<segment::Segment>& seg, int rank,
                     const std::function<void(ProcessGroup&)>& fn, const LaunchOptions& options,
                     long spin_us) {
  std::optional<ProcessGroup> pg;
  try {
    pg.emplace(detail::ProcessGroupAccess::make(
        std::make_shared<ProcessGroup::Impl>(seg, rank, options.timeout, spin_us,
                                             /*supervised=*/true)));
    detail::set_thread_default(&*pg);
    fn(*pg);
    if (pg->is_initialized()) pg->destroy();
    detail::set_thread_default(nullptr);
    segment::record_rank_end(*seg, rank, segment::EndKind::Exited, 0);
    return {};
  } catch (...) {
    const std::string what = describe_exception(std::current_exception());
    // The failure first: peers woken by the rank's end must find the job already aborted.
    segment::record_job_failure(*seg, rank, segment::EndKind::Threw, 1);
    segment::record_rank_end(*seg, rank, segment::EndKind::Threw, 1);
    detail::set_thread_default(nullptr);
    pg.reset();
    return what.empty() ? "unknown error" : what;
  }
}

// SHMDIST_SPIN_US applies to launched jobs as to shmrun's (read once, in the caller).
long spin_override() {
  const auto v = env::get_int("SHMDIST_SPIN_US", 0, 1'000'000);
  return v ? static_cast<long>(*v) : -1;
}

std::uint64_t ring_size_for(int n, const LaunchOptions& options) {
  return options.ring_size ? options.ring_size : segment::default_ring_size(n);
}

std::vector<RankOutcome> launch_threads(int n, const std::function<void(ProcessGroup&)>& fn,
                                        const LaunchOptions& options) {
  auto seg = std::make_shared<segment::Segment>(
      segment::Segment::create_anonymous(n, ring_size_for(n, options)));
  seg->header().flags |= segment::kThreadMode;
  std::vector<RankOutcome> out(n);
  std::mutex mu;
  std::condition_variable cv;
  int running = n;
  const long spin_us = spin_override();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::string error = run_rank(seg, r, fn, options, spin_us);
      std::lock_guard lock(mu);
      out[r].rank = r;
      out[r].error = std::move(error);
      out[r].exit_code = out[r].error.empty() ? 0 : 1;
      --running;
      cv.notify_all();
    });
  }
  if (options.job_timeout.count() > 0) {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, options.job_timeout, [&] { return running == 0; })) {
      job::print_hang_report(*seg, std::cerr, "shmdist::launch", "timeout");
      segment::record_job_abort(*seg, segment::AbortReason::Timeout);
    }
  }
  for (auto& t : threads) t.join();
  return out;
}

std::vector<RankOutcome> launch_processes(int n, const std::function<void(ProcessGroup&)>& fn,
                                          const LaunchOptions& options) {
  auto seg = std::make_shared<segment::Segment>(
      segment::Segment::create_anonymous(n, ring_size_for(n, options)));
  job::SupervisorOptions sup_options;
  sup_options.name = "shmdist::launch";
  sup_options.job_timeout = options.job_timeout;
  sup_options.term_grace = options.grace;
  job::JobSupervisor supervisor(*seg, sup_options);
  std::vector<int> error_pipes(n, -1);
  const long spin_us = spin_override();
  for (int r = 0; r < n; ++r) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) throw SetupError("pipe2 failed");
    error_pipes[r] = p[0];
    job::SpawnSpec spec;
    spec.rank = r;
    const pid_t pid = job::spawn_function(spec, [&, r, w = p[1]] {
      const std::string error = run_rank(seg, r, fn, options, spin_us);
      if (!error.empty()) {
        [[maybe_unused]] auto n_written = write(w, error.data(), error.size());
      }
      return error.empty() ? 0 : 1;
    });
    close(p[1]);
    supervisor.add_rank(r, pid);
  }
  supervisor.run();
  std::vector<RankOutcome> out(n);
  for (int r = 0; r < n; ++r) {
    const job::RankResult& res = supervisor.results()[r];
    out[r].rank = r;
    if (res.kind == segment::EndKind::Signaled) out[r].signal = res.code;
    else out[r].exit_code = res.code;
    char buf[4096];
    ssize_t got;
    while ((got = read(error_pipes[r], buf, sizeof buf)) > 0)
      out[r].error.append(buf, static_cast<std::size_t>(got));
    close(error_pipes[r]);
  }
  return out;
}

}  // namespace

std::vector<RankOutcome> launch(int n, const std::function<void(ProcessGroup&)>& fn,
                                const LaunchOptions& options) {
  if (n < 1 || n > segment::kMaxWorldSize)
    throw InvalidArgument("launch: expected 1 to " + std::to_string(segment::kMaxWorldSize) +
                          " ranks, got " + std::to_string(n));
  if (!fn) throw InvalidArgument("launch: the rank function is empty");
  if (options.ring_size) segment::check_ring_size(options.ring_size, "LaunchOptions::ring_size");
  return options.mode == LaunchOptions::Mode::Threads ? launch_threads(n, fn, options)
                                                      : launch_processes(n, fn, options);
}

}  // namespace shmdist
