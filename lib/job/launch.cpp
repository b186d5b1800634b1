// shmdist::launch: a job started from inside a program, as forked processes or as threads.

#include <cxxabi.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <typeinfo>

#include <shmdist/launch.hpp>

#include "base/config.hpp"
#include "job/diagnosis.hpp"
#include "job/progress.hpp"
#include "job/spawn.hpp"
#include "job/supervisor.hpp"
#include "job/watchdog.hpp"
#include "pg/default_group.hpp"
#include "pg/impl.hpp"
#include "bootstrap/rendezvous.hpp"
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

std::uint64_t ring_size_for(int n, const LaunchOptions& options) {
  return options.ring_size ? options.ring_size : segment::default_ring_size(n);
}

// Initializing again after destroy_process_group (issue 27.11), as under shmrun: once every
// rank destroyed its group, each rank that calls init_process_group gets its rank's group in
// a fresh job among the same ranks (new groups, collective counts from zero). The launch's
// own segment keeps serving the launcher (outcomes, job timeout, hang report); the k-th later
// job meets elsewhere, and every rank counts k alike (a rank initializes again only after
// destroy, which waits for every rank):
// - threads: on an anonymous segment that the first rank to reach join k makes, shared with
//   the others through this object (one per launch);
// - processes: on a named segment through the rendezvous (bootstrap/rendezvous.hpp), named after the
//   launch segment's random job key and k, as shmrun's ranks do. The ranks then watch each
//   other's processes; the launcher still reaps them and fails the job when one fails.
// A rank whose rank function ended (in the launch's segment) never comes: the others fail at
// once instead of waiting out the timeout; so they do when the job was aborted.
class Rejoins {
 public:
  Rejoins(std::shared_ptr<segment::Segment> first, const LaunchOptions& options,
          const config::Config& config, bool threads)
      : first_(std::move(first)), n_(first_->world_size()), config_(config), threads_(threads) {
    config_.ring_size = ring_size_for(n_, options);
  }

