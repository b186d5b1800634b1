// Every SHMDIST_* environment variable, in one place: read once, validated, with defaults.
//
// Adding a variable is a change to this file and config.cpp only: a field in Config, and a
// row in config.cpp's table (name, accepted values, default, meaning, how to parse it). The
// table of variables in docs/launcher.md must list it too: tests/config fails until it does.
// Variables of other launchers (RANK, WORLD_SIZE, MASTER_ADDR, OMPI_*, PMI_*) are not ours:
// bootstrap/join.cpp reads those (through base/env.hpp).
//
// This is the base layer (lib/base/): it uses nothing else of lib/, and every layer may use
// it. A setting's rule (what values it accepts, its default) lives here; the layer that acts
// on the setting uses the rule (segment/ checks ring sizes with check_ring_size).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <initializer_list>

namespace shmdist::config {

// How often a blocked call looks at its peers' health, the job state and its deadline, and
// how often a rank without a supervising launcher polls its peers' processes, unless
// SHMDIST_HEALTH_CHECK_MS says otherwise (wait::SpinPolicy's default).
inline constexpr std::chrono::milliseconds kDefaultHealthCheck{100};

// Ring sizes a job accepts (SHMDIST_RING_SIZE, shmrun --ring-size, LaunchOptions::ring_size):
// a power of two from 4 KiB to 1 GiB. segment/layout.hpp lays rings out within these bounds
// (segment.cpp checks at compile time that the two agree).
inline constexpr std::uint64_t kMinRingSize = 4096;
inline constexpr std::uint64_t kMaxRingSize = std::uint64_t{1} << 30;
// Throws SetupError naming `what` (for example "--ring-size") unless `ring_size` is a power
// of two within [kMinRingSize, kMaxRingSize].
void check_ring_size(std::uint64_t ring_size, const std::string& what);

// SHMDIST_SINGLE_COPY=auto: between threads of one process (a memcpy), messages from this size
// on are read by the receiver straight from the sender's memory (transport/single_copy.hpp);
// below it the ring's two copies cost less. Between processes auto is off: process_vm_readv
// pins the sender's pages one by one and cost 2.7-3.5x a memcpy per byte on the VMs measured,
// more than the ring's two copies (see docs/semantics.md); a size switches it on there too.
inline constexpr std::uint64_t kDefaultSingleCopy = 64 * 1024;

struct Config {
  // Set by shmrun for the ranks it starts (the launch protocol, not for users).
  std::optional<int> segment_fd;       // SHMDIST_SEGMENT_FD: the inherited segment descriptor
  std::optional<std::string> job_key;  // SHMDIST_JOB_KEY: the segment's job key, 16 hex digits
  // Tuning. Unset optionals take a default that depends on the job (see the table).
  std::optional<std::uint64_t> ring_size;  // SHMDIST_RING_SIZE: bytes per ring
  std::optional<long> spin_us;             // SHMDIST_SPIN_US: spin before sleeping
  std::optional<int> local_cpus;           // SHMDIST_LOCAL_CPUS: CPUs the job shares
  std::chrono::milliseconds health_check = kDefaultHealthCheck;  // SHMDIST_HEALTH_CHECK_MS
  // SHMDIST_HANG_REPORT: the hang watchdog's interval (0 = off) for shmrun and launch().
  std::optional<std::chrono::milliseconds> hang_report;
  // SHMDIST_SINGLE_COPY: the smallest message sent by single copy (0 = off; unset = auto).
  std::optional<std::uint64_t> single_copy;
  // SHMDIST_HOST_ID: this rank's host identity (ranks with equal ids share a segment); under
  // mpirun, setting it also takes the multi-host path (bootstrap/join_hosts.hpp).
  std::optional<std::string> host_id;
  // SHMDIST_SHM_TAG: put into the names this process gives objects in /dev/shm
  // ("shmdist-<uid>-<tag>-..."), so that whoever set it can tell them from everyone else's
  // (the test suite's leak check does); empty when unset.
  std::string shm_tag;
};

// One row of the table: what docs/launcher.md documents.
struct VariableInfo {
  const char* name;
  const char* accepted;
  const char* default_value;
  const char* meaning;
};

// Every variable, in the order of docs/launcher.md's table.
std::span<const VariableInfo> variables();

// Reads every variable through `lookup` (nullopt = unset). Throws SetupError naming the
// variable, the value found and the accepted range.
Config read(const std::function<std::optional<std::string>(const char*)>& lookup);
// read() of this process's environment.
Config from_environment();
// Only the variables named in `only` (the rest keep their defaults).
Config from_environment(std::initializer_list<std::string_view> only);

}  // namespace shmdist::config
