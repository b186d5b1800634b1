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
// concurrent async calls) of kKeptBytes together, so that an idle process holds no more than
// that of memory nobody uses. A larger stage is allocated and freed each call: at that size
// the call's own copies dwarf the page faults. When a buffer given back would exceed either
// bound, the smallest go first (the larger ones cost the most to fault in again).
constexpr std::size_t kKept = 4;
constexpr std::size_t kKeptBytes = std::size_t{64} << 20;

struct Buffer {
  void* memory = nullptr;
  std::size_t bytes = 0;
};

class Keep {
 public:
  Keep() { buffers_.reserve(kKept + 1); }  // give_back never allocates: it runs in a deleter

  // The smallest kept buffer of at least `bytes`, or a new one.
  Buffer take(std::size_t bytes) {
    if constexpr (kScratchKept) {
      std::lock_guard<std::mutex> hold(mutex_);
      auto best = buffers_.end();
      for (auto it = buffers_.begin(); it != buffers_.end(); ++it)
        if (it->bytes >= bytes && (best == buffers_.end() || it->bytes < best->bytes)) best = it;
      if (best != buffers_.end()) {
        const Buffer b = *best;
        kept_bytes_ -= b.bytes;
        buffers_.erase(best);
        return b;
      }
    }
    Buffer b{std::malloc(bytes), bytes};
    if (!b.memory) throw std::bad_alloc();
    return b;
  }

  // A buffer its stage no longer uses (its last view is gone: a receive that outlived its
  // call, engine/engine.cpp memory_of, holds it until then).
  void give_back(Buffer b) {
    if (kScratchKept && b.bytes <= kKeptBytes) {
      std::lock_guard<std::mutex> hold(mutex_);
      buffers_.push_back(b);  // within the capacity reserved: kKept + 1
      kept_bytes_ += b.bytes;
      while (buffers_.size() > kKept || kept_bytes_ > kKeptBytes) {
        auto smallest = std::min_element(
            buffers_.begin(), buffers_.end(),
            [](const Buffer& x, const Buffer& y) { return x.bytes < y.bytes; });
        kept_bytes_ -= smallest->bytes;
        std::free(smallest->memory);
        buffers_.erase(smallest);
      }
      return;
    }
    std::free(b.memory);
  }

  void release() {
    std::lock_guard<std::mutex> hold(mutex_);
    for (const Buffer& b : buffers_) std::free(b.memory);
    buffers_.clear();
    kept_bytes_ = 0;
  }

 private:
  // Buffers are given back on whichever thread drops a stage's last view (a Work's, a
  // receive's), so the keep is shared under a lock: a handful of entries, taken twice a call.
  std::mutex mutex_;
  std::vector<Buffer> buffers_;
  std::size_t kept_bytes_ = 0;
};

// Never destroyed: a stage may be given back while the process exits (a parked receive's,
// transport/mpi_payload.cpp abandon_inbound), after static destructors ran.
Keep& keep() {
  static Keep* const k = new Keep();
  return *k;
}

}  // namespace

Tensor scratch(std::int64_t count, DType dtype) {
  const std::size_t nbytes =
      std::max<std::size_t>(static_cast<std::size_t>(count) * element_size(dtype), 1);
  const Buffer b = keep().take(nbytes);
  std::shared_ptr<void> owner(b.memory, [b](void*) { keep().give_back(b); });
  return Tensor::from_blob(b.memory, {count}, dtype, owner);
}

void release_scratch() { keep().release(); }

}  // namespace shmdist::coll