  std::shared_ptr<ProcessGroup::Impl> join(int rank, int number, const InitOptions& options) {
    const std::string who = "init_process_group on rank " + std::to_string(rank);
    if ((options.rank >= 0 && options.rank != rank) ||
        (options.world_size >= 0 && options.world_size != n_))
      throw InvalidArgument(who + ": InitOptions asks for rank " + std::to_string(options.rank) +
                            " of " + std::to_string(options.world_size) + ", but this is rank " +
                            std::to_string(rank) + " of the " + std::to_string(n_) +
                            " that launch() started; leave InitOptions::rank and world_size "
                            "at -1");
    if (options.timeout.count() <= 0)
      throw InvalidArgument("InitOptions::timeout must be positive, got " +
                            std::to_string(options.timeout.count()) + " ms");
    check_job(rank, number);
    if (!threads_) {
      const std::string job_id =
          "launch:" + segment::format_job_key(first_->header().job_key) + "/join " +
          std::to_string(number);
      return std::make_shared<ProcessGroup::Impl>(detail::join_by_rendezvous(
          rank, n_, job_id, options, config_, {}, {}, [&] { check_job(rank, number); }));
    }
    std::shared_ptr<segment::Segment> seg;
    {
      std::lock_guard lock(mu_);
      auto& slot = segments_[number];
      if (!slot) {
        slot = std::make_shared<segment::Segment>(
            segment::Segment::create_anonymous(n_, *config_.ring_size));
        slot->header().flags |= segment::kThreadMode | segment::kStartedByLaunch;
      }
      seg = slot;
    }
    auto impl = std::make_shared<ProcessGroup::Impl>(
        detail::attach_world(seg, rank, options.timeout, config_, /*supervised=*/true));
    // Wait for the full set, as the rendezvous does: attached counts only up, and its
    // acquire pairs with each rank's acq_rel increment after it set up its slot.
    const auto deadline = std::chrono::steady_clock::now() + options.timeout;
    while (seg->header().attached.load(std::memory_order_acquire) <
           static_cast<std::uint32_t>(n_)) {
      check_job(rank, number);
      if (std::chrono::steady_clock::now() >= deadline)
        throw SetupError(who + " (join " + std::to_string(number) + " after destroy): only " +
                         std::to_string(seg->header().attached.load()) + " of " +
                         std::to_string(n_) + " ranks initialized again within the timeout of " +
                         std::to_string(options.timeout.count()) +
                         " ms; every rank must destroy and initialize its group alike");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return impl;
  }

  // The launcher's job timeout: the later jobs' ranks must stop too (thread mode; processes
  // are stopped by signals).
  void abort_all(segment::AbortReason reason) {
    std::lock_guard lock(mu_);
    for (auto& [number, seg] : segments_) segment::record_job_abort(*seg, reason);
  }

 private:
  // Throws if the job of `number` cannot form: the launch's job was aborted, or another rank's
  // rank function ended (the launcher records it with a release store of end_kind, paired
  // with this acquire load).
  void check_job(int rank, int number) const {
    if (first_->header().job_state.load(std::memory_order_acquire) ==
        static_cast<std::uint32_t>(segment::JobState::Aborted))
      throw PeerFailure("init_process_group on rank " + std::to_string(rank) + " (join " +
                        std::to_string(number) + " after destroy): " +
                        segment::describe_job_failure(*first_));
    for (int r = 0; r < n_; ++r) {
      if (r == rank) continue;
      if (first_->rank_control(r).end_kind.load(std::memory_order_acquire) ==
          static_cast<std::uint32_t>(segment::EndKind::None))
        continue;
      throw SetupError(
          "init_process_group on rank " + std::to_string(rank) + " after destroy_process_group "
          "(join " + std::to_string(number) + "): rank " + std::to_string(r) +
          " will not initialize again: its rank function already ended (" +
          segment::describe_rank_end(*first_, r) + "). Every rank of a launch() job must "
          "initialize again after destroy, or none");
    }
  }

  std::shared_ptr<segment::Segment> first_;
  int n_;
  config::Config config_;
  bool threads_;
  std::mutex mu_;
  std::map<int, std::shared_ptr<segment::Segment>> segments_;
};

// Runs one rank: joins, runs fn, destroys the group. A throw is recorded in the segment as
// this rank's failure before the group is torn down, so peers stop waiting at once. A rank
// that initialized again after destroy (Rejoins) is in a later job's segment: its failure is
// recorded there too, so its peers there stop as well.
std::string run_rank(const std::shared_ptr<segment::Segment>& seg, int rank,
                     const std::function<void(ProcessGroup&)>& fn, const LaunchOptions& options,
                     const config::Config& config, Rejoins& rejoins) {
  std::optional<ProcessGroup> pg;
  auto current_segment = [&]() -> std::shared_ptr<segment::Segment> {
    const ProcessGroup::Impl* impl =
        pg ? detail::ProcessGroupAccess::impl_or_null(*pg) : nullptr;
    return impl && impl->segment != seg ? impl->segment : nullptr;
  };
  try {
    pg.emplace(detail::ProcessGroupAccess::make(std::make_shared<ProcessGroup::Impl>(
        detail::attach_world(seg, rank, options.timeout, config, /*supervised=*/true))));
    detail::set_thread_default(&*pg);
    int joins = 0;
    detail::set_thread_rejoin([&rejoins, rank, joins](const InitOptions& init) mutable {
      return rejoins.join(rank, ++joins, init);
    });
    fn(*pg);
    if (pg->is_initialized()) pg->destroy();
    detail::set_thread_rejoin({});
    detail::set_thread_default(nullptr);
    segment::record_rank_end(*seg, rank, segment::EndKind::Exited, 0);
    return {};
  } catch (...) {
    const std::string what = describe_exception(std::current_exception());
    // The failure first: peers woken by the rank's end must find the job already aborted.
    // A rank that throws because the job was aborted already (a peer failed, the job timed
    // out) is not the job's failure: recording it would hide the real cause from the others.
    auto record = [&](const segment::Segment& s) {
      const bool aborted_already = s.header().job_state.load(std::memory_order_acquire) ==
                                   static_cast<std::uint32_t>(segment::JobState::Aborted);
      if (!aborted_already) segment::record_job_failure(s, rank, segment::EndKind::Threw, 1);
      segment::record_rank_end(s, rank, segment::EndKind::Threw, 1);
    };
    // The launch's segment first: a peer in the later job, woken by the record there, must
    // find this failure in the launch's segment already when it fails in turn.
    const auto later = current_segment();
    record(*seg);
    if (later) record(*later);
    detail::set_thread_rejoin({});
    detail::set_thread_default(nullptr);
    pg.reset();
    return what.empty() ? "unknown error" : what;
  }
}

// The watchdog of a launch() job, in either mode. Its hang report: LaunchOptions::hang_report,
// else SHMDIST_HANG_REPORT, else 30 s.
job::WatchdogOptions watchdog_options(const LaunchOptions& options, const config::Config& config) {
  job::WatchdogOptions w;
  w.name = "shmdist::launch";
  w.job_timeout = options.job_timeout;
  w.hang_report = options.hang_report ? *options.hang_report
                                      : config.hang_report.value_or(std::chrono::seconds(30));
  w.timeout_setting = "LaunchOptions::job_timeout";
  w.hang_report_setting = "LaunchOptions::hang_report or SHMDIST_HANG_REPORT";
  return w;
}

std::vector<RankOutcome> launch_threads(int n, const std::function<void(ProcessGroup&)>& fn,
                                        const LaunchOptions& options) {
  // The SHMDIST_* variables apply to launched jobs as to shmrun's (read once, here).
  const config::Config config = config::from_environment();
  auto seg = std::make_shared<segment::Segment>(
      segment::Segment::create_anonymous(n, ring_size_for(n, options)));
  seg->header().flags |= segment::kThreadMode | segment::kStartedByLaunch;
  Rejoins rejoins(seg, options, config, /*threads=*/true);
  std::vector<RankOutcome> out(n);
  std::mutex mu;
  std::condition_variable cv;
  int running = n;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::string error = run_rank(seg, r, fn, options, config, rejoins);
      std::lock_guard lock(mu);
      out[r].rank = r;
      out[r].error = std::move(error);
      out[r].exit_code = out[r].error.empty() ? 0 : 1;
      --running;
      cv.notify_all();
    });
  }
  // The job timeout and the hang report: the watchdog JobSupervisor runs for processes.
  job::Watchdog watchdog(*seg, watchdog_options(options, config));
  watchdog.start(std::chrono::steady_clock::now());
  const job::JobView ranks;  // threads: no pids of their own; how they end is in the segment
  {
    std::unique_lock lock(mu);
    const auto ended = [&] { return running == 0; };
    while (running > 0) {
      const auto wake = watchdog.next_check();
      if (wake == std::chrono::steady_clock::time_point::max()) {
        cv.wait(lock, ended);
        break;
      }
      if (cv.wait_until(lock, wake, ended)) break;
      lock.unlock();
      const bool timed_out = watchdog.check(std::chrono::steady_clock::now(), ranks);
      // Every blocked call of the job throws (the ranks then end, and are joined below),
      // also in a job the ranks formed again after destroy.
      if (timed_out) {
        segment::record_job_abort(*seg, segment::AbortReason::Timeout);
        rejoins.abort_all(segment::AbortReason::Timeout);
      }
      lock.lock();
      if (timed_out) break;
    }
  }
  for (auto& t : threads) t.join();
  return out;
}

