// Whether a process is alive, in one place: the pidfd calls the launcher's supervisor makes on
// its ranks, a rank's watch over its peers without a supervising launcher (ShmTransport), and
// the one-shot check of the rendezvous of ranks started by a foreign launcher (torchrun-style
// variables, no shmrun), which decides whether a named segment left behind in /dev/shm is
// stale (its creator, or the process holding our rank, is dead) and may be replaced.
//
// One meaning for all of them: a process is alive until it has ended; a zombie nobody reaped
// yet has ended. A pidfd says so without a race against pid reuse (it names one process and
// becomes readable when it ends); where the kernel has no pidfd_open (before Linux 5.3, or a
// seccomp filter refuses it) the one-shot check falls back to kill(pid, 0) and the state
// letter in /proc/<pid>/stat.
#pragma once

#include <signal.h>
#include <sys/types.h>

namespace shmdist::detail {

// False once `pid` has exited, including while it is a zombie nobody reaped yet. Through a
// pidfd when the kernel has them, else process_alive_by_proc.
bool process_alive(pid_t pid);
// The fallback: kill(pid, 0), then the state letter in /proc/<pid>/stat (kill() succeeds on a
// zombie). A pid reused since is taken for the process it was.
bool process_alive_by_proc(pid_t pid);

// pidfd_open(pid, 0): a close-on-exec descriptor naming the process, or -1 with errno
// (ESRCH: no such process, already reaped; ENOSYS/EPERM: no pidfds here).
int open_pidfd(pid_t pid);
// Whether the process behind `pidfd` has ended (the descriptor is readable), without waiting.
bool pidfd_ended(int pidfd);
// pidfd_send_signal(pidfd, sig): never reaches a later process that reuses the pid.
int pidfd_signal(int pidfd, int sig);
// waitid(P_PIDFD) for our child behind `pidfd`, with WEXITED | `flags` (WNOHANG, WNOWAIT).
// Returns 1 with `info` filled when it has ended, 0 when it has not (WNOHANG), -1 when its
// status is not ours to take (ECHILD: the kernel reaped it because SIGCHLD is ignored, or
// another waiter did).
int wait_pidfd(int pidfd, siginfo_t& info, int flags);

}  // namespace shmdist::detail
