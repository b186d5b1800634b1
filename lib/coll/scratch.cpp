// The staging buffers' keep (scratch.hpp): a handful of buffers given back by calls that are
// done, handed out again to later ones. Hand-written: Boost.Pool serves blocks of one size,
// and these come in every size, a few at a time.

#include "coll/scratch.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

namespace shmdist::coll {
namespace {

// What the keep holds at most: a few buffers (one call's stage, and those of some
// concurrent async calls), and no buffer larger than kKeepLargest, so that an idle process
// holds at most kKept x kKeepLargest of memory nobody uses. A larger stage is allocated and
// freed each call: at that size the call's own copies dwarf the page faults.
constexpr std::size_t kKept = 4;
constexpr std::size_t kKeepLargest = std::size_t{64} << 20;

struct Buffer {
  void* memory = nullptr;
  std::size_t bytes = 0;
};

class Keep {
 public:
  // The smallest kept buffer of at least `bytes`, or a new one.
  Buffer take(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> hold(mutex_);
      auto best = buffers_.end();
      for (auto it = buffers_.begin(); it != buffers_.end(); ++it)
        if (it->bytes >= bytes && (best == buffers_.end() || it->bytes < best->bytes)) best = it;
      if (best != buffers_.end()) {
        const Buffer b = *best;
        buffers_.erase(best);
        return b;
      }
    }
    Buffer b{std::malloc(bytes), bytes};
    if (!b.memory) throw std::bad_alloc();
    return b;
  }

  void release() {
    std::vector<Buffer> all;
    {
      std::lock_guard<std::mutex> hold(mutex_);
      all.swap(buffers_);
    }
    for (const Buffer& b : all) std::free(b.memory);
  }

  // A buffer its stage no longer uses (its last view is gone: a receive that outlived its
  // call, engine/engine.cpp memory_of, holds it until then). Kept unless it is too large, or
  // the keep is full and it is the smallest.
  void give_back(Buffer b) {
    if (b.bytes <= kKeepLargest) {
      std::lock_guard<std::mutex> hold(mutex_);
      buffers_.push_back(b);
      if (buffers_.size() <= kKept) return;
      auto smallest = std::min_element(buffers_.begin(), buffers_.end(),
                                       [](const Buffer& x, const Buffer& y) { return x.bytes < y.bytes; });
      b = *smallest;
      buffers_.erase(smallest);
    }
    std::free(b.memory);
  }

 private:
  // Buffers are given back on whichever thread drops a stage's last view (a Work's, a
  // receive's), so the keep is shared under a lock: a handful of entries, taken twice a call.
  std::mutex mutex_;
  std::vector<Buffer> buffers_;
};

// Never destroyed: a stage may be given back while the process exits (a parked receive's,
// transport/mpi_payload.cpp abandon_inbound), after static destructors ran.
Keep& keep() {
  static Keep* const k = new Keep();
  return *k;
}

}  // namespace

Tensor scratch(std::int64_t count, DType dtype) {
  const std::size_t nbytes = std::max<std::size_t>(static_cast<std::size_t>(count) * element_size(dtype), 1);
  const Buffer b = keep().take(nbytes);
  std::shared_ptr<void> owner(b.memory, [b](void*) { keep().give_back(b); });
  return Tensor::from_blob(b.memory, {count}, dtype, owner);
}

void release_scratch() { keep().release(); }

}  // namespace shmdist::coll
