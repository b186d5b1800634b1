// Is a process still alive? Used by ranks started without shmrun (no launcher to tell them)
// to notice a dead peer while they wait.
#pragma once

#include <sys/types.h>

namespace shmdist::wait {

// False once `pid` has exited, including while it is a zombie nobody reaped yet.
bool process_alive(pid_t pid);

}  // namespace shmdist::wait
