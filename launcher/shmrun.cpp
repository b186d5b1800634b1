// shmrun: starts N ranks of a program on one shared segment and supervises them.
//
//   shmrun -n N [--tag-output] [--bind-to none|core] [--ring-size BYTES] [--timeout DURATION]
//          [--grace DURATION] [--hang-report DURATION] [--] PROGRAM [ARGS...]
//
// Everything from PROGRAM on is the program's: shmrun's options come before it.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <set>

#include <shmdist/errors.hpp>
#include <shmdist/version.hpp>

#include "base/byte_size.hpp"
#include "base/config.hpp"
#include "base/cpus.hpp"
#include "base/duration.hpp"
#include "base/env.hpp"
#include "job/launch_protocol.hpp"
#include "job/spawn.hpp"
#include "job/supervisor.hpp"

namespace {

using namespace shmdist;

struct Options {
  int nproc = 0;
  bool tag_output = false;
  std::string bind_to = "none";
  std::string ring_size;
  std::string timeout;
  std::string grace = "2s";
  std::string hang_report;
  std::vector<std::string> command;
};

// The option values, checked before anything starts (a bad value is a usage error: exit 2).
struct Settings {
  std::uint64_t ring_size = 0;
  job::SupervisorOptions supervisor;
};

Settings check_options(const Options& opt) {
  Settings s;
  s.ring_size = job::default_ring_size(opt.nproc);
  if (!opt.ring_size.empty()) {
    s.ring_size = env::parse_byte_size(opt.ring_size, "--ring-size");
    config::check_ring_size(s.ring_size, "--ring-size");
  }
  job::SupervisorOptions& sup = s.supervisor;
  sup.tag_output = opt.tag_output;
  sup.handle_signals = true;
  sup.end_descendants = true;
  if (!opt.timeout.empty()) sup.job_timeout = env::parse_duration(opt.timeout, "--timeout");
  sup.term_grace = env::parse_duration(opt.grace, "--grace");
  if (opt.hang_report == "0") sup.hang_report = std::chrono::milliseconds(0);
  else if (!opt.hang_report.empty())
    sup.hang_report = env::parse_duration(opt.hang_report, "--hang-report");
  return s;
}

// Every SHMDIST_* variable the ranks will read is checked here, before anything starts, so
// that a bad one is reported once, by shmrun, like a bad option, rather than by every rank
// when it joins (or never, by a program that does not join). A bad value is a runtime error,
// exit 1, as it is for a rank. SHMDIST_SEGMENT_FD and SHMDIST_JOB_KEY are not the user's:
// shmrun sets them for its ranks, replacing inherited values (a shmrun started by a rank).
// shmrun itself uses SHMDIST_RING_SIZE and SHMDIST_HANG_REPORT where no option says otherwise.
void apply_environment(const Options& opt, Settings& s) {
  const config::Config env = config::read([](const char* name) -> std::optional<std::string> {
    const std::string_view n = name;
    if (n == "SHMDIST_SEGMENT_FD" || n == "SHMDIST_JOB_KEY") return std::nullopt;
    return env::get(name);
  });
  if (opt.ring_size.empty() && env.ring_size) s.ring_size = *env.ring_size;
  if (opt.hang_report.empty() && env.hang_report) s.supervisor.hang_report = *env.hang_report;
}

// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick for port 0), for the
// store that torch.distributed's default env:// rendezvous starts on rank 0.
std::string free_local_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw SetupError(std::string("cannot create a socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  close(fd);
  if (!ok)
    throw SetupError(std::string("cannot find a free TCP port on 127.0.0.1 for MASTER_PORT: ") +
                     std::strerror(err) + "; set MASTER_PORT yourself");
  return std::to_string(ntohs(addr.sin_port));
}

// MASTER_ADDR / MASTER_PORT for torch programs (their default init_method is env://), unless
// the caller set them: one job's ranks share them.
std::vector<std::pair<std::string, std::string>> torch_rendezvous_env() {
  std::vector<std::pair<std::string, std::string>> env;
  if (!env::get("MASTER_ADDR")) env.emplace_back("MASTER_ADDR", "127.0.0.1");
  if (!env::get("MASTER_PORT")) env.emplace_back("MASTER_PORT", free_local_port());
  return env;
}

// Forks the ranks, each with its environment, the segment descriptor, its CPU (--bind-to
// core) and, with --tag-output, pipes for its output; hands each to the supervisor.
void start_ranks(const Options& opt, const job::JobSegment& seg, const std::string& name,
                 job::JobSupervisor& supervisor) {
  const std::vector<int> cpus = cpus::allowed();
  const auto torch_env = torch_rendezvous_env();
  std::vector<int> parent_ends;  // owned by the supervisor once added; children must not keep them
  for (int r = 0; r < opt.nproc; ++r) {
    job::SpawnSpec spec;
    spec.inherit_fd = seg.fd();
    spec.env = job::rank_environment(seg, r, name);
    spec.env.insert(spec.env.end(), torch_env.begin(), torch_env.end());
    if (opt.bind_to == "core") spec.cpu = cpus[static_cast<std::size_t>(r) % cpus.size()];
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    auto close_pipes = [&] {
      for (int fd : {out[0], out[1], err[0], err[1]})
        if (fd >= 0) close(fd);
    };
    if (opt.tag_output) {
      if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        close_pipes();
        throw SetupError("cannot create output pipes for rank " + std::to_string(r) + ": " +
                         std::strerror(errno));
      }
      spec.stdout_fd = out[1];
      spec.stderr_fd = err[1];
      spec.close_fds = parent_ends;
    }
    pid_t pid = -1;
    try {
      pid = job::spawn_program(spec, opt.command);
    } catch (...) {
      close_pipes();
      throw;
    }
    if (opt.tag_output) {
      close(out[1]);
      close(err[1]);
      parent_ends.push_back(out[0]);
      parent_ends.push_back(err[0]);
    }
    supervisor.add_rank(r, pid, out[0], err[0]);
  }
}

int run(const Options& opt, Settings settings) {
  apply_environment(opt, settings);
  // An ignored SIGCHLD survives execve and would make the kernel reap our ranks behind our
  // back: take the default back (the ranks get it too, spawn resets it).
  signal(SIGCHLD, SIG_DFL);
  // Whatever the ranks start and leave running is re-parented to us, and ended with the job
  // (setsid does not escape this).
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  // No name at all: a signal at any point of start-up can leave nothing in /dev/shm.
  const job::JobSegment seg = job::create_job_segment(opt.nproc, settings.ring_size);
  const std::string name = "memfd:" + std::to_string(getpid());

  job::JobSupervisor supervisor(seg, settings.supervisor);
  supervisor.install_signal_handling();
  try {
    start_ranks(opt, seg, name, supervisor);
  } catch (const job::ExecFailed& e) {
    // Said once here, not by every rank; the ranks already started are stopped.
    supervisor.abort_startup();
    std::fprintf(stderr, "shmrun: %s\n", e.what());
    return e.exit_code();
  } catch (...) {
    supervisor.abort_startup();
    throw;
  }
  const int status = supervisor.run();
  supervisor.print_summary();
  return status;
}

// Where shmrun's own options end and PROGRAM begins. Everything from PROGRAM on belongs to
// the program, untouched: options parsers that collect positionals would otherwise take the
// program's own options ("-c", "--size 8") as shmrun's, or reorder them.
struct CommandLine {
  int launcher_argc = 1;  // argv[0 .. launcher_argc) are shmrun's
  int program_index = 0;  // argv[program_index ..] are PROGRAM and its arguments; 0 if none
};

CommandLine split_command_line(int argc, char** argv) {
  static const std::set<std::string> with_value = {"-n",        "--nproc",   "--bind-to",
                                                   "--ring-size", "--timeout", "--grace",
                                                   "--hang-report"};
  CommandLine cl;
  int i = 1;
  while (i < argc) {
    const std::string arg = argv[i];
    if (arg == "--") {
      cl.launcher_argc = i;
      cl.program_index = i + 1 < argc ? i + 1 : 0;
      return cl;
    }
    if (arg.size() < 2 || arg[0] != '-') break;           // PROGRAM
    i += with_value.count(arg) && i + 1 < argc ? 2 : 1;  // "--opt=value", "-n4": one word
  }
  cl.launcher_argc = i;
  cl.program_index = i < argc ? i : 0;
  return cl;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"shmrun: run N ranks of PROGRAM on one host, connected by shmdist's shared memory"};
  app.set_version_flag("--version", std::string("shmrun (shmdist) ") + shmdist::kVersionString);
  app.add_option("-n,--nproc", opt.nproc, "number of ranks to start")
      ->required()
      ->check(CLI::Range(1, shmdist::job::kMaxRanks));
  app.add_flag("--tag-output", opt.tag_output, "prefix every output line with [rank]");
  app.add_option("--bind-to", opt.bind_to, "bind each rank to a CPU (core) or not (none)")
      ->check(CLI::IsMember({"none", "core"}))
      ->capture_default_str();
  app.add_option("--ring-size", opt.ring_size,
                 "bytes per ring, a power of two such as 64K or 1M (default: 1M, smaller for "
                 "large jobs; also SHMDIST_RING_SIZE)");
  app.add_option("--timeout", opt.timeout,
                 "whole-job limit such as 30s, 5m or 500ms; on expiry, report what every rank is "
                 "blocked on, stop the job and exit 124");
  app.add_option("--grace", opt.grace,
                 "after SIGTERM, how long ranks get before SIGKILL")
      ->capture_default_str();
  app.add_option("--hang-report", opt.hang_report,
                 "when every rank of a wait-for cycle, or of the job, has been blocked with no "
                 "progress this long, print the hang report once (the job keeps running); 0 "
                 "switches it off (default 30s; also SHMDIST_HANG_REPORT)");
  app.footer(
      "PROGRAM [ARGS...] follows the options (after -- if PROGRAM starts with '-'); everything "
      "from PROGRAM on is passed to it unchanged. Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, "
      "LOCAL_WORLD_SIZE and SHMDIST_* in its environment, and MASTER_ADDR=127.0.0.1 and a free "
      "MASTER_PORT unless already set (for torch.distributed's env://). Exit status: 0 if every "
      "rank exits 0, else the first failing rank's (128+signal if killed), 124 after --timeout.\n");
  const CommandLine cl = split_command_line(argc, argv);
  try {
    app.parse(cl.launcher_argc, argv);
    if (cl.program_index == 0)
      throw CLI::ParseError("PROGRAM is missing: shmrun -n N [options] [--] PROGRAM [ARGS...]",
                            CLI::ExitCodes::RequiredError);
    opt.command.assign(argv + cl.program_index, argv + argc);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Usage errors exit 2, as for most command-line tools (CLI11's own codes are 100+).
    std::fprintf(stderr, "shmrun: %s\nRun 'shmrun --help' for the options.\n", e.what());
    return 2;
  }
  Settings settings;
  try {
    settings = check_options(opt);
  } catch (const std::exception& e) {  // a bad value (or SHMDIST_* variable): usage error too
    std::fprintf(stderr, "shmrun: %s\nRun 'shmrun --help' for the options.\n", e.what());
    return 2;
  }
  try {
    return run(opt, settings);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shmrun: %s\n", e.what());
    return 1;
  }
}
