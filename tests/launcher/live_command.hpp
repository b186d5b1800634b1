// Watching a command while it runs: start it, read its output as it comes, act on what it
// says (kill one of its ranks, send it SIGUSR1), then wait for it with a time limit.
// run_command (support/process.hpp) runs a command to completion; this is its live sibling.
//
// Rules kept here: a process is only ever signalled by the pid this object started (or a pid
// the caller read from its own test program's output); every child is reaped; nothing is
// killed by name.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "support/process.hpp"

namespace shmdist::test {

class LiveCommand {
 public:
  // Starts argv[0] (PATH lookup) with our environment, minus options.unset_env, plus
  // options.env. Descriptors without close-on-exec are inherited (to pass a crafted fd).
  explicit LiveCommand(const std::vector<std::string>& argv, const CommandOptions& options = {});
  ~LiveCommand();  // SIGKILLs the child if it still runs, and reaps it
  LiveCommand(const LiveCommand&) = delete;
  LiveCommand& operator=(const LiveCommand&) = delete;

  pid_t pid() const { return pid_; }
  bool exited() const { return exited_; }
  // Reads output and notices the exit until pred() holds or `timeout` passes; returns pred().
  bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout);
  // Waits for the exit (SIGKILL after `timeout`) and for the end of its output.
  CommandResult finish(std::chrono::milliseconds timeout);
  // Sends `sig` to the child, unless it has been reaped already.
  void signal(int sig);

  const std::string& out() const { return result_.out; }
  const std::string& err() const { return result_.err; }
  // When the exit was noticed (steady clock), once exited().
  std::chrono::steady_clock::time_point exited_at() const { return exited_at_; }

 private:
  void pump(int wait_ms);
  pid_t pid_ = -1;
  int pidfd_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  bool exited_ = false;
  std::chrono::steady_clock::time_point started_, exited_at_;
  CommandResult result_;
};

// The lines of `text` that start with `key` followed by a space ("READY rank=0 ...").
std::vector<std::string> lines_starting(const std::string& text, const std::string& key);
// The "name=value" fields of such a line; "what=" takes the rest of the line.
std::map<std::string, std::string> fields_of(const std::string& line);
// The same clock the test programs print (report.hpp): CLOCK_MONOTONIC in nanoseconds.
std::int64_t steady_ns();
// Whether `pid` is a live process (not gone, not a zombie).
bool process_running(pid_t pid);
// Makes this process the reaper of orphaned descendants (a rank whose launcher died is
// re-parented to us, so a test can reap it and leak checks see it). Idempotent.
void become_subreaper();
// Waits for a child of ours (e.g. an orphaned rank re-parented to us) to end; reaps it.
// Returns its wait status, or nullopt if it did not end within `timeout`.
std::optional<int> reap_within(pid_t pid, std::chrono::milliseconds timeout);

}  // namespace shmdist::test
