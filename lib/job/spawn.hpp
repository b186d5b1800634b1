// Starting one rank's process: fork, make it die with its launcher, set its environment and
// CPU binding, hand it the segment descriptor, then exec a program or run a function.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>

#include <shmdist/errors.hpp>
#include <utility>
#include <vector>

namespace shmdist::job {

struct SpawnSpec {
  std::vector<std::pair<std::string, std::string>> env;  // set in the child
  int inherit_fd = -1;        // a descriptor the child keeps (close-on-exec cleared)
  int cpu = -1;               // >= 0: bind the child to this CPU
  int stdout_fd = -1;         // >= 0: becomes the child's stdout (the write end of a pipe)
  int stderr_fd = -1;
  std::vector<int> close_fds; // descriptors the child must not keep (other ranks' pipes)
  bool new_process_group = false;  // the child leads a process group of its own
};

// The program could not be executed (not found, not executable, not a valid binary). The
// child has already been reaped. exit_code() is what a shell would return: 127 when the
// program does not exist, 126 when it exists but cannot run.
class ExecFailed : public SetupError {
 public:
  ExecFailed(const std::string& program, int error);
  int error() const { return error_; }
  int exit_code() const;

 private:
  int error_;
};

// Forks and execs `argv` (PATH lookup as execvp). The child gets SIGKILL if the launcher
// dies (prctl PR_SET_PDEATHSIG), so no rank outlives it. Returns the child's pid once the
// exec has succeeded; throws ExecFailed if it did not (reported through a close-on-exec
// pipe, so the launcher says it once instead of every rank printing it).
pid_t spawn_program(const SpawnSpec& spec, const std::vector<std::string>& argv);

// Forks and runs `body` in the child, which then _exit()s with its return value.
pid_t spawn_function(const SpawnSpec& spec, const std::function<int()>& body);

}  // namespace shmdist::job
