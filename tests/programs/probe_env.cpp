// Prints what a rank was started with: its launch variables, the CPUs it may run on, and the
// segment descriptor it inherited. Flags (any order):
//   join    also init_process_group, pass a token around the ring of ranks, destroy
//   noeol   end the output with a line that has no newline (tests --tag-output)
//   stderr  also write a line to stderr
// Output: "PROBE rank=R world=W local_rank=L local_world=LW fd=F fd_size=BYTES fd_cloexec=0|1
//          key=K cpus=LIST", then "JOINED rank=R world=W token=T" with join.
#include <fcntl.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <string>

#include "report.hpp"

namespace dist = shmdist;
using namespace shmdist::programs;

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

std::string allowed_cpus() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("Cpus_allowed_list:", 0) == 0) {
      std::string v = line.substr(std::strlen("Cpus_allowed_list:"));
      return v.substr(v.find_first_not_of(" \t"));
    }
  return "?";
}

// The inherited segment descriptor: its size (the segment's) and whether it would leak into
// programs this rank starts.
std::string describe_fd(const std::string& fd_text) {
  const int fd = std::atoi(fd_text.c_str());
  struct stat st {};
  if (fd_text.empty() || fstat(fd, &st) != 0) return "fd_size=-1 fd_cloexec=-1";
  const int flags = fcntl(fd, F_GETFD);
  return "fd_size=" + std::to_string(st.st_size) +
         " fd_cloexec=" + std::to_string((flags & FD_CLOEXEC) ? 1 : 0);
}

int token_ring() {
  dist::init_process_group("shm");
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();
  dist::Tensor token = dist::zeros(1, dist::kLong);
  if (world > 1) {
    if (rank == 0) {
      token.data<std::int64_t>()[0] = 1;
      dist::send(token, 1);
      dist::recv(token, world - 1);
    } else {
      dist::recv(token, rank - 1);
      token.data<std::int64_t>()[0] += 1;
      dist::send(token, (rank + 1) % world);
    }
  }
  dist::destroy_process_group();
  emit("JOINED rank=" + std::to_string(rank) + " world=" + std::to_string(world) +
       " token=" + std::to_string(token.data<std::int64_t>()[0]));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main([&] {
    bool join = false, noeol = false, to_stderr = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      join |= a == "join";
      noeol |= a == "noeol";
      to_stderr |= a == "stderr";
    }
    const std::string rank = env_or("RANK", "-");
    const std::string fd = env_or("SHMDIST_SEGMENT_FD", "");
    emit("PROBE rank=" + rank + " world=" + env_or("WORLD_SIZE", "-") +
         " local_rank=" + env_or("LOCAL_RANK", "-") +
         " local_world=" + env_or("LOCAL_WORLD_SIZE", "-") + " fd=" + (fd.empty() ? "-" : fd) +
         " " + describe_fd(fd) + " key=" + env_or("SHMDIST_JOB_KEY", "-") +
         " cpus=" + allowed_cpus());
    if (to_stderr) emit_err("STDERR rank=" + rank);
    int code = 0;
    if (join) code = token_ring();
    if (noeol) write_all(STDOUT_FILENO, "NOEOL rank=" + rank);
    return code;
  });
}
