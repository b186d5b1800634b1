#include "support/shm_check.hpp"

#include <dirent.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

namespace shmdist::test {

std::set<std::string> shm_objects() {
  std::set<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("shmdist", 0) == 0) names.insert(name);
    }
    closedir(d);
  }
  return names;
}

std::set<std::string> child_processes() {
  std::set<std::string> kids;
  const std::string me = std::to_string(getpid());
  if (DIR* d = opendir("/proc")) {
    while (dirent* e = readdir(d)) {
      const std::string pid = e->d_name;
      if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream stat("/proc/" + pid + "/stat");
      std::string line;
      std::getline(stat, line);
      const auto close_paren = line.rfind(')');
      if (close_paren == std::string::npos) continue;
      // Fields after ")": state, then ppid.
      std::istringstream rest(line.substr(close_paren + 2));
      std::string state, ppid;
      rest >> state >> ppid;
      if (ppid == me) kids.insert(pid + " " + line.substr(0, close_paren + 1));
    }
    closedir(d);
  }
  return kids;
}

ShmLeakCheck::ShmLeakCheck() : before(shm_objects()) {}

ShmLeakCheck::~ShmLeakCheck() {
  // Give exiting processes a moment; then anything new is a leak.
  std::set<std::string> leaked, kids;
  for (int attempt = 0; attempt < 50; ++attempt) {
    leaked.clear();
    for (const auto& name : shm_objects())
      if (!before.count(name)) leaked.insert(name);
    kids = child_processes();
    if (leaked.empty() && kids.empty()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const auto& name : leaked) BOOST_ERROR("shared-memory object left in /dev/shm: " << name);
  for (const auto& kid : kids) BOOST_ERROR("child process left running: " << kid);
}

}  // namespace shmdist::test
