// Whether a process is alive (lib/base/process_alive.hpp), the one meaning the supervisor,
// the transport's peer watch and the rendezvous share: alive until it ends, and a zombie
// nobody reaped has ended; through a pidfd, or /proc where there are none.
#include <boost/test/unit_test.hpp>

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "base/process_alive.hpp"

using namespace shmdist;

namespace {

// A child that lives until its pipe closes (or it is killed); killed and reaped on scope exit
// if the test did not reap it, so a failing check leaves no process behind.
struct Child {
  pid_t pid = -1;
  int hold = -1;  // the write end: closing it ends the child
  bool reaped = false;
  Child() {
    int fds[2];
    BOOST_TEST_REQUIRE(pipe(fds) == 0);
    pid = fork();
    BOOST_TEST_REQUIRE(pid >= 0);
    if (pid == 0) {
      close(fds[1]);
      char c;
      while (read(fds[0], &c, 1) < 0 && errno == EINTR) {
      }
      _exit(7);
    }
    close(fds[0]);
    hold = fds[1];
  }
  void release() {
    if (hold >= 0) close(hold);
    hold = -1;
  }
  ~Child() {
    release();
    if (!reaped) {
      kill(pid, SIGKILL);
      int status = 0;
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
};

// Waits (at most 30 s) until the process behind `pidfd` has ended.
bool wait_ended(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 30'000) == 1;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(liveness_tests)

BOOST_AUTO_TEST_CASE(no_process_is_not_alive_and_this_one_is) {
  BOOST_TEST(!detail::process_alive(0));
  BOOST_TEST(!detail::process_alive(-1));
  BOOST_TEST(!detail::process_alive_by_proc(0));
  BOOST_TEST(detail::process_alive(getpid()));
  BOOST_TEST(detail::process_alive_by_proc(getpid()));
}

// Running: alive. Exited but not reaped (a zombie): ended, by the pidfd and by /proc alike.
// Reaped: no such process.
BOOST_AUTO_TEST_CASE(a_zombie_has_ended_and_a_reaped_process_is_gone) {
  Child child;
  const int fd = detail::open_pidfd(child.pid);
  BOOST_TEST_REQUIRE(fd >= 0, "pidfd_open: " << std::strerror(errno));
  BOOST_TEST(detail::process_alive(child.pid));
  BOOST_TEST(detail::process_alive_by_proc(child.pid));
  BOOST_TEST(!detail::pidfd_ended(fd));
  siginfo_t info{};
  BOOST_TEST(detail::wait_pidfd(fd, info, WNOHANG) == 0);

  child.release();
  BOOST_TEST_REQUIRE(wait_ended(fd));
  BOOST_TEST(detail::pidfd_ended(fd));
  BOOST_TEST(!detail::process_alive(child.pid));        // a zombie: nobody has reaped it
  BOOST_TEST(!detail::process_alive_by_proc(child.pid));
  BOOST_TEST(detail::wait_pidfd(fd, info, WNOHANG | WNOWAIT) == 1);  // still there to reap
  BOOST_TEST(detail::wait_pidfd(fd, info, WNOHANG) == 1);
  child.reaped = true;
  BOOST_TEST(info.si_code == CLD_EXITED);
  BOOST_TEST(info.si_status == 7);
  BOOST_TEST(detail::wait_pidfd(fd, info, WNOHANG) == -1);  // its status was taken
  close(fd);

  errno = 0;
  const int again = detail::open_pidfd(child.pid);
  BOOST_TEST(again < 0);
  BOOST_TEST(errno == ESRCH);
  if (again >= 0) close(again);
  BOOST_TEST(!detail::process_alive(child.pid));
  BOOST_TEST(!detail::process_alive_by_proc(child.pid));
}

BOOST_AUTO_TEST_CASE(a_signal_through_the_pidfd_ends_the_child) {
  Child child;
  const int fd = detail::open_pidfd(child.pid);
  BOOST_TEST_REQUIRE(fd >= 0, "pidfd_open: " << std::strerror(errno));
  BOOST_TEST(detail::pidfd_signal(fd, SIGKILL) == 0);
  siginfo_t info{};
  BOOST_TEST(detail::wait_pidfd(fd, info, 0) == 1);
  child.reaped = true;
  BOOST_TEST(info.si_code == CLD_KILLED);
  BOOST_TEST(info.si_status == SIGKILL);
  close(fd);
}

BOOST_AUTO_TEST_SUITE_END()
