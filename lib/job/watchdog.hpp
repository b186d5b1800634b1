// The job watchdog, one for shmrun's supervisor (processes) and launch()'s thread mode: the
// job timeout, and the hang report (job/progress.hpp decides when a job looks hung; the report
// is job/diagnosis.hpp's). Its owner waits for its ranks until next_check(), then calls
// check(); the watchdog never stops a job itself, it says when the job timeout has passed.
#pragma once

#include <chrono>
#include <string>

#include "job/diagnosis.hpp"
#include "job/progress.hpp"
#include "segment/segment.hpp"

namespace shmdist::job {

struct WatchdogOptions {
  std::string name = "shmrun";               // prefix of its messages
  std::chrono::milliseconds job_timeout{0};  // > 0: the job's time limit
  std::chrono::milliseconds hang_report{0};  // > 0: report a stall this long, once
  // How users set the two, for messages.
  std::string timeout_setting = "--timeout";
  std::string hang_report_setting = "--hang-report or SHMDIST_HANG_REPORT";
  bool sigusr1_reports = false;  // the owner prints the report on SIGUSR1 (shmrun)
};

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  Watchdog(const segment::Segment& segment, WatchdogOptions options);

  // The job starts now: its time limit counts from here.
  void start(Clock::time_point now);
  // When check() next has something to do: the next progress sample or the job's time limit,
  // whichever is first (Clock::time_point::max(): never).
  Clock::time_point next_check() const;
  // Call while the job runs and is not being stopped, whenever woken. Samples the job's
  // progress a few times per hang_report interval and reports a stall once (the job keeps
  // running; when a rank moves again, the next stall is reported too). Returns true, once,
  // when the job timeout has passed, after saying so with the report: the caller stops the job.
  // `ranks`: what the owner knows beyond the segment (processes: pids and how each ended;
  // threads: nothing).
  bool check(Clock::time_point now, const JobView& ranks);
  // The hang report, `why` in its title ("timeout", "no progress", "SIGUSR1"), with how long
  // each rank has not moved once the watchdog has seen that.
  void print_report(const char* why, const JobView& ranks) const;

 private:
  const segment::Segment& segment_;
  WatchdogOptions options_;
  Clock::time_point deadline_ = Clock::time_point::max();
  Clock::time_point next_sample_ = Clock::time_point::max();
  ProgressTracker tracker_;
  bool hang_reported_ = false;  // this stall was reported; reset when something moves
};

}  // namespace shmdist::job
