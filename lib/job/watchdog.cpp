#include "job/watchdog.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <vector>

namespace shmdist::job {

Watchdog::Watchdog(const segment::Segment& segment, WatchdogOptions options)
    : segment_(segment), options_(std::move(options)) {}

void Watchdog::start(Clock::time_point now) {
  deadline_ = options_.job_timeout.count() > 0 ? now + options_.job_timeout
                                               : Clock::time_point::max();
  next_sample_ = options_.hang_report.count() > 0 ? now : Clock::time_point::max();
}

Watchdog::Clock::time_point Watchdog::next_check() const {
  return std::min(deadline_, next_sample_);
}

bool Watchdog::check(Clock::time_point now, const JobView& ranks) {
  if (now >= next_sample_) {
    // A few samples per interval: a stall is seen within a quarter of it.
    next_sample_ = now + std::clamp(options_.hang_report / 4, std::chrono::milliseconds(10),
                                    std::chrono::milliseconds(1000));
    std::vector<bool> ended(ranks.ended.size());
    for (std::size_t r = 0; r < ended.size(); ++r) ended[r] = !ranks.ended[r].empty();
    tracker_.observe(sample_progress(segment_, ranks.pids), now);
    bool moved = false;
    for (int r = 0; r < tracker_.world(); ++r) moved |= tracker_.moved_last(r);
    if (moved) hang_reported_ = false;
    if (!hang_reported_) {
      const std::string verdict =
          hang_verdict(segment_, tracker_, ended, now, options_.hang_report);
      if (!verdict.empty()) {
        hang_reported_ = true;
        const auto secs = static_cast<double>(options_.hang_report.count()) / 1000.0;
        std::fprintf(stderr,
                     "%s: the job looks hung: %s for %g s (the job keeps running; %s%s sets the "
                     "interval, 0 switches it off)\n",
                     options_.name.c_str(), verdict.c_str(), secs,
                     options_.sigusr1_reports ? "SIGUSR1 prints this again; " : "",
                     options_.hang_report_setting.c_str());
        print_report("no progress", ranks);
      }
    }
  }
  if (now < deadline_) return false;
  deadline_ = Clock::time_point::max();
  std::fprintf(stderr, "%s: the job did not finish within its %s of %lld ms\n",
               options_.name.c_str(), options_.timeout_setting.c_str(),
               static_cast<long long>(options_.job_timeout.count()));
  print_report("timeout", ranks);
  return true;
}

void Watchdog::print_report(const char* why, const JobView& ranks) const {
  JobView view = ranks;
  view.tracker = tracker_.observed_twice() ? &tracker_ : nullptr;
  print_hang_report(segment_, std::cerr, options_.name, why, &view);
}

}  // namespace shmdist::job
