// ShmTransport's side of single copy (transport/single_copy.hpp has the protocol and why it
// is safe): where offers sit in the segment, and how they meet the ring's message stream.

#include <algorithm>
#include <chrono>
#include <utility>

#include <shmdist/errors.hpp>

#include "transport/shm_transport.hpp"

namespace shmdist::transport {

// The sender's half, from send_some for a message of at least the threshold. A message the
// ring can take whole right now is streamed as before: its send returns without waiting for
// the receiver. Only a message that would have had to wait for the receiver to drain the ring
// anyway is offered, so a send waits for its receiver in exactly the cases it did without
// single copy (a program that is safe with the ring's buffering stays safe).
SingleCopy::Step ShmTransport::advance_offer(int dst, OutboundMessage& msg) {
  const bool posting = !msg.started;
  if (posting && single_copy_.threshold(dst) != 0) {  // 0: a failed receiver, see advance()
    const std::uint64_t records = msg.env.nbytes / stream_ + 1;
    const std::uint64_t need = msg.env.nbytes + records * 2 * ring::kRecordAlign;
    if (need < segment_->ring_size() && producers_[dst].writable(need) >= need)
      return SingleCopy::Step::Stream;
  }
  const SingleCopy::Step step = single_copy_.advance(
      dst, producers_[dst], segment_->ring_control(rank_, dst).offer_state, msg);
  if (posting && step == SingleCopy::Step::Moved && !msg.failure) notify_receiver(dst);
  return step;
}

// Revokes msg's offer; if the receiver claimed it, waits asleep on this rank's doorbell (the
// receiver rings it after its final CAS: take_offer) for the copy to end, in slices that
// check whether the receiver is gone, until revoke_grace has passed. Then, between processes,
// the offer is revoked anyway (the receiver discards its copy, single_copy.hpp says why that
// is safe); between threads the wait goes on, bounded by the receiver's memcpy.
void ShmTransport::release_outbound(int dst, OutboundMessage& msg) {
  auto& state = segment_->ring_control(rank_, dst).offer_state;
  if (single_copy_.revoke(dst, state, msg)) return;
  constexpr std::chrono::milliseconds kSlice{10};
  const auto deadline =
      std::chrono::steady_clock::now() + SingleCopy::revoke_grace(msg.env.nbytes);
  for (;;) {
    if (peers_health_->peer_state(dst).status == PeerStatus::Gone)
      return SingleCopy::abandon(msg);
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline && !single_copy_.thread_mode())
      return single_copy_.force_revoke(dst, state, msg);
    const std::uint32_t token = waker_->arm();
    // The re-check after arm()'s fence: a final state stored before it is seen here, one
    // stored after it rings the doorbell (wait/doorbell.hpp).
    if (single_copy_.settle(dst, state, msg)) {
      waker_->disarm();
      return;
    }
    waker_->sleep(token, deadline > now ? std::min<std::chrono::nanoseconds>(deadline - now, kSlice)
                                          : std::chrono::nanoseconds(kSlice));
    waker_->disarm();
    if (single_copy_.settle(dst, state, msg)) return;
  }
}

// The receiver's half: an offer record (a Start record with kFrameOffer) from `src`, at the
// ring's tail. Routed like any message; then the bytes are copied from the sender (Copied:
// the message is complete) or follow as Continuation records (Stream).
void ShmTransport::take_offer(int src, const ring::RecordHeader& rec, const Envelope& env,
                              InboundHandler& handler) {
  ring::RingConsumer& consumer = consumers_[src];
  Inbound& in = inbound_[src];
  OfferDescriptor d{};
  if (rec.length == kOfferRecordLength)
    consumer.copy_payload(sizeof(MessageHeader), reinterpret_cast<std::byte*>(&d), sizeof d);
  SingleCopy::check(d, env, rec.length,
                    segment_->rank_control(src).pid.load(std::memory_order_relaxed), src);
  InboundSink* sink = handler.on_message_start(env);  // may throw: the record stays for later
  in.sink = sink;
  in.env = env;
  in.remaining = env.nbytes;
  in.in_message = true;
  SingleCopy::Claim claim;
  try {
    claim = single_copy_.receive(src, segment_->ring_control(src, rank_).offer_state, d,
                                 sink->dest + sink->received,
                                 [&] {
                                   return peers_health_->peer_state(src).status !=
                                          PeerStatus::Gone;
                                 });
  } catch (const PeerFailure& e) {
    // The message cannot be delivered; nothing more from this source can be trusted to
    // follow it in order, so every later look at the source says why.
    in.failure = e.what();
    consumer.release(rec.length);
    wake_if_sleeping(src);
    throw;
  }
  consumer.release(rec.length);
  // The sender may be asleep waiting for the offer's final state (or, on Stream, for the
  // acknowledgement): the notifier half of the doorbell protocol after our release store.
  wake_if_sleeping(src);
  if (claim == SingleCopy::Claim::Stream) return;  // Continuations bring the bytes
  sink->landed(env.nbytes);
  in.remaining = 0;
  in.in_message = false;
  handler.on_message_complete(std::exchange(in.sink, nullptr), in.env);
}

}  // namespace shmdist::transport
