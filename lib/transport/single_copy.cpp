#include "transport/single_copy.hpp"

#include <sched.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <span>
#include <utility>

#include <shmdist/errors.hpp>

namespace shmdist::transport {
namespace {

// process_vm_readv moves at most about 2 GiB per call (MAX_RW_COUNT); ask for 1 GiB at a time.
constexpr std::uint64_t kMaxPerCall = std::uint64_t{1} << 30;

// Copies n bytes at `address` of process `pid` into dest. Returns 0 or an errno value.
int read_peer(int pid, std::uint64_t address, std::byte* dest, std::uint64_t n) {
  std::uint64_t done = 0;
  while (done < n) {
    const std::uint64_t want = std::min(n - done, kMaxPerCall);
    iovec local{dest + done, static_cast<std::size_t>(want)};
    iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(address + done)),
                 static_cast<std::size_t>(want)};
    const ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (got == 0) return EFAULT;  // no progress: the rest is not mapped
    done += static_cast<std::uint64_t>(got);
  }
  return 0;
}

// Where Yama restricts ptrace to descendants (ptrace_scope 1), peers of the same user may read
// this process only if it says so. Scopes 2 and 3 need privileges: the offer is declined then.
void allow_peers_to_read() {
  std::ifstream scope("/proc/sys/kernel/yama/ptrace_scope");
  int value = 0;
  if (scope >> value && value == 1) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
}

// The start-up probe: can this process use process_vm_readv at all (a seccomp filter or an old
// kernel says ENOSYS/EPERM)? Reads a word of its own. Whether a given peer may read us is
// learned from its answer to the first offer (Declined).
bool probe_self() {
  const std::uint64_t word = 0x5349'4e47'4c45'4350ULL;
  std::uint64_t copy = 0;
  return read_peer(getpid(), reinterpret_cast<std::uintptr_t>(&word),
                   reinterpret_cast<std::byte*>(&copy), sizeof copy) == 0 &&
         copy == word;
}

[[noreturn, gnu::cold]] void bad_offer(int src, const std::string& what) {
  throw PeerFailure("corrupt single-copy offer from rank " + std::to_string(src) + ": " + what +
                    ". The peer wrote something the protocol forbids (a bug, memory corruption "
                    "or a foreign process writing the segment); the job cannot continue safely.");
}

std::string state_text(std::uint64_t word) {
  return "offer #" + std::to_string(word >> 3) + " in state " + std::to_string(word & 7);
}

}  // namespace

SingleCopy::SingleCopy(std::uint64_t threshold, bool thread_mode, int world)
    : thread_mode_(thread_mode), pid_(getpid()), declined_(world, false) {
  if (threshold == 0) return;
  if (!thread_mode_) {
    allow_peers_to_read();
    if (!probe_self()) return;
  }
  threshold_ = threshold;
}

SingleCopy::Step SingleCopy::advance(int dst, ring::RingProducer& producer,
                                     std::atomic<std::uint64_t>& state, OutboundMessage& msg) {
  if (!msg.started) {
    if (declined_[dst]) return Step::Stream;
    // A new offer only once the receiver is through with the previous one (see the header).
    const std::uint64_t prev = state.load(std::memory_order_acquire);
    const auto prev_state = static_cast<OfferState>(prev & 7);
    if (prev != 0 && prev_state != OfferState::Done && prev_state != OfferState::Streaming &&
        prev_state != OfferState::Failed)
      return Step::Stream;
    if (producer.writable(kOfferRecordLength) < kOfferRecordLength) return Step::Blocked;
    const std::uint64_t id = ++next_id_;
    // Relaxed: the record's release stamp orders it before the receiver's CAS (see header).
    state.store(offer_word(id, OfferState::Offered), std::memory_order_relaxed);
    MessageHeader header = encode_header(msg.env);
    header.flags = kFrameOffer;
    const OfferDescriptor d{id, reinterpret_cast<std::uintptr_t>(msg.next), msg.env.nbytes, pid_, 0};
    producer.publish(ring::RecordKind::Start,
                     std::as_bytes(std::span<const MessageHeader, 1>(&header, 1)),
                     std::as_bytes(std::span<const OfferDescriptor, 1>(&d, 1)));
    msg.started = true;
    msg.offer = id;
    return Step::Moved;
  }
  if (msg.offer == 0) return Step::Stream;  // revoked or declined: Continuations
  const std::uint64_t id = msg.offer;
  // Acquire pairs with the receiver's release of its final state (see header).
  const std::uint64_t now = state.load(std::memory_order_acquire);
  if (now == offer_word(id, OfferState::Offered) || now == offer_word(id, OfferState::Claimed))
    return Step::Blocked;
  msg.offer = 0;
  if (now == offer_word(id, OfferState::Done)) {
    msg.sent = msg.env.nbytes;
    msg.next += msg.env.nbytes;
    return Step::Moved;
  }
  if (now == offer_word(id, OfferState::Declined)) {
    declined_[dst] = true;
    return Step::Stream;
  }
  // Failed, or a state no receiver writes: the receive ended with an error on the receiver's
  // side; this send is over (nothing more is due) and says why.
  msg.sent = msg.env.nbytes;
  msg.next += msg.env.nbytes;
  if (now == offer_word(id, OfferState::Failed))
    throw PeerFailure("rank " + std::to_string(dst) + " could not read the " +
                      std::to_string(msg.env.nbytes) +
                      " bytes this rank offered it for a single copy (its receive failed with "
                      "PeerFailure, which says why); the message is lost");
  throw PeerFailure("the single-copy offer word of the ring to rank " + std::to_string(dst) +
                    " holds " + state_text(now) + " while offer #" + std::to_string(id) +
                    " was outstanding: a corrupt peer or a foreign process writing the segment");
}

