#include "bootstrap/identity_claim.hpp"

#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>
#include <cstring>
#include <mutex>
#include <utility>

#include <shmdist/errors.hpp>

#include "bootstrap/rendezvous_object.hpp"

namespace shmdist::detail {
namespace {

constexpr char kCollision = 'C';

// A report (identity_claim.hpp): kCollision and the reporter's rendezvous start, in one send
// (9 bytes on a stream socket arrive together).
struct Report {
  char kind = kCollision;
  char began[8] = {};  // std::int64_t, contest_clock_ns, native byte order (one host)
};

void send_report(int fd, std::int64_t began_ns) {
  Report r;
  std::memcpy(r.began, &began_ns, sizeof began_ns);
  // Best effort: if it cannot go (the holder just ended), there is nobody to tell.
  [[maybe_unused]] const ssize_t sent =
      ::send(fd, &r, sizeof r, MSG_NOSIGNAL | MSG_DONTWAIT);
}

// Every live claim of this process, so that a forked child gives them up (below). Never
// destroyed: a claim may outlive static destruction (a default group nobody destroyed,
// released at exit), and a fork may come late.
std::mutex& registry_mutex = *new std::mutex;
std::vector<IdentityClaim*>& registry = *new std::vector<IdentityClaim*>;  // registry_mutex


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

// A forked child (a DataLoader worker) would otherwise keep the claim's sockets (SOCK_CLOEXEC
// closes them on exec only) and with them the identity, after this process destroyed its
// group or died: the next job with that identity would find it "in use" or "already
// running". So the child closes every claim's descriptors at once.
//
// Why this is safe: the prepare handler takes registry_mutex in the forking thread, so no
// other thread is inside a claim's descriptors (every change to them holds the mutex) or the
// registry at the fork, and the child's copy of the registry and the claims is consistent.
// The child handler then uses only close() (async-signal-safe) and plain stores, and unlocks
// the mutex its only thread (the forking one) holds; the parent handler unlocks it too.
// Nothing blocks: the child never waits for a lock another thread held at the fork.
void IdentityClaim::before_fork() { registry_mutex.lock(); }
void IdentityClaim::after_fork_in_parent() { registry_mutex.unlock(); }
void IdentityClaim::after_fork_in_child() {
  for (IdentityClaim* c : registry) c->close_descriptors();
  registry_mutex.unlock();
}

IdentityClaim::IdentityClaim(std::string name, int fd) : name_(std::move(name)), listen_fd_(fd) {
  static const int registered = ::pthread_atfork(&IdentityClaim::before_fork,
                                                 &IdentityClaim::after_fork_in_parent,
                                                 &IdentityClaim::after_fork_in_child);
  if (registered != 0) {
    ::close(listen_fd_);
    throw SetupError(std::string("cannot register the fork handler of the job identity claim: ") +
                     std::strerror(registered));
  }
  const std::lock_guard lock(registry_mutex);
  registry.push_back(this);
}

// Closes every descriptor, with the registry mutex held (or in a forked child). Only close()
// and stores: no allocation (clear() keeps the vector's storage).
void IdentityClaim::close_descriptors() {
  for (int c : pending_) ::close(c);
  pending_.clear();
  if (started_fd_ >= 0) ::close(started_fd_);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  started_fd_ = listen_fd_ = -1;
}

namespace {

// Whether this process holds a live claim on `name` itself.
bool held_here(const std::string& name) {
  const std::lock_guard lock(registry_mutex);
  return std::any_of(registry.begin(), registry.end(),
                     [&](const IdentityClaim* c) { return c->held_as(name); });
}

}  // namespace

bool IdentityClaim::held_as(const std::string& name) const {
  return listen_fd_ >= 0 && name_ == name;
}

std::unique_ptr<IdentityClaim> IdentityClaim::take(const std::string& name,
                                                   const std::string& job_id, int world,
                                                   std::int64_t began_ns) {
  int fd = bind_and_listen(name);
  // Held by a listener whose pid is ours, though this process holds no claim on it: the copy
  // of a claim we released, inherited by a child we forked that has not run yet (its fork
  // handler closes it, the moment it runs). Give it a moment.
  const auto patience = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (fd < 0 && std::chrono::steady_clock::now() < patience && !held_here(name)) {
    const int c = connect_to(name);
    if (c < 0) {
      fd = bind_and_listen(name);
      continue;
    }
    int pid = 0;
    try {
      pid = listener_pid(c, name, job_id);
    } catch (...) {
      ::close(c);
      throw;
    }
    ::close(c);
    if (pid != ::getpid()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    fd = bind_and_listen(name);
  }
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
    send_report(c, began_ns);
    ::close(c);
  }
  throw SetupError(
      "rank 0 cannot claim the job identity '" + job_id + "' (world size " +
      std::to_string(world) + "): it is in use by " +
      (holder > 0 ? "process " + std::to_string(holder) : std::string("another process")) +
      ", rank 0 of another job started with the same identity. Two jobs with one identity "
      "would mix their ranks, so this one stops (and the job holding it is aborted too if it "
      "was still forming when this rank began to join). Give each job its own identity: its own MASTER_PORT for "
      "torchrun-style variables (or start it with shmrun), and start it again.");
}

IdentityClaim::~IdentityClaim() {
  const std::lock_guard lock(registry_mutex);
  close_descriptors();
  registry.erase(std::remove(registry.begin(), registry.end(), this), registry.end());
}

void IdentityClaim::release() {
  const std::lock_guard lock(registry_mutex);
  close_descriptors();
}

bool IdentityClaim::collision_reported() {
  const std::lock_guard lock(registry_mutex);  // a fork must not copy half a change
  if (listen_fd_ < 0) return false;           // released
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

bool IdentityClaim::drain() {
  const std::lock_guard lock(registry_mutex);  // a fork must not copy half a change
  if (started_fd_ >= 0) {
    for (;;) {  // probes for "started": they say nothing
      const int c = ::accept4(started_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) {
        ::close(c);
        continue;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      break;  // EAGAIN: none waiting (the listeners are non-blocking)
    }
  }
  if (listen_fd_ < 0) return false;  // released
  for (;;) {
    const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      break;
    }
    pending_.push_back(c);
  }
  // As collision_reported: a connection that said nothing yet is kept until it says its
  // report or closes (a probe). A bound, should connections stay silent without closing:
  // the oldest go first.
  constexpr std::size_t kMaxPending = 256;
  while (pending_.size() > kMaxPending) {
    ::close(pending_.front());
    pending_.erase(pending_.begin());
  }
  bool mixed = false;
  for (std::size_t i = 0; i < pending_.size();) {
    Report r;
    const ssize_t n = ::recv(pending_[i], &r, sizeof r, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      ++i;
      continue;
    }
    if (n == static_cast<ssize_t>(sizeof r) && r.kind == kCollision) {
      std::int64_t began = 0;
      std::memcpy(&began, r.began, sizeof began);
      // Began before the job had all its ranks (while forming, started_ns_ is 0: every
      // report counts, as in collision_reported).
      if (started_ns_ == 0 || began < started_ns_) mixed = true;
    }
    ::close(pending_[i]);
    pending_[i] = pending_.back();
    pending_.pop_back();
  }
  return mixed;
}

void IdentityClaim::mark_started() {
  const std::lock_guard lock(registry_mutex);
  if (listen_fd_ >= 0 && started_fd_ < 0) {
    // Before "started" is visible: a rank that sees it began its rendezvous after this, or
    // its report makes drain() abort the job (reports compare with this moment).
    started_ns_ = contest_clock_ns();
    started_fd_ = bind_and_listen(name_ + ".started");
  }
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

void report_late_arrival(const std::string& name, const std::string& job_id,
                         std::int64_t began_ns) {
  const int c = connect_to(name);
  if (c < 0) return;
  try {
    // Only to the holder as claim_holder knows it (refuses another user's listener).
    listener_pid(c, name, job_id);
  } catch (...) {
    ::close(c);
    throw;
  }
  send_report(c, began_ns);
  ::close(c);
}

}  // namespace shmdist::detail
