// Whether a process still lives, for the rendezvous of ranks started by a foreign launcher
// (torchrun-style variables, no shmrun): it decides whether a named segment left behind in
// /dev/shm is stale (its creator, or the process holding our rank, is dead) and may be
// replaced. Ranks watch their peers while they wait with pidfds instead (ShmTransport).
#pragma once

#include <sys/types.h>

namespace shmdist::detail {

// False once `pid` has exited, including while it is a zombie nobody reaped yet.
bool process_alive(pid_t pid);

}  // namespace shmdist::detail
