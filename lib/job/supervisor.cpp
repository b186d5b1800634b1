#include "job/supervisor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <dirent.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include <shmdist/errors.hpp>

#include "base/process_alive.hpp"
#include "job/diagnosis.hpp"
#include <algorithm>
#include "segment/job_state.hpp"

namespace shmdist::job {

using segment::EndKind;

namespace {
// Our children that are not ranks: orphans re-parented to us (we are a child subreaper).
// /proc/<pid>/task/<tid>/children needs CONFIG_PROC_CHILDREN, so scan /proc for our ppid.
struct Child {
  pid_t pid;
  bool zombie;  // already ended: reaped without a word
};

std::vector<Child> children_of_this_process() {
  std::vector<Child> out;
  const pid_t me = getpid();
  DIR* dir = opendir("/proc");
  if (!dir) return out;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/stat");
    std::string text;
    if (!std::getline(in, text)) continue;
    const auto close = text.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(text.c_str() + close + 1, " %c %ld", &state, &ppid) == 2 && ppid == me)
      out.push_back({static_cast<pid_t>(pid), state == 'Z' || state == 'X'});
  }
  closedir(dir);
  return out;
}
}  // namespace

int RankResult::exit_status() const {
  if (kind == EndKind::Signaled) return 128 + code;
  if (kind == EndKind::Vanished) return 1;
  return code;
}
bool RankResult::failed() const {
  return kind == EndKind::Signaled || kind == EndKind::Vanished || kind == EndKind::Threw ||
         (kind == EndKind::Exited && code != 0);
}

JobSupervisor::JobSupervisor(const segment::Segment& segment, SupervisorOptions options)
    : segment_(segment),
      options_(std::move(options)),
      watchdog_(segment, WatchdogOptions{options_.name, options_.job_timeout, options_.hang_report,
                                         options_.timeout_setting, options_.hang_report_setting,
                                         options_.handle_signals}) {}

JobSupervisor::~JobSupervisor() {
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
  for (auto& s : streams_)
    if (s.fd >= 0) close(s.fd);
  if (signal_fd_ >= 0) close(signal_fd_);
}

void JobSupervisor::install_signal_handling() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&set, sig);
  sigprocmask(SIG_BLOCK, &set, nullptr);
  signal_fd_ = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd_ < 0) throw SetupError(std::string("signalfd failed: ") + std::strerror(errno));
}

void JobSupervisor::add_rank(int rank, pid_t pid, int out_fd, int err_fd) {
  RankResult r;
  r.rank = rank;
  r.pid = pid;
  // A pidfd becomes readable when the child exits: reaping needs no SIGCHLD handler, and a
  // signal sent through it never reaches a later process that reuses the pid.
  const int pidfd = detail::open_pidfd(pid);  // close-on-exec always
  if (pidfd < 0 && errno != ESRCH) {
    adopt_unadded(pid);
    throw SetupError(std::string("pidfd_open failed: ") + std::strerror(errno));
  }
  ranks_.push_back(r);
  pidfds_.push_back(pidfd);
  if (pidfd < 0) on_status_lost(ranks_.back());  // already ended and reaped by the kernel
  for (int fd : {out_fd, err_fd}) {
    if (fd < 0) continue;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    streams_.push_back(Stream{fd, rank, fd == err_fd, {}});
  }
}

// ---- events ---------------------------------------------------------------------------------

// The exit of ranks_[i], if it has ended: reaps it and records how it ended. With
// rank_process_groups, its group is SIGKILLed first, while its zombie still holds the pid (so
// the group id cannot belong to anyone else yet).
bool JobSupervisor::reap(std::size_t i) {
  RankResult& r = ranks_[i];
  siginfo_t info{};
  int got = detail::wait_pidfd(pidfds_[i], info, WNOHANG | WNOWAIT);
  if (got == 0) return false;
  if (got > 0 && options_.rank_process_groups) kill(-r.pid, SIGKILL);
  if (got > 0) got = detail::wait_pidfd(pidfds_[i], info, WNOHANG);
  if (got > 0) on_rank_exit(r, info);
  else on_status_lost(r);
  return true;
}

