#include "base/config.hpp"

#include <array>
#include <cstdlib>

#include <shmdist/errors.hpp>

#include "base/byte_size.hpp"
#include "base/duration.hpp"
#include "base/env.hpp"

namespace shmdist::config {
namespace {

// A variable: its documentation, and how its text goes into a Config (throwing SetupError).
struct Variable {
  VariableInfo info;
  void (*parse)(Config& config, const char* name, const std::string& text);
};

const std::array kVariables = {
    Variable{{"SHMDIST_SEGMENT_FD", "0 to 1048576", "unset",
              "set by shmrun: the descriptor of the job's segment, which every rank inherits"},
             [](Config& c, const char* name, const std::string& text) {
               c.segment_fd = static_cast<int>(env::parse_int(name, text, 0, 1 << 20));
             }},
    Variable{{"SHMDIST_JOB_KEY", "16 lower-case hexadecimal digits", "unset",
              "set by shmrun: the job key of that segment, checked when a rank joins"},
             [](Config& c, const char* name, const std::string& text) {
               const bool hex = text.size() == 16 &&
                                text.find_first_not_of("0123456789abcdef") == std::string::npos;
               if (!hex)
                 throw SetupError("environment variable " + std::string(name) + "='" + text +
                                  "' is not a job key: expected 16 lower-case hexadecimal "
                                  "digits. " + env::kSetByLauncher);
               c.job_key = text;
             }},
    Variable{{"SHMDIST_RING_SIZE", "a power of two from 4K to 1G (`64K`, `1M`, `1048576`, ...)",
              "1 MiB, halved as the job grows so that all rings fit in 256 MiB, at least 64 KiB",
              "bytes per ring (one per ordered pair of ranks) for jobs that shmrun or another launcher "
              "starts; `shmrun --ring-size` takes precedence, `launch()` takes "
              "`LaunchOptions::ring_size`"},
             [](Config& c, const char* name, const std::string& text) {
               const std::uint64_t size = env::parse_byte_size(text, name);
               check_ring_size(size, name);
               c.ring_size = size;
             }},
    Variable{{"SHMDIST_SPIN_US", "0 to 1000000", "50 (1000, yielding, when more ranks are awake than there are CPUs)",
              "microseconds a blocked call spins before it sleeps on its doorbell (0: sleep at once)"},
             [](Config& c, const char* name, const std::string& text) {
               c.spin_us = static_cast<long>(env::parse_int(
                   name, text, 0, 1'000'000,
                   "It is how many microseconds a blocked call spins before it sleeps."));
             }},
    Variable{{"SHMDIST_LOCAL_CPUS", "1 to 65536",
              "the CPUs this process may run on (all online CPUs if it is pinned to one); for a host "
              "of a job whose hosts share this machine (mpirun, torch), that host's share",
              "how many CPUs the job's ranks share: with more ranks awake than that (for a world "
              "collective, more ranks in the job), a waiting rank yields its CPU instead of "
              "spinning"},
             [](Config& c, const char* name, const std::string& text) {
               c.local_cpus = static_cast<int>(env::parse_int(
                   name, text, 1, 1 << 16, "It is how many CPUs the job's ranks share."));
             }},
    Variable{{"SHMDIST_HEALTH_CHECK_MS", "1 to 86400000", "100",
              "how often (milliseconds) a blocked call checks peers' health, the job state and its "
              "deadline, and a rank started without shmrun polls its peers' processes; data "
              "never waits for it"},
             [](Config& c, const char* name, const std::string& text) {
               c.health_check = std::chrono::milliseconds(env::parse_int(
                   name, text, 1, 24 * 3'600'000,
                   "It is how often, in milliseconds, a blocked call checks its peers."));
             }},
    Variable{{"SHMDIST_HANG_REPORT", "`0` (off) or a duration: `30s`, `500ms`, `5m`, `1h`",
              "30s (`shmrun --hang-report` and `LaunchOptions::hang_report` take precedence)",
              "how long every rank of a job that shmrun or `launch()` runs may stay blocked "
              "with no progress before the hang report is printed"},
             [](Config& c, const char* name, const std::string& text) {
               if (text == "0") {
                 c.hang_report = std::chrono::milliseconds(0);
                 return;
               }
               try {
                 c.hang_report = env::parse_duration(text, name);
               } catch (const InvalidArgument& e) {
                 throw SetupError(std::string("environment variable ") + e.what() +
                                  ", or 0 to switch the hang watchdog off");
               }
             }},
    Variable{{"SHMDIST_SINGLE_COPY", "`auto`, `off`, or a byte size from 4K to 1G (`64K`, `1M`, ...)",
              "`auto`: 64K between threads of one process (`launch()`'s thread mode), off between "
              "processes",
              "messages of at least this size between ranks of one host are copied once, by the "
              "receiver straight from the sender's memory (`process_vm_readv`; `memcpy` between "
              "threads), where the start-up probe and the receiver allow it, else streamed through "
              "the ring; `off` streams all"},
             [](Config& c, const char* name, const std::string& text) {
               if (text == "auto") {
                 c.single_copy.reset();
                 return;
               }
               if (text == "off" || text == "0") {
                 c.single_copy = 0;
                 return;
               }
               const std::uint64_t size = env::parse_byte_size(text, name);
               if (size < 4096 || size > (std::uint64_t{1} << 30))
                 throw SetupError("environment variable " + std::string(name) + "='" + text +
                                  "' is out of range: expected auto, off, or a byte size from "
                                  "4K to 1G (the smallest message sent by single copy)");
               c.single_copy = size;
             }},
    Variable{{"SHMDIST_HOST_ID", "1 to 255 characters",
              "unset: the kernel's boot id, else the host name",
              "this rank's host identity in an mpirun job: ranks with equal ids share a segment "
              "(this emulates hosts on one machine); setting it takes the multi-host path"},
             [](Config& c, const char* name, const std::string& text) {
               if (text.empty() || text.size() > 255)
                 throw SetupError("environment variable " + std::string(name) + " is " +
                                  (text.empty() ? std::string("empty")
                                                : "too long (" + std::to_string(text.size()) +
                                                      " characters)") +
                                  ": expected 1 to 255 characters naming this rank's host "
                                  "(ranks with equal ids share a segment)");
               c.host_id = text;
             }},
    Variable{{"SHMDIST_SHM_TAG", "1 to 32 letters, digits or `_`", "unset",
              "a tag in the names of the objects this process creates in `/dev/shm` "
              "(`shmdist-<uid>-<tag>-...`), so that whoever set it (a test harness, an "
              "administrator) can tell them from everyone else's; ranks of one job started "
              "without shmrun meet on such a name, so they need the same tag"},
             [](Config& c, const char* name, const std::string& text) {
               const bool ok = !text.empty() && text.size() <= 32 &&
                               text.find_first_not_of("abcdefghijklmnopqrstuvwxyz"
                                                      "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                      "0123456789_") == std::string::npos;
               if (!ok)
                 throw SetupError("environment variable " + std::string(name) + "='" + text +
                                  "' is not a tag: expected 1 to 32 letters, digits or '_' "
                                  "(it becomes part of the names of objects in /dev/shm)");
               c.shm_tag = text;
             }},
};

const std::array<VariableInfo, kVariables.size()> kInfos = [] {
  std::array<VariableInfo, kVariables.size()> infos{};
  for (std::size_t i = 0; i < kVariables.size(); ++i) infos[i] = kVariables[i].info;
  return infos;
}();

}  // namespace

std::span<const VariableInfo> variables() { return kInfos; }

void check_ring_size(std::uint64_t ring_size, const std::string& what) {
  const bool pow2 = ring_size != 0 && (ring_size & (ring_size - 1)) == 0;
  if (!pow2 || ring_size < kMinRingSize || ring_size > kMaxRingSize)
    throw SetupError(what + " = " + std::to_string(ring_size) +
                     " bytes: expected a power of two from " + std::to_string(kMinRingSize) +
                     " (4K) to " + std::to_string(kMaxRingSize) + " (1G), for example 64K or 1M");
}

Config read(const std::function<std::optional<std::string>(const char*)>& lookup) {
  Config config;
  for (const Variable& v : kVariables)
    if (const auto text = lookup(v.info.name)) v.parse(config, v.info.name, *text);
  return config;
}

Config from_environment() {
  return read([](const char* name) { return env::get(name); });
}

Config from_environment(std::initializer_list<std::string_view> only) {
  return read([&](const char* name) -> std::optional<std::string> {
    for (const std::string_view wanted : only)
      if (wanted == name) return env::get(name);
    return std::nullopt;
  });
}

}  // namespace shmdist::config
