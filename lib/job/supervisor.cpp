#include "job/supervisor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include <shmdist/errors.hpp>

#include "job/diagnosis.hpp"
#include "segment/job_state.hpp"

namespace shmdist::job {

using Clock = std::chrono::steady_clock;
using segment::EndKind;

int RankResult::exit_status() const { return kind == EndKind::Signaled ? 128 + code : code; }
bool RankResult::failed() const {
  return kind == EndKind::Signaled || (kind == EndKind::Exited && code != 0);
}

JobSupervisor::JobSupervisor(const segment::Segment& segment, SupervisorOptions options)
    : segment_(segment), options_(std::move(options)) {}

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
  ranks_.push_back(r);
  // A pidfd becomes readable when the child exits: reaping needs no SIGCHLD handler.
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) throw SetupError(std::string("pidfd_open failed: ") + std::strerror(errno));
  fcntl(pidfd, F_SETFD, FD_CLOEXEC);
  pidfds_.push_back(pidfd);
  for (int fd : {out_fd, err_fd}) {
    if (fd < 0) continue;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    streams_.push_back(Stream{fd, rank, fd == err_fd, {}});
  }
}

// ---- events ---------------------------------------------------------------------------------

void JobSupervisor::on_rank_exit(RankResult& r, int status) {
  r.ended = true;
  r.after_failure = stopping_;
  if (WIFSIGNALED(status)) {
    r.kind = EndKind::Signaled;
    r.code = WTERMSIG(status);
  } else {
    r.kind = EndKind::Exited;
    r.code = WEXITSTATUS(status);
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
    kill(r.pid, SIGKILL);
    int status = 0;
    while (waitpid(r.pid, &status, 0) < 0 && errno == EINTR) {
    }
    r.ended = true;
  }
}

void JobSupervisor::signal_live(int sig) {
  for (RankResult& r : ranks_) {
    if (r.ended) continue;
    kill(r.pid, sig);
    r.stopped_with = sig;
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

void JobSupervisor::emit_line(const Stream& s, const std::string& line) const {
  std::string out;
  out.reserve(line.size() + 8);
  out.append("[").append(std::to_string(s.rank)).append("] ").append(line);
  const int fd = s.is_err ? STDERR_FILENO : STDOUT_FILENO;
  for (std::size_t off = 0; off < out.size();) {
    const ssize_t n = write(fd, out.data() + off, out.size() - off);
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
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
  const auto started = Clock::now();
  const auto job_deadline = options_.job_timeout.count() > 0 ? started + options_.job_timeout
                                                             : Clock::time_point::max();
  std::size_t live = ranks_.size();
  std::vector<pollfd> fds;
  while (live > 0) {
    fds.clear();
    for (std::size_t i = 0; i < ranks_.size(); ++i)
      fds.push_back({ranks_[i].ended ? -1 : pidfds_[i], POLLIN, 0});
    for (const Stream& s : streams_) fds.push_back({s.fd, POLLIN, 0});
    if (signal_fd_ >= 0) fds.push_back({signal_fd_, POLLIN, 0});

    auto now = Clock::now();
    Clock::time_point next = job_deadline;
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
      int status = 0;
      if (waitpid(ranks_[i].pid, &status, WNOHANG) == ranks_[i].pid) {
        on_rank_exit(ranks_[i], status);
        --live;
      }
    }
    for (Stream& s : streams_) {
      if (s.fd >= 0 && (fds[k].revents & (POLLIN | POLLHUP))) drain_stream(s, false);
      ++k;
    }
    if (signal_fd_ >= 0 && (fds[k].revents & POLLIN)) handle_signal();

    now = Clock::now();
    if (!stopping_ && now >= job_deadline) {
      timed_out_ = true;
      std::fprintf(stderr, "%s: the job did not finish within its --timeout of %lld ms\n",
                   options_.name.c_str(), static_cast<long long>(options_.job_timeout.count()));
      print_report("timeout");
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
  if (first_failure_ >= 0) return ranks_[first_failure_].exit_status();
  if (timed_out_) return 124;
  if (interrupted_by_) return 128 + interrupted_by_;
  for (const RankResult& r : ranks_)
    if (r.failed()) return r.exit_status();
  return 0;
}

void JobSupervisor::print_report(const char* why) const {
  print_hang_report(segment_, std::cerr, options_.name, why);
}

void JobSupervisor::print_summary() const {
  const std::string& me = options_.name;
  if (first_failure_ >= 0) {
    const RankResult& f = ranks_[first_failure_];
    std::fprintf(stderr, "%s: rank %d (pid %d) %s; it failed first, so the job was stopped\n",
                 me.c_str(), f.rank, static_cast<int>(f.pid),
                 segment::describe_end(f.kind, f.code).c_str());
  } else if (timed_out_) {
    std::fprintf(stderr, "%s: the job was stopped because it exceeded its --timeout\n",
                 me.c_str());
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