void SingleCopy::revoke(std::atomic<std::uint64_t>& state, OutboundMessage& msg,
                        const std::function<bool()>& receiver_gone) {
  if (msg.offer == 0) return;
  const std::uint64_t id = std::exchange(msg.offer, 0);
  std::uint64_t seen = offer_word(id, OfferState::Offered);
  if (state.compare_exchange_strong(seen, offer_word(id, OfferState::Revoked),
                                    std::memory_order_acq_rel, std::memory_order_acquire))
    return;  // the receiver never reads the buffer: stream the message
  // Claimed: the receiver is copying right now. Its copy depends on nothing we do, so this
  // wait is as long as the copy (or ends when the receiver is known to be gone).
  for (unsigned spins = 0; seen == offer_word(id, OfferState::Claimed); ++spins) {
    if ((spins & 1023) == 1023) {
      if (receiver_gone()) break;
      sched_yield();
    }
    seen = state.load(std::memory_order_acquire);
  }
  if (seen == offer_word(id, OfferState::Declined)) return;  // stream it
  // Done (or failed, or the receiver is gone): nothing more to send.
  msg.sent = msg.env.nbytes;
  msg.next += msg.env.nbytes;
}

void SingleCopy::check(const OfferDescriptor& d, const Envelope& env, std::uint64_t length,
                       int sender_pid, int src) {
  if (length != kOfferRecordLength)
    bad_offer(src, "an offer record of " + std::to_string(length) + " bytes, expected " +
                       std::to_string(kOfferRecordLength));
  if (d.length != env.nbytes)
    bad_offer(src, "it offers " + std::to_string(d.length) + " bytes for a message of " +
                       std::to_string(env.nbytes));
  if (d.id == 0 || d.id > kMaxOfferId)
    bad_offer(src, "offer id " + std::to_string(d.id));
  if (d.pid != sender_pid || d.pid <= 0)
    bad_offer(src, "it names pid " + std::to_string(d.pid) + " but rank " + std::to_string(src) +
                       " is pid " + std::to_string(sender_pid));
  if (d.address + d.length < d.address)
    bad_offer(src, "its address range [" + std::to_string(d.address) + ", +" +
                       std::to_string(d.length) + ") wraps around");
}

SingleCopy::Claim SingleCopy::receive(int src, std::atomic<std::uint64_t>& state,
                                      const OfferDescriptor& d, std::byte* dest) const {
  std::uint64_t seen = offer_word(d.id, OfferState::Offered);
  if (!state.compare_exchange_strong(seen, offer_word(d.id, OfferState::Claimed),
                                     std::memory_order_acquire, std::memory_order_acquire)) {
    if (seen == offer_word(d.id, OfferState::Revoked)) {
      // Acknowledge, so that the sender may post its next offer on this ring. Only we move
      // the word out of Revoked(id); a failure here means a foreign writer.
      if (state.compare_exchange_strong(seen, offer_word(d.id, OfferState::Streaming),
                                        std::memory_order_relaxed))
        return Claim::Stream;
    }
    bad_offer(src, "offer #" + std::to_string(d.id) + " is not open (the ring's offer word holds " +
                       state_text(seen) + "): a replayed or invented offer");
  }
  int error = 0;
  if (thread_mode_ && d.pid == pid_) {
    if (d.length) std::memcpy(dest, reinterpret_cast<const void*>(d.address), d.length);
  } else {
    error = read_peer(d.pid, d.address, dest, d.length);
  }
  if (error == 0) {
    state.store(offer_word(d.id, OfferState::Done), std::memory_order_release);
    return Claim::Copied;
  }
  if (error == EPERM || error == ENOSYS || error == EACCES) {
    state.store(offer_word(d.id, OfferState::Declined), std::memory_order_release);
    return Claim::Stream;
  }
  state.store(offer_word(d.id, OfferState::Failed), std::memory_order_release);
  if (error == ESRCH)
    throw PeerFailure("rank " + std::to_string(src) + " (pid " + std::to_string(d.pid) +
                      ") ended while this rank was copying its " + std::to_string(d.length) +
                      "-byte message (single copy); the message is lost");
  throw PeerFailure("cannot read the " + std::to_string(d.length) + " bytes rank " +
                    std::to_string(src) + " offered at address " + std::to_string(d.address) +
                    " of pid " + std::to_string(d.pid) + ": " + std::strerror(error) +
                    ". The sender's buffer is not mapped (it freed or unmapped it before the "
                    "send completed, or the offer is corrupt); the message is lost");
}

}  // namespace shmdist::transport
