#include "transport/single_copy.hpp"

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

// Yama's ptrace_scope, or 0 where Yama is absent.
int yama_scope() {
  std::ifstream scope("/proc/sys/kernel/yama/ptrace_scope");
  int value = 0;
  return scope >> value ? value : 0;
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

SingleCopy::PtracePolicy SingleCopy::ptrace_policy(int scope, int parent) {
  // Scope 1 lets a process trace only its descendants and the processes that named it (or an
  // ancestor of it) with PR_SET_PTRACER. Ranks are children of one launcher (shmrun, the
  // mpirun daemon, torchrun's agent): naming the parent lets exactly its descendants, the
  // peers, read this rank. With no launcher parent (reparented to init) allowing it would
  // mean every process: do not offer. Scopes 2 and 3 need privileges: do not offer either.
  if (scope <= 0) return {0, true};
  if (scope == 1 && parent > 1) return {parent, true};
  return {0, false};
}

SingleCopy::SingleCopy(std::uint64_t threshold, bool thread_mode, int world)
    : thread_mode_(thread_mode), pid_(getpid()), by_dst_(world) {
  if (threshold == 0) return;
  if (!thread_mode_) {
    const PtracePolicy policy = ptrace_policy(yama_scope(), getppid());
    if (!policy.offer) return;
    if (policy.tracer > 0 && prctl(PR_SET_PTRACER, policy.tracer, 0, 0, 0) != 0) return;
    if (!probe_self()) return;
  }
  threshold_ = threshold;
  for (Destination& d : by_dst_) d.threshold = threshold;
}

std::chrono::nanoseconds SingleCopy::revoke_grace(std::uint64_t nbytes) {
  // 200 ms, plus 1 ns per byte (1 GB/s, several times slower than any copy measured here).
  return std::chrono::milliseconds(200) +
         std::chrono::nanoseconds(std::min<std::uint64_t>(nbytes, std::uint64_t{1} << 40));
}

void SingleCopy::fail(int dst, std::string why, OutboundMessage& msg) {
  Destination& d = by_dst_[dst];
  if (d.failure.empty()) d.failure = std::move(why);
  d.threshold = 0;  // every later message to dst comes through advance(), which fails it
  msg.offer = 0;
  msg.started = true;
  msg.sent = msg.env.nbytes;
  msg.failure = &d.failure;
}

SingleCopy::Step SingleCopy::advance(int dst, ring::RingProducer& producer,
                                     std::atomic<std::uint64_t>& state, OutboundMessage& msg) {
  if (!msg.started) {
    if (!by_dst_[dst].failure.empty()) {  // sticky: dst stopped reading this rank's ring
      msg.started = true;
      msg.sent = msg.env.nbytes;
      msg.failure = &by_dst_[dst].failure;
      return Step::Moved;
    }
    if (msg.env.nbytes < threshold_) return Step::Stream;
    // A new offer only once the receiver is through with the previous one (see the header).
    const std::uint64_t prev = state.load(std::memory_order_acquire);
    const auto prev_state = static_cast<OfferState>(prev & 7);
    if (prev != 0 && prev_state != OfferState::Done && prev_state != OfferState::Streaming)
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
  conclude(dst, now, id, msg);
  return msg.offer == 0 && !msg.done() ? Step::Stream : Step::Moved;
}

// `word` is the offer word after the receiver's final CAS for offer `id` (or a corrupt value).
void SingleCopy::conclude(int dst, std::uint64_t word, std::uint64_t id, OutboundMessage& msg) {
  msg.offer = 0;
  if (word == offer_word(id, OfferState::Done)) {
    msg.sent = msg.env.nbytes;
    msg.next += msg.env.nbytes;
    return;
  }
  if (word == offer_word(id, OfferState::Streaming)) return;  // this message streams
  if (word == offer_word(id, OfferState::Declined)) {
    by_dst_[dst].threshold = UINT64_MAX;  // it may not read us: stream everything to it
    return;
  }
  // Failed, or a state no receiver writes: the receive ended with an error on the receiver's
  // side, which stops reading this rank's ring; this send is over and says why.
  if (word == offer_word(id, OfferState::Failed))
    return fail(dst,
                "rank " + std::to_string(dst) + " could not read the " +
                    std::to_string(msg.env.nbytes) +
                    " bytes this rank offered it for a single copy (its receive failed with "
                    "PeerFailure, which says why); the message is lost, and rank " +
                    std::to_string(dst) + " takes nothing more from this rank",
                msg);
  fail(dst,
       "the single-copy offer word of the ring to rank " + std::to_string(dst) + " holds " +
           state_text(word) + " while offer #" + std::to_string(id) +
           " was outstanding: a corrupt peer or a foreign process writing the segment",
       msg);
}

bool SingleCopy::revoke(int dst, std::atomic<std::uint64_t>& state, OutboundMessage& msg) {
  if (msg.offer == 0) return true;
  const std::uint64_t id = msg.offer;
  std::uint64_t seen = offer_word(id, OfferState::Offered);
  if (state.compare_exchange_strong(seen, offer_word(id, OfferState::Revoked),
                                    std::memory_order_acq_rel, std::memory_order_acquire)) {
    msg.offer = 0;
    return true;  // the receiver never reads the buffer: stream the message
  }
  if (seen == offer_word(id, OfferState::Claimed)) return false;  // it is copying right now
  conclude(dst, seen, id, msg);
  return true;
}

bool SingleCopy::settle(int dst, std::atomic<std::uint64_t>& state, OutboundMessage& msg) {
  if (msg.offer == 0) return true;
  // Acquire pairs with the receiver's release CAS of its final state (see header).
  const std::uint64_t seen = state.load(std::memory_order_acquire);
  if (seen == offer_word(msg.offer, OfferState::Claimed)) return false;
  conclude(dst, seen, msg.offer, msg);
  return true;
}

void SingleCopy::force_revoke(int dst, std::atomic<std::uint64_t>& state, OutboundMessage& msg) {
  if (msg.offer == 0) return;
  const std::uint64_t id = msg.offer;
  std::uint64_t seen = offer_word(id, OfferState::Claimed);
  // Acquire on failure: the receiver's final CAS came first; pairs with its release.
  if (state.compare_exchange_strong(seen, offer_word(id, OfferState::Revoked),
                                    std::memory_order_acq_rel, std::memory_order_acquire)) {
    msg.offer = 0;  // the receiver discards its copy: stream the message
    return;
  }
  conclude(dst, seen, id, msg);
}

void SingleCopy::abandon(OutboundMessage& msg) {
  msg.offer = 0;
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

bool SingleCopy::claim(int src, std::atomic<std::uint64_t>& state, const OfferDescriptor& d) {
  std::uint64_t seen = offer_word(d.id, OfferState::Offered);
  // Acquire: the sender's bytes, written before its record's release stamp, are visible.
  if (state.compare_exchange_strong(seen, offer_word(d.id, OfferState::Claimed),
                                    std::memory_order_acquire, std::memory_order_acquire))
    return true;
  if (seen == offer_word(d.id, OfferState::Revoked)) {
    // Acknowledge, so that the sender may post its next offer on this ring. Only we move
    // the word out of Revoked(id); a failure here means a foreign writer.
    if (state.compare_exchange_strong(seen, offer_word(d.id, OfferState::Streaming),
                                      std::memory_order_relaxed))
      return false;
  }
  bad_offer(src, "offer #" + std::to_string(d.id) + " is not open (the ring's offer word holds " +
                     state_text(seen) + "): a replayed or invented offer");
}

int SingleCopy::copy(const OfferDescriptor& d, std::byte* dest) const {
  if (thread_mode_ && d.pid == pid_) {
    if (d.length) std::memcpy(dest, reinterpret_cast<const void*>(d.address), d.length);
    return 0;
  }
  return read_peer(d.pid, d.address, dest, d.length);
}

SingleCopy::Claim SingleCopy::finish(int src, std::atomic<std::uint64_t>& state,
                                     const OfferDescriptor& d, int error, bool sender_alive) {
  OfferState outcome = OfferState::Failed;
  if (error == 0) outcome = OfferState::Done;
  else if (error == EPERM || error == ENOSYS || error == EACCES) outcome = OfferState::Declined;
  else if (error == EFAULT && sender_alive) outcome = OfferState::Streaming;
  std::uint64_t seen = offer_word(d.id, OfferState::Claimed);
  // Release: every read of the sender's buffer (the copy, sequenced before) happens before
  // the sender's acquire of this value. Relaxed on failure: we then use none of the copy.
  if (!state.compare_exchange_strong(seen, offer_word(d.id, outcome), std::memory_order_release,
                                     std::memory_order_relaxed)) {
    // The sender revoked at its deadline while we copied: discard the copy (the caller does
    // not advance `received`) and acknowledge; Continuations bring the bytes.
    if (seen == offer_word(d.id, OfferState::Revoked) &&
        state.compare_exchange_strong(seen, offer_word(d.id, OfferState::Streaming),
                                      std::memory_order_relaxed))
      return Claim::Stream;
    bad_offer(src, "offer #" + std::to_string(d.id) + " was claimed by this rank, but the ring's "
                       "offer word now holds " + state_text(seen));
  }
  if (outcome == OfferState::Done) return Claim::Copied;
  if (outcome != OfferState::Failed) return Claim::Stream;
  if (error == ESRCH)
    throw PeerFailure("rank " + std::to_string(src) + " (pid " + std::to_string(d.pid) +
                      ") ended while this rank was copying its " + std::to_string(d.length) +
                      "-byte message (single copy); the message is lost");
  throw PeerFailure("cannot read the " + std::to_string(d.length) + " bytes rank " +
                    std::to_string(src) + " offered at address " + std::to_string(d.address) +
                    " of pid " + std::to_string(d.pid) + ": " + std::strerror(error) +
                    (error == EFAULT ? ". The sender is gone or going (its memory is unmapped)"
                                     : ". The kernel refused the copy") +
                    "; the message is lost");
}

SingleCopy::Claim SingleCopy::receive(int src, std::atomic<std::uint64_t>& state,
                                      const OfferDescriptor& d, std::byte* dest,
                                      const std::function<bool()>& sender_alive) const {
  if (!claim(src, state, d)) return Claim::Stream;
  const int error = copy(d, dest);
  return finish(src, state, d, error, error == EFAULT && sender_alive());
}

}  // namespace shmdist::transport
