#include "transport/shm_transport.hpp"

#include <utility>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "segment/doorbells.hpp"
#include "segment/job_state.hpp"

namespace shmdist::transport {

using segment::RankControl;
using segment::RankState;

namespace {
// A record below this size is not worth writing while more bytes are due: wait for space.
constexpr std::size_t kMinUsefulRecord = 4096;
// A message larger than this goes through the ring in records of at most this many bytes
// (header included), so that the receiver copies one record out while the sender copies the
// next one in: a 64 KiB message's two copies overlap by half instead of following each other.
// Smaller records wait less for the first one but cost more per record (a stamp and a tail
// that cross cores, a header, a release). On the 2-vCPU VM (2026-12-05, medians of 5 rounds
// against 64 KiB records) 32 KiB records made a 64 KiB ping-pong 1.18x faster and cost 0-5% at
// 1 MiB and in `bw` at 64 KiB; 16 KiB ones made a 1 MiB ping-pong 1.28x slower and `bw` at
// 64 KiB 1.2x slower, 8 KiB ones the 1 MiB ping-pong 3x slower (bench/README.md, issue 29).
constexpr std::size_t kStreamRecord = 32 << 10;
// Records taken from one ring per poll before moving on (fairness between sources).
constexpr int kRecordsPerRingPerPoll = 32;
// Hinted polls that found a ring empty before its hint is cleared. Clearing costs a heavy
// fence (membarrier: an interrupt to every CPU running a rank), so a sender merely between
// two windows of a stream must not lose its hint (with 15 senders streaming to one any-source
// receiver, 64 cleared every sender's hint in every window); an idle peer still loses it
// after well under a millisecond of polling, and a rank about to sleep clears all of them.
constexpr std::uint32_t kEmptyPollsBeforeClear = 1024;

// The first access to each page of a mapping can cost several microseconds even after the
// page tables are populated (measured ~5 us per page on this VM class: the hypervisor's
// shadow/nested page tables), which made the first lap of every ring ten times slower than
// the rest. So each rank reads one byte of every page of its own rings when it joins. A
// relaxed atomic load: a peer may already be writing into the ring.
void prefault(std::byte* data, std::uint64_t size) {
#ifdef MADV_POPULATE_WRITE
  madvise(data, size, MADV_POPULATE_WRITE);  // best effort: older kernels say EINVAL
#endif
  for (std::uint64_t off = 0; off < size; off += segment::kPage)
    __atomic_load_n(reinterpret_cast<const unsigned char*>(data + off), __ATOMIC_RELAXED);
}
}  // namespace

ShmTransport::ShmTransport(std::shared_ptr<segment::Segment> segment, int rank, bool supervised,
                           std::chrono::milliseconds liveness_interval,
                           std::uint64_t single_copy_threshold)
    : segment_(std::move(segment)),
      rank_(rank),
      world_(segment_->world_size()),
      controls_(&segment_->rank_control(0)),
      own_(&controls_[rank]),
      asymmetric_fences_(wait::register_asymmetric_fences()),
      waker_(std::make_shared<ShmWaker>(segment_, rank, asymmetric_fences_)),
      peers_health_(std::make_shared<ShmPeers>(segment_, rank, supervised, liveness_interval)),
      notifier_(segment::notifier_of(*segment_, asymmetric_fences_)),
      producers_(world_),
      consumers_(world_),
      inbound_(world_),
      single_copy_(single_copy_threshold, segment_->header().flags & segment::kThreadMode, world_) {
  for (int peer = 0; peer < world_; ++peer)
    if (peer != rank_) peers_.push_back(peer);
  const std::uint64_t ring_size = segment_->ring_size();
  chunk_ = static_cast<std::size_t>(std::min<std::uint64_t>(ring_size / 8, 64 << 10));
  stream_ = std::min(chunk_, kStreamRecord);
  check_fresh_rings();
  for (int peer = 0; peer < world_; ++peer) {
    if (peer == rank_) continue;
    producers_[peer] = ring::RingProducer(&segment_->ring_control(rank_, peer),
                                          segment_->ring_data(rank_, peer), ring_size,
                                          segment_->rank_name(rank_), segment_->rank_name(peer));
    consumers_[peer] = ring::RingConsumer(&segment_->ring_control(peer, rank_),
                                          segment_->ring_data(peer, rank_), ring_size);
  }
  // Thread mode shares the creator's mapping, which it already touched.
  if (!(segment_->header().flags & segment::kThreadMode)) {
    for (int peer = 0; peer < world_; ++peer) {
      if (peer == rank_) continue;
      prefault(segment_->ring_data(rank_, peer), ring_size);
      prefault(segment_->ring_data(peer, rank_), ring_size);
    }
  }
  // Claim the rank's slot; a second claimant (a duplicated RANK) is a setup error.
  std::uint32_t empty = static_cast<std::uint32_t>(RankState::Empty);
  if (!own_->state.compare_exchange_strong(empty, static_cast<std::uint32_t>(RankState::Running),
                                           std::memory_order_acq_rel))
    throw SetupError("rank " + std::to_string(segment_->rank_name(rank_)) +
                     " of this job was already claimed by another process or thread; each rank "
                     "joins once (is RANK duplicated, or init_process_group called twice?)");
  own_->pid.store(getpid(), std::memory_order_relaxed);
  waker_->announce();
  segment_->header().attached.fetch_add(1, std::memory_order_acq_rel);
}

// The positions this rank's rings start at are 0 (zero-filled segment, one join per rank),
// and the ring objects never take them from shared memory; so is the single-copy offer word
// of each ring out of this rank (its consumer writes it only in answer to an offer). Values
// that are not 0 when we join mean another process wrote them: refuse the job rather than
// run on a segment someone corrupts. (The head and offer word of a ring *into* this rank may
// be anything: its producer can have published or offered already.)
void ShmTransport::check_fresh_rings() const {
  auto refuse = [&](int src, int dst, const char* field, std::uint64_t value) {
    throw SetupError("the ring from rank " + std::to_string(segment_->rank_name(src)) +
                     " to rank " + std::to_string(segment_->rank_name(dst)) + " has " + field +
                     " " + std::to_string(value) + " before rank " +
                     std::to_string(segment_->rank_name(rank_)) +
                     " joined; a fresh segment has 0 there. Another process wrote into this "
                     "job's segment (a buggy or foreign peer): start the job again.");
  };
  for (int peer = 0; peer < world_; ++peer) {
    if (peer == rank_) continue;
    const auto& out = segment_->ring_control(rank_, peer);
    const auto& in = segment_->ring_control(peer, rank_);
    if (const auto v = out.head_hint.load(std::memory_order_relaxed)) refuse(rank_, peer, "head", v);
    if (const auto v = out.tail.load(std::memory_order_relaxed)) refuse(rank_, peer, "tail", v);
    // The offer word of a ring is written by its consumer only in answer to an offer.
    if (const auto v = out.offer_state.load(std::memory_order_relaxed))
      refuse(rank_, peer, "single-copy offer word", v);
    if (const auto v = in.tail.load(std::memory_order_relaxed)) refuse(peer, rank_, "tail", v);
  }
}

ShmTransport::~ShmTransport() = default;

Link make_shm_link(std::shared_ptr<segment::Segment> segment, int rank, bool supervised,
                   std::chrono::milliseconds liveness_interval,
                   std::uint64_t single_copy_threshold) {
  auto shm = std::make_unique<ShmTransport>(std::move(segment), rank, supervised,
                                            liveness_interval, single_copy_threshold);
  Link link{shm->peers(), shm->waker(), nullptr};
  link.bytes = std::move(shm);
  return link;
}

// ---- inbound --------------------------------------------------------------------------------

bool ShmTransport::poll(InboundHandler& handler, int preferred, bool full_scan) {
  bool moved = false;
  if (preferred >= 0 && preferred != rank_) moved |= drain(preferred, handler);
  if (full_scan) {
    for (int i = 0; i < world_; ++i) {
      const int src = (cursor_ + i) % world_;
      if (src == rank_ || src == preferred) continue;
      if (drain(src, handler)) moved = true;
      else clear_hint_if_empty(src);
    }
  } else if (world_ > 2 || preferred < 0) {
    visit_hinted(preferred, [&](int src) {
      if (drain(src, handler)) {
        inbound_[src].empty_polls = 0;
        moved = true;
      } else {
        note_empty_poll(src);
      }
      return false;  // visit every hinted source
    });
  }
  cursor_ = cursor_ + 1 == world_ ? 0 : cursor_ + 1;
  return moved;
}

// The one hinted-source scan (poll and receive_direct_any): calls visit(src) for each source
// but `skip` and this rank whose ready hint is set, in rotated order from cursor_ ([cursor_,
// world_), then [0, cursor_)) so that no sender starves, until visit returns true. Returns
// whether it stopped early. The hint is only a hint (the ring's stamps decide), so relaxed
// loads are enough.
template <class Visit>
bool ShmTransport::visit_hinted(int skip, Visit&& visit) {
  const int ranges[2][2] = {{cursor_, world_}, {0, cursor_}};
  for (const auto& [lo, hi] : ranges) {
    for (int w = lo / 64; w * 64 < hi; ++w) {
      std::uint64_t bits = own_->ready[w].load(std::memory_order_relaxed);
      const int base = w * 64;
      if (lo > base) bits &= ~std::uint64_t{0} << (lo - base);
      if (hi - base < 64) bits &= (std::uint64_t{1} << (hi - base)) - 1;
      for (const int not_this : {skip, rank_})
        if (not_this >= base && not_this < base + 64)
          bits &= ~(std::uint64_t{1} << (not_this - base));
      while (bits) {
        const int src = base + std::countr_zero(bits);
        bits &= bits - 1;
        if (visit(src)) return true;
      }
    }
  }
  return false;
}

// A hinted source had nothing: idle peers' hints go away after a while, so that they cost
// the scans nothing.
void ShmTransport::note_empty_poll(int src) {
  if (++inbound_[src].empty_polls >= kEmptyPollsBeforeClear) clear_hint_if_empty(src);
}

// Clears a source's hint, then looks again: a sender that published before our clear but
// read the hint as still set did not set it again, so the second look must find its record.
// The receiver's half of a store-buffering handshake: we clear (an RMW), fence (seq_cst, or
// heavy when senders may use light ones: wait/fence.hpp), then load the stamp; the sender
// stores its stamp (release), fences (F_n in wait::Notifier::notify), then loads the hint.
// The two fences are ordered (in S, or by the membarrier's contract): if ours
// comes first, the sender's hint load sees our clear (or later) and sets the bit again; if
// the sender's comes first, our peek sees its stamp. A seq_cst RMW followed by an acquire
// load of another object gives no such guarantee in the C++ model, hence the fence (a cold
// path: it runs only after kEmptyPollsBeforeClear empty polls of that source).
void ShmTransport::clear_hint_if_empty(int src) {
  auto& word = own_->ready[src / 64];
  const std::uint64_t bit = std::uint64_t{1} << (src % 64);
  if (!(word.load(std::memory_order_relaxed) & bit)) return;
  if (inbound_[src].in_message) return;  // keep hinting while a message streams in
  word.fetch_and(~bit, std::memory_order_relaxed);
  // Senders may use a light F_n towards us when our doorbell announced heavy fences: then
  // this fence must be heavy too (membarrier), else a full one.
  if (asymmetric_fences_) {
    if (!wait::heavy_fence()) [[unlikely]] {
      // No membarrier: a sender that used a light fence may not have seen our clear, so
      // keep the hint set (a spurious hint costs one empty look; a lost one, a stall).
      word.fetch_or(bit, std::memory_order_relaxed);
      return;
    }
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  inbound_[src].empty_polls = 0;
  if (consumers_[src].peek() != nullptr) word.fetch_or(bit, std::memory_order_relaxed);
}

bool ShmTransport::drain(int src, InboundHandler& handler) {
  if (!inbound_[src].failure.empty()) [[unlikely]]
    throw PeerFailure(inbound_[src].failure);
  ring::RingConsumer& consumer = consumers_[src];
  int taken = 0;
  while (taken < kRecordsPerRingPerPoll) {
    const ring::RecordHeader* rec = consumer.peek();
    if (rec == nullptr) break;
    consume_record(src, *rec, handler);
    ++taken;
  }
  if (taken > 0 && !inbound_[src].dirty) {
    inbound_[src].dirty = true;
    dirty_sources_.push_back(src);
  }
  return taken > 0;
}

void ShmTransport::consume_record(int src, const ring::RecordHeader& rec_in_ring,
                                  InboundHandler& handler) {
  ring::RingConsumer& consumer = consumers_[src];
  Inbound& in = inbound_[src];
  // Read the header fields once: the peer's memory is untrusted and could change under us.
  ring::RecordHeader rec;
  std::memcpy(&rec, &rec_in_ring, sizeof rec);
  check_record(rec.kind, rec.length, consumer.max_record_length(), in.in_message,
                     in.remaining, src);
  std::uint64_t offset = 0;
  if (rec.kind == static_cast<std::uint16_t>(ring::RecordKind::Start)) {
    MessageHeader raw;
    std::memcpy(&raw, consumer.payload_prefix(), sizeof raw);  // within the first 64 bytes
    const Envelope env = decode_header(raw, rec.length, src);
    if (raw.flags & kFrameOffer) [[unlikely]]
      return take_offer(src, rec, env, handler);
    InboundSink* sink = handler.on_message_start(env);  // may throw: record stays for later
    in.sink = sink;
    in.env = env;
    in.remaining = env.nbytes;
    in.in_message = true;
    offset = sizeof(MessageHeader);
  }
  const std::uint64_t n = rec.length - offset;
  if (n > 0) {
    InboundSink& sink = *in.sink;
    if (sink.consumer) {
      consumer.visit_payload(offset, n, [&](std::span<const std::byte> bytes) {
        sink.consumer->consume(sink.received, bytes);
        sink.received += bytes.size();
      });
    } else {
      consumer.copy_payload(offset, sink.dest + sink.received, n);
      sink.received += n;
    }
    in.remaining -= n;
  }
  consumer.release(rec.length);
  if (in.remaining == 0) {
    in.in_message = false;
    InboundSink* sink = std::exchange(in.sink, nullptr);
    handler.on_message_complete(sink, in.env);
  }
}

DirectResult ShmTransport::receive_direct(int src, const Expectation& want) {
  ring::RingConsumer& consumer = consumers_[src];
  const ring::RecordHeader* in_ring = consumer.peek();
  if (in_ring == nullptr) return DirectResult::Empty;
  if (inbound_[src].in_message) return DirectResult::Other;
  // Copy what we compare out of the untrusted ring once. A record that equals the (valid)
  // expectation in every field passes every check of check_record/decode_header, except the
  // ring's own length limit, which is checked here.
  ring::RecordHeader rec;
  std::memcpy(&rec, in_ring, sizeof rec);
  MessageHeader raw;
  std::memcpy(&raw, consumer.payload_prefix(), sizeof raw);
  const bool exact = rec.kind == static_cast<std::uint16_t>(ring::RecordKind::Start) &&
                     rec.length == sizeof raw + want.env.nbytes &&
                     rec.length <= consumer.max_record_length() &&
                     raw == encode_header(want.env);
  if (!exact) return DirectResult::Other;
  if (want.env.nbytes) consumer.copy_payload(sizeof raw, want.dest, want.env.nbytes);
  consumer.release(rec.length);
  // Publish the freed space and wake the producer if it sleeps for space: flush() for this
  // one ring (an earlier poll may have left others to publish; they go in the next flush).
  consumer.publish();
  notifier_.notify(std::span<const int>(&src, 1));
  return DirectResult::Received;
}

int ShmTransport::receive_direct_any(const Expectation& want, DirectResult& result) {
  int from = -1;
  result = DirectResult::Empty;
  visit_hinted(-1, [&](int src) {
    const DirectResult r = receive_direct(src, want);
    if (r == DirectResult::Empty) {
      note_empty_poll(src);
      return false;
    }
    inbound_[src].empty_polls = 0;
    result = r;
    if (r == DirectResult::Received) {
      from = src;
      cursor_ = src + 1 == world_ ? 0 : src + 1;
    }
    return true;
  });
  return from;
}

void ShmTransport::flush() {
  if (dirty_sources_.empty()) return;
  for (int src : dirty_sources_) {
    consumers_[src].publish();
    inbound_[src].dirty = false;
  }
  // One fence for all rings, then wake each producer that sleeps waiting for space.
  notifier_.notify(dirty_sources_);
  dirty_sources_.clear();
}

// ---- outbound -------------------------------------------------------------------------------

bool ShmTransport::send_some(int dst, OutboundMessage& msg) {
  ring::RingProducer& producer = producers_[dst];
  if (msg.env.nbytes >= single_copy_.threshold(dst)) [[unlikely]] {
    const SingleCopy::Step step = advance_offer(dst, msg);
    if (step != SingleCopy::Step::Stream) return step == SingleCopy::Step::Moved;
  }
  // The common case first: the whole message fits in one record, and there is room now.
  if (!msg.started) {
    const std::size_t total = sizeof(MessageHeader) + msg.env.nbytes;
    if (total <= stream_ && producer.writable(total) >= total) {
      const MessageHeader header = encode_header(msg.env);
      producer.publish_with_header<sizeof header>(ring::RecordKind::Start, &header,
                                                  {msg.next, msg.env.nbytes});
      msg.started = true;
      msg.sent = msg.env.nbytes;
      msg.next += msg.env.nbytes;
      notify_receiver(dst);
      return true;
    }
  }
  // Larger messages stream in records of at most stream_ bytes; the receiver is told after
  // the first one (a sleeping receiver wakes while we copy the rest, and copies behind us).
  bool moved = false;
  bool told = false;
  while (!msg.done()) {
    const std::uint64_t remaining = msg.env.nbytes - msg.sent;
    const std::size_t prefix = msg.started ? 0 : sizeof(MessageHeader);
    const std::size_t want = prefix + static_cast<std::size_t>(std::min<std::uint64_t>(
                                          remaining, stream_ - prefix));
    const std::size_t room = producer.writable(want);
    if (room < std::min(want, kMinUsefulRecord)) break;
    const std::size_t n = std::min(room, want) - prefix;
    const std::span<const std::byte> payload(msg.next, n);
    if (!msg.started) {
      const MessageHeader header = encode_header(msg.env);
      producer.publish(ring::RecordKind::Start,
                       std::as_bytes(std::span<const MessageHeader, 1>(&header, 1)), payload);
      msg.started = true;
    } else {
      producer.publish(ring::RecordKind::Continuation, {}, payload);
    }
    msg.sent += n;
    msg.next += n;
    if (!moved && !msg.done()) {
      notify_receiver(dst);
      told = true;
    } else {
      told = false;
    }
    moved = true;
  }
  if (moved && !told) notify_receiver(dst);
  return moved;
}

// After publishing records to `dst`: set its ready hint for our ring if clear, and wake it if
// it sleeps.
void ShmTransport::notify_receiver(int dst) {
  const std::uint64_t bit = std::uint64_t{1} << (rank_ % 64);
  // The ready hint is the sender's half of a second handshake sharing the notifier's fence
  // F_n (wait/notifier.hpp; the receiver's half is clear_hint_if_empty).
  notifier_.notify(std::span<const int>(&dst, 1), [&](int receiver) {
    auto& word = controls_[receiver].ready[rank_ / 64];
    if (!(word.load(std::memory_order_relaxed) & bit))
      word.fetch_or(bit, std::memory_order_relaxed);
  });
}

void ShmTransport::wake_if_sleeping(int peer) {
  notifier_.notify(std::span<const int>(&peer, 1));
}

}  // namespace shmdist::transport