std::vector<RankOutcome> launch_processes(int n, const std::function<void(ProcessGroup&)>& fn,
                                          const LaunchOptions& options) {
  const config::Config config = config::from_environment();
  auto seg = std::make_shared<segment::Segment>(
      segment::Segment::create_anonymous(n, ring_size_for(n, options)));
  seg->header().flags |= segment::kStartedByLaunch;
  const job::WatchdogOptions watch = watchdog_options(options, config);
  Rejoins rejoins(seg, options, config, /*threads=*/false);
  job::SupervisorOptions sup_options;
  sup_options.name = watch.name;
  sup_options.job_timeout = watch.job_timeout;
  sup_options.term_grace = options.grace;
  sup_options.hang_report = watch.hang_report;
  sup_options.rank_process_groups = true;
  sup_options.timeout_setting = watch.timeout_setting;
  sup_options.hang_report_setting = watch.hang_report_setting;
  job::JobSupervisor supervisor(*seg, sup_options);
  std::vector<int> error_pipes(n, -1);
  auto close_error_pipes = [&] {
    for (int& fd : error_pipes)
      if (fd >= 0) close(std::exchange(fd, -1));
  };
  try {
    for (int r = 0; r < n; ++r) {
      int p[2];
      if (pipe2(p, O_CLOEXEC) != 0)
        throw SetupError(std::string("launch: cannot create a pipe for rank ") +
                         std::to_string(r) + ": " + std::strerror(errno));
      error_pipes[r] = p[0];
      job::SpawnSpec spec;
      spec.new_process_group = true;
      pid_t pid = -1;
      try {
        pid = job::spawn_function(spec, [&, r, w = p[1]] {
          const std::string error = run_rank(seg, r, fn, options, config, rejoins);
          if (!error.empty()) {
            [[maybe_unused]] auto n_written = write(w, error.data(), error.size());
          }
          return error.empty() ? 0 : 1;
        });
      } catch (...) {
        close(p[1]);
        throw;
      }
      close(p[1]);
      supervisor.add_rank(r, pid);
    }
  } catch (...) {
    // Ranks already started are stopped and reaped, and no descriptor is left open.
    supervisor.abort_startup();
    close_error_pipes();
    throw;
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
  if (options.ring_size) config::check_ring_size(options.ring_size, "LaunchOptions::ring_size");
  // As InitOptions::timeout is checked: a group timeout must be positive.
  if (options.timeout.count() <= 0)
    throw InvalidArgument("LaunchOptions::timeout must be positive, got " +
                          std::to_string(options.timeout.count()) +
                          " ms (it is each group's timeout; use job_timeout for the whole job)");
  if (options.job_timeout.count() < 0)
    throw InvalidArgument("LaunchOptions::job_timeout must be 0 (no limit) or positive, got " +
                          std::to_string(options.job_timeout.count()) + " ms");
  if (options.grace.count() < 0)
    throw InvalidArgument("LaunchOptions::grace must not be negative, got " +
                          std::to_string(options.grace.count()) + " ms");
  if (options.hang_report && options.hang_report->count() < 0)
    throw InvalidArgument("LaunchOptions::hang_report must be 0 (off) or positive, got " +
                          std::to_string(options.hang_report->count()) + " ms");
  return options.mode == LaunchOptions::Mode::Threads ? launch_threads(n, fn, options)
                                                      : launch_processes(n, fn, options);
}

}  // namespace shmdist
