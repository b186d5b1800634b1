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
//   receiver: Offered(id)  --CAS-->    Claimed(id)  --store-->  Done | Declined | Failed (id)
//   sender:   Offered(id)  --CAS-->    Revoked(id)
//   receiver: Revoked(id)  --CAS-->    Streaming(id)        (acknowledges: Continuations follow)
//
// Why this is safe, in C++ memory-model terms:
// - Exactly one of the two CASes from Offered(id) succeeds: both are read-modify-writes of one
//   atomic object, and an RMW always reads the value immediately before its own write in that
//   object's modification order ([atomics.order] p10), so they cannot both read Offered(id).
// - Receiver wins: the sender's CAS fails, reading Claimed(id) (or a later state). It then
//   waits (bounded by the copy: the claimed receiver depends on nothing the sender does) until
//   an acquire load reads Done/Declined/Failed(id), which the receiver stores with release
//   after its last read of the buffer. That load synchronizes with the store, so every read
//   of the buffer happens before the sender returns and the caller frees or rewrites it.
//   (process_vm_readv's reads are sequenced between the receiver's CAS and its store.)
// - Sender wins: the receiver's CAS fails, reading Revoked(id); it never touches the buffer
//   and takes the message's bytes from the Continuation records the sender streams from a
//   private copy, exactly as a message that did not fit one record.
// - The sender's store of Offered(id) is sequenced before the release store of the record's
//   stamp, which the receiver's acquire load reads before its CAS: the store happens before
//   the CAS, which therefore reads Offered(id) or something later, never an older offer's
//   state (write-read coherence). The tensor's bytes, written before send(), are visible the
//   same way. The sender posts a new offer on a ring only when the word holds a final state
//   of the previous one (Done, Streaming, Declined), so the receiver of a revoked offer still
//   finds Revoked(id) when it reaches the record.
// - Wake-ups: the receiver's final store is followed by the doorbell protocol's notifier half
//   (ShmTransport::notify_after_publishing), so a sender asleep waiting for Done wakes.
//
// Trust: the descriptor is untrusted. Its length must equal the header's byte count, its pid
// the sender rank's published pid, its id the one in the state word (a replayed or invented
// offer fails the CAS), and its address range must not wrap. process_vm_readv reports a bad
// address as EFAULT and a dead sender as ESRCH: the receive ends with PeerFailure, never a
// crash, and writes at most `length` bytes into the buffer the engine sized for the message.
// EPERM (Yama, another user, a container that forbids it) declines the offer: the sender
// streams the message through the ring instead and stops offering to that receiver.
#pragma once

#include <atomic>
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

  // ---- sender ----
  enum class Step { Moved, Blocked, Stream };
  // Starts or advances `msg` (msg.env.nbytes >= threshold()). Stream: send it through the
  // ring (msg.started says whether an offer record is already in the ring).
  Step advance(int dst, ring::RingProducer& producer, std::atomic<std::uint64_t>& state,
               OutboundMessage& msg);
  // msg's memory is going away: revoke its offer, or wait until a receiver that claimed it is
  // done (`receiver_gone` says when to stop waiting). Afterwards msg.offer is 0 and msg is
  // either done or to be streamed.
  void revoke(std::atomic<std::uint64_t>& state, OutboundMessage& msg,
              const std::function<bool()>& receiver_gone);

  // ---- receiver ----
  // Checks an offer record (`length` payload bytes) from `src` whose sender's pid is
  // `sender_pid`; throws PeerFailure if it cannot be a valid offer.
  static void check(const OfferDescriptor& d, const Envelope& env, std::uint64_t length,
                    int sender_pid, int src);
  enum class Claim { Copied, Stream };
  // Claims the offer and copies its bytes into `dest` (room for d.length bytes). Stream: the
  // sender revoked it, or this rank may not read the sender (declined): Continuation records
  // bring the bytes. Throws PeerFailure (after marking the offer failed) if the copy fails.
  Claim receive(int src, std::atomic<std::uint64_t>& state, const OfferDescriptor& d,
                std::byte* dest) const;

 private:
  std::uint64_t threshold_ = UINT64_MAX;
  bool thread_mode_ = false;
  int pid_ = 0;
  std::uint64_t next_id_ = 0;
  std::vector<bool> declined_;  // by destination: it answered an offer with Declined
};

}  // namespace shmdist::transport
