#include "ring/ring.hpp"

#include <string>

#include <shmdist/errors.hpp>

namespace shmdist::ring {

void reject_tail(int src, int dst, std::uint64_t tail, std::uint64_t head, std::uint64_t size) {
  throw PeerFailure("corrupt ring from rank " + std::to_string(src) + " to rank " +
                    std::to_string(dst) + ": rank " + std::to_string(dst) +
                    " published a consumed position (tail) of " + std::to_string(tail) +
                    " while the producer's head is " + std::to_string(head) +
                    "; expected a multiple of " + std::to_string(kRecordAlign) + " from " +
                    std::to_string(head >= size ? head - size : 0) + " to " +
                    std::to_string(head) + " (ring of " + std::to_string(size) +
                    " bytes). The peer wrote something the protocol forbids (a bug, memory "
                    "corruption or a foreign process writing the segment); the job cannot "
                    "continue safely.");
}

}  // namespace shmdist::ring
