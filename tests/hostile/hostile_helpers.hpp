// Shared by the hostile tests: the pids a test program printed, and checking they are gone.
#pragma once

#include <signal.h>

#include <string>
#include <vector>

#include "launcher/shmrun_helpers.hpp"

namespace shmdist::test {

// The pid= fields of the lines starting with `key`.
inline std::vector<pid_t> pids_on(const std::string& out, const std::string& key) {
  std::vector<pid_t> pids;
  for (const auto& line : lines_starting(out, key)) pids.push_back(std::stoi(fields_of(line)["pid"]));
  return pids;
}

}  // namespace shmdist::test
