#include "wait/spin.hpp"

namespace shmdist::wait {

SpinPolicy SpinPolicy::for_job(std::optional<long> spin_us, int cpus,
                               std::chrono::milliseconds health_check) {
  SpinPolicy p;
  p.cpus = cpus;
  if (spin_us && *spin_us >= 0) p.spin_alone = p.spin_crowded = std::chrono::microseconds(*spin_us);
  p.health_check = health_check;
  return p;
}

}  // namespace shmdist::wait
