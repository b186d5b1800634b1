// Single copy for large messages: instead of streaming a message through the ring (one copy
// in, one copy out), the sender posts an offer (a Start record whose header has kFrameOffer
// and whose payload is an OfferDescriptor: pid, address, length, id) and the receiver copies
// the bytes straight out of the sender's memory with process_vm_readv (threads of one process:
// memcpy) into wherever the engine routes the message: the posted receive's tensor, or an
// unexpected-message buffer (so a rank never waits for its peer's receive: the no-deadlock
// promise of buffered sends holds as with the ring). The sender's send ends when the receiver
// marks the offer done.
//
// The race between "the sender revokes" (its blocking send timed out or failed, so its buffer
// is about to go away) and "the receiver claims" is settled by one word per ring in the shared
// segment (RingControl::offer_state), holding the offer's id and state, moved only by
// compare-exchange or by the side that owns the current state:
//
//   sender:   0/any final  --store-->  Offered(id)          (before publishing the record)
//   receiver: Offered(id)  --CAS-->    Claimed(id)  --CAS-->  Done | Declined | Streaming |
//                                                             Failed (id)
//   sender:   Offered(id)  --CAS-->    Revoked(id)
//   sender:   Claimed(id)  --CAS-->    Revoked(id)          (process mode, at the revoke's
//                                                             deadline: a stalled receiver)
//   receiver: Revoked(id)  --CAS-->    Streaming(id)        (acknowledges: Continuations follow)
//
// The final states, for the sender: Done (the bytes are read), Streaming (send them as
// Continuation records: the receiver could not read this buffer, EFAULT from a live sender,
// or acknowledged a revoke), Declined (stream this and every later message to that receiver:
// it may not read us, EPERM), Failed (the receive failed; sticky too: that receiver stopped
// reading our ring, so every later send to it fails at once with PeerFailure).
//
// Why this is safe, in C++ memory-model terms:
// - Exactly one of two CASes from the same value succeeds: both are read-modify-writes of one
//   atomic object, and an RMW always reads the value immediately before its own write in that
//   object's modification order ([atomics.order] p10), so they cannot both read it. That
//   settles Offered(id) (sender's revoke against receiver's claim) and Claimed(id) (sender's
//   deadline revoke against the receiver's final CAS) alike.
// - Receiver's final CAS wins: it is a release RMW sequenced after its last read of the
//   buffer; the sender reads its value (Done, Declined, Streaming, Failed) with an acquire
//   load or with the acquire failure ordering of its own CAS, so it synchronizes with the
//   receiver's CAS and every read of the buffer happens before the sender returns and the
//   caller frees or rewrites it.
// - Sender's revoke wins from Offered(id): the receiver's claim fails reading Revoked(id); it
//   never touches the buffer and takes the message's bytes from the Continuation records the
//   sender streams from a private copy, exactly as a message that did not fit one record.
// - Sender's deadline revoke wins from Claimed(id) (process mode only): the receiver may still
//   be inside process_vm_readv, reading memory the sender is about to free or reuse. That is
//   no data race of either program: the kernel's reads of the sender's pages are not accesses
//   by the sender's threads, and can neither fault nor change the sender's memory (a freed
//   page reads as EFAULT, a reused one as other bytes). The receiver's final CAS then fails
//   reading Revoked(id); it discards what it copied (`received` is not advanced, so the
//   engine never sees those bytes) and acknowledges with Streaming; the bytes it delivers are
//   the Continuations', published by the ring's release stamps. Between threads (memcpy) a
//   read of freed memory would be undefined behaviour, so thread mode never revokes a claimed
//   offer: it waits, bounded by the memcpy (a thread of this process cannot be stopped alone).
// - The revoking sender waits asleep on its doorbell (woken by the receiver's notifier half
//   after its final CAS, wait::Notifier::notify) in slices, checking whether
//   the receiver is gone, until its deadline (revoke_grace): no call spins or waits forever.
// - The sender's store of Offered(id) is sequenced before the release store of the record's
//   stamp, which the receiver's acquire load reads before its CAS: the store happens before
//   the CAS, which therefore reads Offered(id) or something later, never an older offer's
//   state (write-read coherence). The tensor's bytes, written before send(), are visible the
//   same way. The sender posts a new offer on a ring only when the word holds Done or
//   Streaming (Declined and Failed are sticky: no new offer to that receiver), so the receiver
//   of a revoked offer still finds Revoked(id) when it reaches the record.
//
// Trust: the descriptor is untrusted. Its length must equal the header's byte count, its pid
// the sender rank's published pid, its id the one in the state word (a replayed or invented
// offer fails the CAS), and its address range must not wrap: otherwise PeerFailure.
// process_vm_readv writes at most `length` bytes into the buffer the engine sized for the
// message, and reports a dead sender as ESRCH: PeerFailure. An address it cannot read from a
// live sender (EFAULT: memory readable by its owner but not through process_vm_readv, such as
// memfd_secret or driver mappings, or a corrupt address) answers Streaming for that message:
// the sender streams it from its own memory (where a corrupt address is the sender's own
// problem). EPERM (Yama, another user, a container that forbids it) declines the offer: the
// sender streams the message through the ring instead and stops offering to that receiver.
// In thread mode the copy is a memcpy from the descriptor's address: ranks that are threads
// of one process trust each other's memory (a corrupt descriptor there is a bug of this
// process, not a hostile peer).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ring/ring.hpp"
#include "transport/frame.hpp"
#include "transport/transport.hpp"