// The rank's status went to someone else: take what it recorded about itself (launch()'s
// ranks record how their function ended), or count it as gone without a word.
void JobSupervisor::on_status_lost(RankResult& r) {
  const auto& rc = segment_.rank_control(r.rank);
  const auto kind = static_cast<EndKind>(rc.end_kind.load(std::memory_order_acquire));
  siginfo_t info{};
  r.status_lost = true;
  if (kind == EndKind::Exited || kind == EndKind::Threw) {
    info.si_code = CLD_EXITED;
    info.si_status = kind == EndKind::Threw ? 1 : rc.end_code.load(std::memory_order_relaxed);
  } else if (rc.state.load(std::memory_order_acquire) ==
             static_cast<std::uint32_t>(segment::RankState::Finalized)) {
    info.si_code = CLD_EXITED;  // it finalized: a clean end as far as the job is concerned
  } else {
    info.si_code = 0;  // unknown
  }
  on_rank_exit(r, info);
}

void JobSupervisor::on_rank_exit(RankResult& r, const siginfo_t& info) {
  r.ended = true;
  r.after_failure = stopping_;
  if (info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED) {
    r.kind = EndKind::Signaled;
    r.code = info.si_status;
  } else if (info.si_code == CLD_EXITED) {
    r.kind = EndKind::Exited;
    r.code = info.si_status;
  } else {
    r.kind = EndKind::Vanished;
    r.code = 0;
  }
  // The job's failure is recorded before the rank's end (below), so that ranks woken by
  // either see how the failed rank ended, not just that it is gone.
  if (r.failed()) {
    if (!stopping_) {
      first_reaped_failure_ = r.rank;
      fail_job(blamed_rank(r.rank));
    } else if (r.rank == first_failure_) {
      // Blamed before it was reaped: a peer recorded it as "gone"; now we know exactly how.
      segment::record_job_failure(segment_, r.rank, r.kind, r.code);
    }
  } else if (r.rank == first_failure_) {
    // A peer blamed this rank (it vanished while they waited), but it exited cleanly: the
    // first rank that really failed is the job's failure after all.
    first_failure_ = first_reaped_failure_;
  }
  segment::record_rank_end(segment_, r.rank, r.kind, r.code);
}

// Ranks reaped in one go are handled in rank order, not in the order they died. A rank that
// fails *because* a peer died (it caught PeerFailure and exited non-zero) would then be
// blamed when its number is lower; but such a rank learned of the death through the
// segment, where the dead peer is already recorded as the failed rank.
int JobSupervisor::blamed_rank(int failing) const {
  const int recorded = segment_.header().failed_rank.load(std::memory_order_acquire);
  if (recorded >= 0 && recorded < static_cast<int>(ranks_.size()) && recorded != failing &&
      !ranks_[recorded].ended)
    return recorded;
  return failing;
}

// The first failure: every blocked call in the job throws PeerFailure naming `rank`; ranks
// get abort_grace to notice and exit, then SIGTERM, then SIGKILL.
void JobSupervisor::fail_job(int rank) {
  stopping_ = true;
  if (rank >= 0) {
    first_failure_ = rank;
    const RankResult& r = ranks_[rank];
    segment::record_job_failure(segment_, rank, r.kind, r.code);
  } else {
    segment::record_job_abort(segment_, segment::AbortReason::Timeout);
  }
  term_at_ = Clock::now() + options_.abort_grace;
  kill_at_ = term_at_ + options_.term_grace;
}

void JobSupervisor::abort_startup() {
  segment::record_job_abort(segment_, segment::AbortReason::Startup);
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    RankResult& r = ranks_[i];
    if (r.ended) continue;
    detail::pidfd_signal(pidfds_[i], SIGKILL);
    siginfo_t info{};
    if (options_.rank_process_groups && detail::wait_pidfd(pidfds_[i], info, WNOWAIT) > 0)
      kill(-r.pid, SIGKILL);
    detail::wait_pidfd(pidfds_[i], info, 0);
    r.ended = true;
  }
  // Forked but never added: still our unreaped children, so their pids are still theirs.
  for (pid_t pid : unadded_) {
    kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  unadded_.clear();
  if (options_.end_descendants) end_left_behind();
}

void JobSupervisor::signal_live(int sig) {
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    RankResult& r = ranks_[i];
    if (r.ended) continue;
    detail::pidfd_signal(pidfds_[i], sig);
    r.stopped_with = sig;
  }
}

