// Running shmrun and the test programs (tests/programs) from the launcher and fault tests.
#pragma once

#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "launcher/live_command.hpp"
#include "support/process.hpp"
#include "support/shm_check.hpp"

namespace shmdist::test {

// The path of a test program built from tests/programs ("fault_rank" -> .../shmdist_fault_rank).
inline std::string program(const std::string& name) {
  return test_programs_dir() + "/shmdist_" + name;
}

// {shmrun, args...}
inline std::vector<std::string> shmrun(std::vector<std::string> args) {
  args.insert(args.begin(), shmrun_path());
  return args;
}

// Variables that would make a program join some other job than the one a test sets up.
inline std::vector<std::string> launch_variables() {
  return {"SHMDIST_SEGMENT_FD", "SHMDIST_SEGMENT", "SHMDIST_JOB_KEY", "SHMDIST_RING_SIZE",
          "SHMDIST_SPIN_US", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
          "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
          "PMI_RANK", "PMI_SIZE",
          // folded into the identity of torchrun-style jobs (lib/bootstrap/join.cpp, run_nonce)
          "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "PBS_JOBID", "LSB_JOBID",
          "FLUX_JOB_ID"};
}

// Options for a command started with a clean launch environment.
inline CommandOptions clean_options(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  CommandOptions o;
  o.timeout = timeout;
  o.unset_env = launch_variables();
  return o;
}

// Number of (non-overlapping) occurrences of `needle` in `text`.
inline int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (std::size_t pos = text.find(needle); pos != std::string::npos;
       pos = text.find(needle, pos + needle.size()))
    ++n;
  return n;
}

// Whether, at some moment within `patience`, /dev/shm holds no object of this process's jobs
// (shm_objects()) that was not in `before`: the patience is for processes still exiting.
inline bool no_new_shm_objects(const std::set<std::string>& before,
                               std::chrono::milliseconds patience = std::chrono::seconds(1)) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  for (;;) {
    bool fresh = false;
    for (const auto& name : shm_objects()) fresh |= before.count(name) == 0;
    if (!fresh) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

inline bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

}  // namespace shmdist::test
