// The notifier half of the doorbell protocol (wait/doorbell.hpp), written once: waking the
// ranks that may sleep waiting for something this rank just published. The shared-memory
// transport uses it after records, freed ring space, a finished offer and its Finalized
// state; the world collective lane (coll/shm_lane.hpp) after each round flag.
//
// Call notify() after this rank has published, with release stores, something each rank in
// `owners` may wait for. One fence F_n for all owners, then for each: `before_look(owner)`
// (the transport's sender half of the ready-hint protocol, transport/shm_transport.cpp:
// clear_hint_if_empty), and a relaxed load of its `armed`, waking it if set. Why that is
// enough, in the C++ memory model: the owner stores armed = 1, issues its own fence F_w, then
// re-checks every condition. With full fences: all seq_cst fences lie in one total order S.
// If F_w precedes F_n in S, our load of `armed`, sequenced after F_n, cannot read a value
// older than the owner's store sequenced before F_w ([atomics.order]: the fence-fence rule),
// so we see it armed and wake it. If F_n precedes F_w, the owner's re-checks after F_w cannot
// read values older than our publications before F_n, so it sees what we published and does
// not sleep. The same argument, with the receiver's fence in clear_hint_if_empty for F_w,
// covers the ready hints. Sharing one fence between several owners and both protocols changes
// nothing: each pair of fences is ordered.
//
// F_n is light (a compiler barrier, no instruction) when this process is registered for
// membarrier and every owner announced that its F_w (Doorbell::arm(), clear_hint_if_empty)
// is heavy: wait/fence.hpp shows that a light/heavy pair gives the same two cases. An
// owner's announcement (DoorbellWords::heavy) is read before choosing; reading 0 (not yet
// announced, or no membarrier there) means a full fence. That keeps the send path free of
// any fence instruction.
//
// The doorbells of a job's ranks lie at a fixed stride (one control block per rank in the
// shared segment, segment/layout.hpp RankControl), so an owner's words are an address
// computation, not a load: notify() costs the send path nothing beyond the protocol itself.
#pragma once

#include <atomic>
#include <cstddef>
#include <span>

#include "wait/doorbell.hpp"
#include "wait/fence.hpp"

namespace shmdist::wait {

class Notifier {
 public:
  Notifier() = default;
  // `first`: the words of rank 0's doorbell; rank r's lie `stride` bytes per rank further.
  // `asymmetric`: this process registered for membarrier (register_asymmetric_fences()).
  Notifier(DoorbellWords first, std::size_t stride, bool asymmetric)
      : first_(first), stride_(stride), asymmetric_(asymmetric) {}

  // The doorbell of rank `owner`.
  DoorbellWords words(int owner) const {
    const std::size_t off = static_cast<std::size_t>(owner) * stride_;
    return {at(first_.seq, off), at(first_.armed, off), at(first_.heavy, off)};
  }

  // Wakes each armed rank of `owners` (see above); `before_look(owner)` runs after F_n and
  // before the look at the owner's `armed`.
  template <class BeforeLook>
  void notify(std::span<const int> owners, BeforeLook&& before_look) const {
    bool light = asymmetric_;
    for (std::size_t i = 0; light && i < owners.size(); ++i)
      light = at(first_.heavy, static_cast<std::size_t>(owners[i]) * stride_)
                  ->load(std::memory_order_relaxed) != 0;
    notifier_fence(light);  // F_n
    for (const int owner : owners) {
      before_look(owner);
      wake_if_armed(words(owner));
    }
  }
  void notify(std::span<const int> owners) const {
    notify(owners, [](int) {});
  }

 private:
  static std::atomic<std::uint32_t>* at(std::atomic<std::uint32_t>* first, std::size_t off) {
    return reinterpret_cast<std::atomic<std::uint32_t>*>(reinterpret_cast<std::byte*>(first) +
                                                         off);
  }

  DoorbellWords first_;
  std::size_t stride_ = 0;
  bool asymmetric_ = false;
};

}  // namespace shmdist::wait