// Processes the ranks started and left running, re-parented to us (PR_SET_CHILD_SUBREAPER,
// set by shmrun): SIGTERM, SIGKILL after term_grace, reaped; repeated, since ending one
// re-parents its own children to us. They are our unreaped children, so their pids are theirs.
void JobSupervisor::end_left_behind() {
  for (int round = 0; round < 64; ++round) {
    std::vector<pollfd> fds;
    for (const Child& child : children_of_this_process()) {
      const pid_t pid = child.pid;
      const int fd = detail::open_pidfd(pid);
      if (fd < 0) continue;
      if (!child.zombie) {
        std::string comm;
        std::ifstream(std::string("/proc/") + std::to_string(pid) + "/comm") >> comm;
        std::fprintf(stderr, "%s: ending pid %d (%s), which a rank started and left running\n",
                     options_.name.c_str(), static_cast<int>(pid), comm.c_str());
      }
      detail::pidfd_signal(fd, SIGTERM);
      fds.push_back({fd, POLLIN, 0});
    }
    if (fds.empty()) return;
    const auto kill_at = Clock::now() + options_.term_grace;
    for (pollfd& p : fds) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kill_at - Clock::now());
      if (poll(&p, 1, static_cast<int>(std::max<long long>(0, left.count()))) <= 0)
        detail::pidfd_signal(p.fd, SIGKILL);
      siginfo_t info{};
      detail::wait_pidfd(p.fd, info, 0);
      close(p.fd);
    }
  }
}

void JobSupervisor::handle_signal() {
  signalfd_siginfo info{};
  while (read(signal_fd_, &info, sizeof info) == sizeof info) {
    const int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGUSR1) {
      print_report("SIGUSR1");
      continue;
    }
    // Interrupted: pass the signal on, then escalate like any stop.
    if (!interrupted_by_) interrupted_by_ = sig;
    stopping_ = true;
    signal_live(sig);
    term_sent_ = true;
    if (!kill_sent_) kill_at_ = Clock::now() + options_.term_grace;
  }
}

// ---- output tagging -------------------------------------------------------------------------

// A line that cannot be written (standard output on a full device, an I/O error) is not
// lost silently: the first failure on each of our two outputs is reported on stderr, later
// lines for it are discarded (the ranks' pipes are still drained, so no rank blocks on
// them), and run() returns 1 unless a rank's failure gives another status.
void JobSupervisor::emit_line(const Stream& s, const std::string& line) {
  const int fd = s.is_err ? STDERR_FILENO : STDOUT_FILENO;
  int& failed = output_errno_[s.is_err ? 1 : 0];
  if (failed) return;
  std::string out;
  out.reserve(line.size() + 8);
  out.append("[").append(std::to_string(s.rank)).append("] ").append(line);
  for (std::size_t off = 0; off < out.size();) {
    const ssize_t n = write(fd, out.data() + off, out.size() - off);
    if (n > 0) {
      off += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {  // an output someone made non-blocking: wait until it drains
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, -1);
      continue;
    }
    failed = n < 0 ? errno : EIO;
    std::fprintf(stderr,
                 "%s: cannot write rank %d's output to %s: %s; the ranks' further output to "
                 "it is discarded, the job goes on, and its exit status will not be 0\n",
                 options_.name.c_str(), s.rank,
                 s.is_err ? "standard error" : "standard output", std::strerror(failed));
    return;
  }
}

void JobSupervisor::drain_stream(Stream& s, bool final) {
  char buf[65536];
  for (;;) {
    const ssize_t n = read(s.fd, buf, sizeof buf);
    if (n > 0) {
      s.partial.append(buf, static_cast<std::size_t>(n));
      std::size_t start = 0, nl;
      while ((nl = s.partial.find('\n', start)) != std::string::npos) {
        emit_line(s, s.partial.substr(start, nl - start + 1));
        start = nl + 1;
      }
      s.partial.erase(0, start);
      // A rank that writes without newlines must not grow our buffer without bound.
      while (s.partial.size() >= kMaxTaggedLine) {
        emit_line(s, s.partial.substr(0, kMaxTaggedLine) + "\n");
        s.partial.erase(0, kMaxTaggedLine);
      }
      continue;
    }
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR) || final) {
      if (n == 0 || final) {
        if (!s.partial.empty()) emit_line(s, s.partial + "\n");
        s.partial.clear();
        if (n == 0) {
          close(s.fd);
          s.fd = -1;
        }
      }
    }
    return;
  }
}

// ---- the loop -------------------------------------------------------------------------------

