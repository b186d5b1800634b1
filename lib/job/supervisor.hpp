// Supervising a job's rank processes (shmrun and launch()): reaps them, fails fast when one
// fails (marks it in the segment so every blocked call throws PeerFailure, then SIGTERM and
// SIGKILL for the rest), enforces a job timeout with a hang report, prints SIGUSR1 reports,
// tags output lines, watches for hangs (the hang report, once per hang, without stopping the
// job), and summarises how the job ended.
//
// Ranks are signalled through pidfds (pidfd_send_signal) and reaped with waitid(P_PIDFD), so a
// recorded pid is never signalled after someone else reaped it; a status taken by someone else
// (SIGCHLD ignored by the host of launch(), a waitpid(-1) in another thread) counts as ended,
// with what the rank recorded about itself in the segment.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "job/diagnosis.hpp"
#include "job/watchdog.hpp"
#include "segment/segment.hpp"

namespace shmdist::job {

struct SupervisorOptions {
  std::string name = "shmrun";                 // prefix of the launcher's own messages
  std::chrono::milliseconds job_timeout{0};    // > 0: abort the job after this long
  std::chrono::milliseconds abort_grace{1000}; // after a failure: time to notice and exit
  std::chrono::milliseconds term_grace{2000};  // then SIGTERM, and SIGKILL after this
  bool tag_output = false;                     // prefix each output line with "[rank] "
  bool handle_signals = false;                 // SIGINT/TERM/HUP forwarded, SIGUSR1 reports
  // Print the hang report once when the job stalls this long (0: never); see job/watchdog.hpp.
  std::chrono::milliseconds hang_report{30'000};
  // How users set the job timeout and the hang report, for messages.
  std::string timeout_setting = "--timeout";
  std::string hang_report_setting = "--hang-report or SHMDIST_HANG_REPORT";
  // shmrun: this process is a child subreaper; processes the ranks left behind (orphans,
  // setsid included) are ended (SIGTERM, SIGKILL after term_grace) when the job ends.
  bool end_descendants = false;
  // launch(): each rank leads its own process group, which is SIGKILLed when the rank ends
  // (what it started and left running; setsid escapes it).
  bool rank_process_groups = false;
};

struct RankResult {
  int rank = -1;
  pid_t pid = -1;
  bool ended = false;
  segment::EndKind kind = segment::EndKind::None;
  int code = 0;             // exit code or signal number
  int stopped_with = 0;     // the last signal the launcher sent it, 0 if none
  bool after_failure = false;  // ended after the job had already failed
  bool status_lost = false;    // reaped by someone else: the status is what the rank recorded
  int exit_status() const;  // code, or 128 + signal
  bool failed() const;
};

class JobSupervisor {
 public:
  using Clock = std::chrono::steady_clock;
  JobSupervisor(const segment::Segment& segment, SupervisorOptions options);
  ~JobSupervisor();
  JobSupervisor(const JobSupervisor&) = delete;
  JobSupervisor& operator=(const JobSupervisor&) = delete;

  // Blocks SIGINT/TERM/HUP/USR1 and reads them through a signalfd (handle_signals only).
  // Call before spawning, so that children start from a known mask (spawn resets it).
  void install_signal_handling();
  // out_fd/err_fd: read ends of the rank's output pipes when tagging, else -1.
  void add_rank(int rank, pid_t pid, int out_fd = -1, int err_fd = -1);
  // Runs until every rank has ended; returns the job's exit status (0 if all exited 0; the
  // first failed rank's status; 124 after a job timeout; 128+signal if interrupted; 1 if
  // tagged output could not be written).
  int run();
  const std::vector<RankResult>& results() const { return ranks_; }
  // Startup failed (a rank could not be started): kills the ranks started so far with
  // SIGKILL and reaps them.
  void abort_startup();
  // The pid of a child that was forked but could not be added (add_rank threw): killed and
  // reaped with the others by abort_startup.
  void adopt_unadded(pid_t pid) { unadded_.push_back(pid); }
  // One summary on stderr when the job failed: which rank failed first and how, and what
  // happened to the others.
  void print_summary() const;
  // The hang report (rank states, what each waits for, ring fill levels, wait-for cycles).
  void print_report(const char* why) const;
  // Lines of a rank's tagged output longer than this are cut (the rest follows as a new line).
  static constexpr std::size_t kMaxTaggedLine = 64 * 1024;

 private:
  struct Stream {
    int fd = -1;
    int rank = -1;
    bool is_err = false;
    std::string partial;
  };
  void on_rank_exit(RankResult& r, const siginfo_t& info);
  void on_status_lost(RankResult& r);
  bool reap(std::size_t i);
  JobView view() const;
  void end_left_behind();
  int blamed_rank(int failing) const;
  void fail_job(int rank);
  void signal_live(int sig);
  void drain_stream(Stream& s, bool final);
  void emit_line(const Stream& s, const std::string& line);
  void handle_signal();

  const segment::Segment& segment_;
  SupervisorOptions options_;
  std::vector<RankResult> ranks_;
  std::vector<int> pidfds_;
  std::vector<pid_t> unadded_;
  Watchdog watchdog_;  // the job timeout and the hang report (job/watchdog.hpp)
  std::vector<Stream> streams_;
  int output_errno_[2] = {0, 0};  // why tagged output to stdout / stderr failed; 0 if it did not
  int signal_fd_ = -1;
  int first_failure_ = -1;        // the rank blamed for the job's failure
  int first_reaped_failure_ = -1; // the first failed rank in the order they were reaped
  bool timed_out_ = false;
  int interrupted_by_ = 0;
  bool stopping_ = false;  // the job is being stopped: later exits are not "first"
  Clock::time_point term_at_{}, kill_at_{};
  bool term_sent_ = false, kill_sent_ = false;
};

}  // namespace shmdist::job
