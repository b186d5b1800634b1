#include "wait/fence.hpp"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace shmdist::wait {

bool register_asymmetric_fences() {
#if defined(SYS_membarrier)
  const long supported = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (supported < 0 || !(supported & MEMBARRIER_CMD_GLOBAL_EXPEDITED) ||
      !(supported & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED))
    return false;
  return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0;
#else
  return false;
#endif
}

bool heavy_fence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
#if defined(SYS_membarrier)
  return syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0;
#else
  return false;
#endif
}

}  // namespace shmdist::wait
