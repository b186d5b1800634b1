// Running a command (shmrun, an example) as a child process with a time limit, capturing its
// output. The child is killed by pid (never by name) if it overruns, and always reaped.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace shmdist::test {

struct CommandResult {
  int exit_code = -1;   // exit status, or 128 + signal
  int signal = 0;       // the signal that ended it, else 0
  bool timed_out = false;
  std::string out;      // stdout
  std::string err;      // stderr
  std::chrono::milliseconds elapsed{0};
};

struct CommandOptions {
  std::chrono::milliseconds timeout{60'000};
  std::vector<std::pair<std::string, std::string>> env;  // added to (or replacing) ours
  std::vector<std::string> unset_env;                    // removed from the child's environment
  // When set, the child's standard output goes to this file (such as /dev/full) instead of
  // being captured in CommandResult::out.
  std::string stdout_path;
  // Called with the child's pid once it runs (e.g. to kill it mid-job); may be empty.
  std::function<void(pid_t)> on_start;
};

CommandResult run_command(const std::vector<std::string>& argv, const CommandOptions& options = {});

// Paths of built programs, from compile definitions (see tests/CMakeLists.txt).
std::string shmrun_path();
std::string examples_dir();
std::string test_programs_dir();

}  // namespace shmdist::test
