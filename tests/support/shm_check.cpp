#include "support/shm_check.hpp"

#include <dirent.h>
#include <sys/random.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace shmdist::test {

const std::string& own_shm_tag() {
  static const std::string tag = [] {
    std::uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != static_cast<ssize_t>(sizeof r))
      r = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    char buf[48];
    std::snprintf(buf, sizeof buf, "t%d_%016llx", static_cast<int>(getpid()),
                  static_cast<unsigned long long>(r));
    setenv("SHMDIST_SHM_TAG", buf, 1);
    return std::string(buf);
  }();
  return tag;
}

namespace {
// Before main(), so that no job of this process, however a test starts it, lacks the tag (and
// while the process has one thread: setenv is not safe beside other threads' getenv).
const bool tagged_before_main = !own_shm_tag().empty();
}  // namespace

std::string own_shm_prefix() {
  return "shmdist-" + std::to_string(getuid()) + "-" + own_shm_tag() + "-";
}

std::set<std::string> shm_objects() {
  const std::string prefix = own_shm_prefix();
  std::set<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind(prefix, 0) == 0) names.insert(name);
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

std::set<std::string> ShmLeakCheck::leaked_objects() const {
  // Give exiting processes a moment; then anything new is a leak.
  std::set<std::string> leaked;
  for (int attempt = 0; attempt < 50; ++attempt) {
    leaked.clear();
    for (const auto& name : shm_objects())
      if (!before.count(name)) leaked.insert(name);
    if (leaked.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return leaked;
}

ShmLeakCheck::~ShmLeakCheck() {
  std::set<std::string> kids;
  for (int attempt = 0; attempt < 50; ++attempt) {
    kids = child_processes();
    if (kids.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const auto& name : leaked_objects())
    BOOST_ERROR("shared-memory object left in /dev/shm: " << name);
  for (const auto& kid : kids) BOOST_ERROR("child process left running: " << kid);
}

}  // namespace shmdist::test