int JobSupervisor::run() {
  watchdog_.start(Clock::now());
  std::size_t live = 0;
  for (const RankResult& r : ranks_) live += !r.ended;
  std::vector<pollfd> fds;
  while (live > 0) {
    fds.clear();
    for (std::size_t i = 0; i < ranks_.size(); ++i)
      fds.push_back({ranks_[i].ended ? -1 : pidfds_[i], POLLIN, 0});
    for (const Stream& s : streams_) fds.push_back({s.fd, POLLIN, 0});
    if (signal_fd_ >= 0) fds.push_back({signal_fd_, POLLIN, 0});

    auto now = Clock::now();
    Clock::time_point next = stopping_ ? Clock::time_point::max() : watchdog_.next_check();
    if (stopping_ && !term_sent_) next = std::min(next, term_at_);
    if (stopping_ && !kill_sent_) next = std::min(next, kill_at_);
    int wait_ms = -1;
    if (next != Clock::time_point::max())
      wait_ms = static_cast<int>(std::max<long long>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1));
    if (poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR)
      throw SetupError(std::string("poll failed: ") + std::strerror(errno));

    std::size_t k = 0;
    for (std::size_t i = 0; i < ranks_.size(); ++i, ++k) {
      if (ranks_[i].ended || !(fds[k].revents & (POLLIN | POLLHUP))) continue;
      if (reap(i)) --live;
    }
    for (Stream& s : streams_) {
      if (s.fd >= 0 && (fds[k].revents & (POLLIN | POLLHUP))) drain_stream(s, false);
      ++k;
    }
    if (signal_fd_ >= 0 && (fds[k].revents & POLLIN)) handle_signal();

    now = Clock::now();
    if (!stopping_ && live > 0 && watchdog_.check(now, view())) {
      timed_out_ = true;
      fail_job(-1);
    }
    if (stopping_ && !term_sent_ && now >= term_at_) {
      signal_live(SIGTERM);
      term_sent_ = true;
    }
    if (stopping_ && !kill_sent_ && now >= kill_at_) {
      signal_live(SIGKILL);
      kill_sent_ = true;
    }
  }
  for (Stream& s : streams_)
    if (s.fd >= 0) drain_stream(s, true);
  if (options_.end_descendants) end_left_behind();
  if (first_failure_ >= 0) return ranks_[first_failure_].exit_status();
  if (timed_out_) return 124;
  if (interrupted_by_) return 128 + interrupted_by_;
  for (const RankResult& r : ranks_)
    if (r.failed()) return r.exit_status();
  return output_errno_[0] || output_errno_[1] ? 1 : 0;
}

// What the supervisor knows of its ranks beyond the segment: their pids while they run, and
// how each that has ended did.
JobView JobSupervisor::view() const {
  JobView view;
  for (const RankResult& r : ranks_) {
    view.pids.push_back(r.ended ? 0 : r.pid);
    view.ended.push_back(r.ended ? segment::describe_end(r.kind, r.code) : std::string());
  }
  return view;
}

void JobSupervisor::print_report(const char* why) const { watchdog_.print_report(why, view()); }

void JobSupervisor::print_summary() const {
  const std::string& me = options_.name;
  if (first_failure_ >= 0) {
    const RankResult& f = ranks_[first_failure_];
    std::fprintf(stderr, "%s: rank %d (pid %d) %s; it failed first, so the job was stopped\n",
                 me.c_str(), f.rank, static_cast<int>(f.pid),
                 segment::describe_end(f.kind, f.code).c_str());
  } else if (timed_out_) {
    std::fprintf(stderr, "%s: the job was stopped because it exceeded its %s\n", me.c_str(),
                 options_.timeout_setting.c_str());
  } else if (interrupted_by_) {
    std::fprintf(stderr, "%s: received %s, so the job was stopped\n", me.c_str(),
                 segment::signal_name(interrupted_by_).c_str());
  } else {
    return;
  }
  std::string stopped, others;
  for (const RankResult& r : ranks_) {
    if (r.rank == first_failure_) continue;
    const std::string item = "rank " + std::to_string(r.rank);
    if (r.stopped_with && (r.kind == EndKind::Signaled && r.code == r.stopped_with))
      stopped += (stopped.empty() ? "" : ", ") + item + " (" + segment::signal_name(r.code) + ")";
    else if (r.after_failure || r.failed())
      others += (others.empty() ? "" : ", ") + item + " " + segment::describe_end(r.kind, r.code);
  }
  if (!stopped.empty()) std::fprintf(stderr, "%s: stopped: %s\n", me.c_str(), stopped.c_str());
  if (!others.empty())
    std::fprintf(stderr, "%s: ended on their own: %s\n", me.c_str(), others.c_str());
}

}  // namespace shmdist::job