namespace shmdist::transport {

// What an offer record carries after its MessageHeader.
struct OfferDescriptor {
  std::uint64_t id;       // the sender's offer number (from 1, never reused)
  std::uint64_t address;  // where the bytes are in the sender's address space
  std::uint64_t length;   // the message's byte count (must equal the header's nbytes)
  std::int32_t pid;       // the sender's process
  std::uint32_t reserved;
};
static_assert(sizeof(OfferDescriptor) == 32);
inline constexpr std::uint64_t kOfferRecordLength = sizeof(MessageHeader) + sizeof(OfferDescriptor);

enum class OfferState : std::uint64_t {
  Offered = 1,
  Claimed = 2,
  Done = 3,
  Revoked = 4,
  Declined = 5,
  Failed = 6,
  Streaming = 7,
};
inline constexpr std::uint64_t kMaxOfferId = (std::uint64_t{1} << 61) - 1;
inline constexpr std::uint64_t offer_word(std::uint64_t id, OfferState s) {
  return id << 3 | static_cast<std::uint64_t>(s);
}

class SingleCopy {
 public:
  SingleCopy() = default;
  // `threshold`: the smallest message offered (0: never offer; offers from peers are still
  // taken). `thread_mode`: every peer is a thread of this process (memcpy, no probe).
  SingleCopy(std::uint64_t threshold, bool thread_mode, int world);

  // The smallest message this rank offers, or UINT64_MAX when it never does (switched off,
  // or the start-up probe found process_vm_readv unusable).
  std::uint64_t threshold() const { return threshold_; }
  // The same for one destination: UINT64_MAX once it declined, 0 once an offer to it failed
  // (every later message to it then goes through advance(), which fails it).
  std::uint64_t threshold(int dst) const { return by_dst_[dst].threshold; }
  bool thread_mode() const { return thread_mode_; }

  // ---- sender ----
  enum class Step { Moved, Blocked, Stream };
  // Starts or advances `msg` (msg.env.nbytes >= threshold(dst)). Stream: send it through the
  // ring (msg.started says whether an offer record is already in the ring). A failed offer
  // (or a send to a receiver that failed one) never throws: msg ends done with msg.failure
  // set, which the engine turns into PeerFailure for that send alone.
  Step advance(int dst, ring::RingProducer& producer, std::atomic<std::uint64_t>& state,
               OutboundMessage& msg);
  // msg's memory is going away: revoke its offer. Returns true when that is settled
  // (msg.offer is 0, and msg is either done or to be streamed); false while a receiver that
  // claimed the offer may be reading it: then call settle() until it returns true (the
  // receiver finished), or force_revoke() at the deadline (process mode only).
  bool revoke(int dst, std::atomic<std::uint64_t>& state, OutboundMessage& msg);
  bool settle(int dst, std::atomic<std::uint64_t>& state, OutboundMessage& msg);
  void force_revoke(int dst, std::atomic<std::uint64_t>& state, OutboundMessage& msg);
  // The receiver that claimed msg's offer is gone: nothing more is due.
  static void abandon(OutboundMessage& msg);
  // How long a revoke waits for a receiver that claimed an offer of `nbytes` to finish its
  // copy before revoking it anyway: far longer than any copy takes (a copy that runs longer
  // only costs the receiver its copy, never correctness).
  static std::chrono::nanoseconds revoke_grace(std::uint64_t nbytes);

  // ---- receiver ----
  // Checks an offer record (`length` payload bytes) from `src` whose sender's pid is
  // `sender_pid`; throws PeerFailure if it cannot be a valid offer.
  static void check(const OfferDescriptor& d, const Envelope& env, std::uint64_t length,
                    int sender_pid, int src);
  enum class Claim { Copied, Stream };
  // Claims the offer and copies its bytes into `dest` (room for d.length bytes). Stream: the
  // sender revoked it, or this rank cannot read the sender's buffer (declined): Continuation
  // records bring the bytes. `sender_alive` says whether the sender still runs (an EFAULT
  // from a live sender is answered Streaming). Throws PeerFailure (after marking the offer
  // failed) if the copy fails. The three steps, public for tests: claim() (false: Stream),
  // copy() (an errno value or 0), finish().
  Claim receive(int src, std::atomic<std::uint64_t>& state, const OfferDescriptor& d,
                std::byte* dest, const std::function<bool()>& sender_alive) const;
  static bool claim(int src, std::atomic<std::uint64_t>& state, const OfferDescriptor& d);
  int copy(const OfferDescriptor& d, std::byte* dest) const;
  static Claim finish(int src, std::atomic<std::uint64_t>& state, const OfferDescriptor& d,
                      int error, bool sender_alive);

  // Where Yama's ptrace_scope is `scope`, what this process allows and whether it offers:
  // the pid to pass to PR_SET_PTRACER (0: nothing to set) and whether to offer at all.
  struct PtracePolicy {
    int tracer = 0;
    bool offer = true;
  };
  static PtracePolicy ptrace_policy(int scope, int parent);

 private:
  struct Destination {
    std::uint64_t threshold = UINT64_MAX;
    std::string failure;  // why an offer to it failed (sticky; msg.failure points here)
  };
  // Applies a state other than Offered/Claimed(id) read for msg's offer to `dst`.
  void conclude(int dst, std::uint64_t word, std::uint64_t id, OutboundMessage& msg);
  void fail(int dst, std::string why, OutboundMessage& msg);

  std::uint64_t threshold_ = UINT64_MAX;
  bool thread_mode_ = false;
  int pid_ = 0;
  std::uint64_t next_id_ = 0;
  std::vector<Destination> by_dst_;  // never resized after construction (msg.failure)
};

}  // namespace shmdist::transport
