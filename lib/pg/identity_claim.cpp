#include "pg/identity_claim.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <shmdist/errors.hpp>

namespace shmdist::detail {
namespace {

constexpr char kCollision = 'C';

// The abstract address "\0<name>" (no file; gone with its last descriptor).
socklen_t abstract_address(const std::string& name, sockaddr_un& addr) {
  addr = {};
  addr.sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof addr.sun_path)
    throw SetupError("the identity claim '" + name + "' is too long for a socket name");
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

int new_socket() {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    throw SetupError(std::string("cannot create a Unix socket for the job identity claim: ") +
                     std::strerror(errno));
  return fd;
}

// Binds and listens on `name`: the descriptor, or -1 if another process holds it.
int bind_and_listen(const std::string& name) {
  sockaddr_un addr;
  const socklen_t len = abstract_address(name, addr);
  const int fd = new_socket();
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EADDRINUSE) return -1;
    throw SetupError("cannot bind the job identity claim '" + name + "': " + std::strerror(err));
  }
  if (::listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    ::close(fd);
    throw SetupError("cannot listen on the job identity claim '" + name + "': " +
                     std::strerror(err));
  }
  return fd;
}

// Connects to the listener on `name`: the connected descriptor, or -1 if nobody listens (or
// its backlog is full, for an instant). A Unix stream connection completes at once, without
// the listener's accept.
int connect_to(const std::string& name) {
  sockaddr_un addr;
  const socklen_t len = abstract_address(name, addr);
  const int fd = new_socket();
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The listener's pid behind a connected descriptor (its credentials at listen()); throws if
// it is another user's.
int listener_pid(int fd, const std::string& name, const std::string& job_id) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return 0;
  if (cred.uid != ::getuid())
    throw SetupError("the claim on the job identity '" + job_id + "' (the socket '@" + name +
                     "') is held by process " + std::to_string(cred.pid) + " of user id " +
                     std::to_string(cred.uid) + ", not by this user (" +
                     std::to_string(::getuid()) +
                     "): another user's program holds it. Give this job another identity "
                     "(another MASTER_PORT for torchrun-style jobs).");
  return cred.pid;
}

}  // namespace

std::unique_ptr<IdentityClaim> IdentityClaim::take(const std::string& name,
                                                   const std::string& job_id, int world) {
  const int fd = bind_and_listen(name);
  if (fd >= 0) return std::unique_ptr<IdentityClaim>(new IdentityClaim(name, fd));
  // Held: say by whom, and tell the holder that its job may hold ranks of ours.
  int holder = 0;
  if (const int c = connect_to(name); c >= 0) {
    try {
      holder = listener_pid(c, name, job_id);
    } catch (...) {
      ::close(c);
      throw;
    }
    // Best effort: if the byte cannot go (the holder just ended), there is nobody to tell.
    [[maybe_unused]] const ssize_t sent = ::send(c, &kCollision, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    ::close(c);
  }
  throw SetupError(
      "rank 0 cannot claim the job identity '" + job_id + "' (world size " +
      std::to_string(world) + "): it is in use by " +
      (holder > 0 ? "process " + std::to_string(holder) : std::string("another process")) +
      ", rank 0 of another job started with the same identity. Two jobs with one identity "
      "would mix their ranks, so this one stops (and a job still forming under that identity "
      "is aborted too). Give each job its own identity: its own MASTER_PORT for "
      "torchrun-style variables (or start it with shmrun), and start it again.");
}

IdentityClaim::~IdentityClaim() { release(); }

void IdentityClaim::release() {
  for (int c : pending_) ::close(c);
  pending_.clear();
  if (started_fd_ >= 0) ::close(started_fd_);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  started_fd_ = listen_fd_ = -1;
}

bool IdentityClaim::collision_reported() {
  for (;;) {
    const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      break;  // EAGAIN: none waiting
    }
    pending_.push_back(c);
  }
  // A connection is a probe (it closes without a word) or a report (one byte). A connection
  // says nothing yet until its sender's send() lands: keep it until it does either.
  bool collision = false;
  for (std::size_t i = 0; i < pending_.size();) {
    char byte = 0;
    const ssize_t n = ::recv(pending_[i], &byte, 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      ++i;
      continue;
    }
    if (n == 1 && byte == kCollision) collision = true;
    ::close(pending_[i]);
    pending_[i] = pending_.back();
    pending_.pop_back();
  }
  return collision;
}

void IdentityClaim::mark_started() {
  if (started_fd_ < 0) started_fd_ = bind_and_listen(name_ + ".started");
}

ClaimHolder claim_holder(const std::string& name, const std::string& job_id) {
  ClaimHolder h;
  const int c = connect_to(name);
  if (c < 0) return h;
  try {
    h.pid = listener_pid(c, name, job_id);
  } catch (...) {
    ::close(c);
    throw;
  }
  ::close(c);
  if (h.pid > 0) {
    if (const int s = connect_to(name + ".started"); s >= 0) {
      int started_by = 0;
      try {
        started_by = listener_pid(s, name, job_id);
      } catch (...) {
        ::close(s);
        throw;
      }
      ::close(s);
      h.started = started_by == h.pid;
    }
  }
  return h;
}

}  // namespace shmdist::detail
