// A lock-free single-producer / single-consumer byte ring in shared memory, carrying records.
//
// A record starts on a 64-byte boundary: a 16-byte RecordHeader, then `length` payload bytes
// (which may wrap around the end of the ring), padded to 64. The consumer never reads the
// producer's index: it finds the next record by its stamp, which the producer writes last,
// with release, once the record is complete. A small message is one cache line that carries
// both the data and the "it is there" signal, so a hand-off costs one line transfer.
//
// Stamps: the record at absolute byte position p carries stamp p + 1 (never 0). Before it
// publishes the record [p, p+s), the producer writes 0 into the stamp slot at p + s, the next
// record's position. So the slot the consumer polls always holds either 0 or the stamp of a
// complete record: never stale bytes of an older lap, whatever the payloads contained. This
// needs 64 free bytes beyond each record, which writable() accounts for.
//
// Indices are absolute 64-bit byte counts (they never wrap in practice); positions in the
// data area are index & mask. The shared `tail` is written only by the consumer and the
// producer keeps a private cached copy, reloading it only when the ring looks full.
//
// Trust: the other side of a ring is another process. Both sides start at position 0 (the
// segment is zero-filled and each rank joins once) and keep their own position privately, so
// a record always starts 64-aligned and its first 64 bytes never wrap. The only shared index
// either side reads is the producer's reload of `tail`, and a value that cannot be (ahead of
// the head, more than a ring behind it, or not 64-aligned) is a corrupt peer: PeerFailure
// naming the ring. The consumer reads only stamps and records, and checks every record.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "segment/layout.hpp"

namespace shmdist::ring {

inline constexpr std::size_t kRecordAlign = 64;

enum class RecordKind : std::uint16_t {
  Start = 1,         // payload begins with a message header (transport/frame.hpp)
  Continuation = 2,  // more payload bytes of the message in progress
};

struct RecordHeader {
  std::uint64_t stamp;   // position + 1, written last (atomic_ref, release)
  std::uint32_t length;  // payload bytes that follow the header
  std::uint16_t kind;    // RecordKind
  std::uint16_t reserved;
};
static_assert(sizeof(RecordHeader) == 16);

inline constexpr std::uint64_t padded_record_size(std::uint64_t payload) {
  return (sizeof(RecordHeader) + payload + kRecordAlign - 1) & ~std::uint64_t{kRecordAlign - 1};
}

// memcpy for the small payloads of the fast path: up to 16 bytes in two overlapping
// fixed-size copies (a few moves instead of a library call), anything longer by memcpy.
// GCC's -Warray-bounds sees every branch once this is inlined with a constant-size source
// (under AddressSanitizer's code generation), including those n rules out: a false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#pragma GCC diagnostic ignored "-Wstringop-overread"
#endif
inline void copy_bytes(std::byte* dst, const std::byte* src, std::size_t n) {
  if (n >= 8 && n <= 16) {
    std::memcpy(dst, src, 8);
    std::memcpy(dst + n - 8, src + n - 8, 8);
  } else if (n >= 4 && n < 8) {
    std::memcpy(dst, src, 4);
    std::memcpy(dst + n - 4, src + n - 4, 4);
  } else if (n < 4) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = src[i];  // also n == 0 with null pointers
  } else {
    std::memcpy(dst, src, n);
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// Copies linear memory into the ring's data area, splitting at the wrap point (the way back is
// RingConsumer::visit_payload).
inline void copy_into_ring(std::byte* data, std::uint64_t mask, std::uint64_t pos,
                           const std::byte* src, std::size_t n) {
  const std::uint64_t off = pos & mask;
  const std::size_t first = std::min<std::uint64_t>(n, mask + 1 - off);
  copy_bytes(data + off, src, first);
  if (first < n) std::memcpy(data, src + first, n - first);
}

// Throws PeerFailure naming the ring from `src` to `dst` (out of line, cold).
[[noreturn]] void reject_tail(int src, int dst, std::uint64_t tail, std::uint64_t head,
                              std::uint64_t size);

inline std::atomic_ref<std::uint64_t> stamp_at(std::byte* data, std::uint64_t mask,
                                               std::uint64_t pos) {
  return std::atomic_ref<std::uint64_t>(
      *reinterpret_cast<std::uint64_t*>(static_cast<void*>(data + (pos & mask))));
}

class RingProducer {
 public:
  RingProducer() = default;
  // `src` and `dst` only name the ring in errors. Starts at position 0 whatever the shared
  // fields say (the transport refuses a segment in which they are not 0 when a rank joins).
  RingProducer(segment::RingControl* control, std::byte* data, std::uint64_t size, int src = -1,
               int dst = -1)
      : control_(control), data_(data), mask_(size - 1), src_(src), dst_(dst) {}

  // Most payload bytes one record could carry now (up to `want`), given the free space.
  // Reloads the consumer's tail only when the cached copy says there is not enough room.
  std::size_t writable(std::size_t want) {
    std::size_t room = room_for_payload(cached_tail_);
    if (room < want) {
      // Acquire pairs with the consumer's release of `tail`: everything it read from the
      // space it freed happened before we overwrite that space.
      const std::uint64_t tail = control_->tail.load(std::memory_order_acquire);
      // Untrusted: a tail outside [head - size, head] or off the record grid would make the
      // free-space arithmetic wrap (and records overwrite unread ones).
      if (tail > head_ || head_ - tail > mask_ + 1 || (tail & (kRecordAlign - 1)) != 0)
          [[unlikely]]
        reject_tail(src_, dst_, tail, head_, mask_ + 1);
      cached_tail_ = tail;
      room = room_for_payload(cached_tail_);
    }
    return room < want ? room : want;
  }

  // Writes one record (header bytes `prefix`, then `payload`) and publishes it.
  // Caller must have checked writable() >= prefix.size() + payload.size().
  void publish(RecordKind kind, std::span<const std::byte> prefix,
               std::span<const std::byte> payload) {
    write_record(kind, prefix.size() + payload.size(), [&](std::uint64_t at) {
      copy_into_ring(data_, mask_, at, prefix.data(), prefix.size());
      copy_into_ring(data_, mask_, at + prefix.size(), payload.data(), payload.size());
    });
  }

  // publish() for a record whose prefix is a fixed-size header (the common small message):
  // the prefix copy is a few stores, never a wrap (it lies in the record's first 64 bytes).
  template <std::size_t N>
  void publish_with_header(RecordKind kind, const void* header,
                           std::span<const std::byte> payload) {
    static_assert(sizeof(RecordHeader) + N <= kRecordAlign, "header must fit the first line");
    write_record(kind, N + payload.size(), [&](std::uint64_t at) {
      std::memcpy(data_ + (at & mask_), header, N);
      copy_into_ring(data_, mask_, at + N, payload.data(), payload.size());
    });
  }

 private:
  // The one core of publish*(): the record header, then `write_body(position of the first
  // payload byte)`, then the stamps. The next record's stamp slot is invalidated first
  // (relaxed is enough: the release store of this record's stamp orders it, and the body,
  // before the stamp that makes this record visible).
  template <class WriteBody>
  void write_record(RecordKind kind, std::uint64_t length, WriteBody&& write_body) {
    const std::uint64_t pos = head_;
    const std::uint64_t next = pos + padded_record_size(length);
    RecordHeader* rec = reinterpret_cast<RecordHeader*>(static_cast<void*>(data_ + (pos & mask_)));
    rec->length = static_cast<std::uint32_t>(length);
    rec->kind = static_cast<std::uint16_t>(kind);
    rec->reserved = 0;
    write_body(pos + sizeof(RecordHeader));
    stamp_at(data_, mask_, next).store(0, std::memory_order_relaxed);
    stamp_at(data_, mask_, pos).store(pos + 1, std::memory_order_release);
    head_ = next;
    control_->head_hint.store(next, std::memory_order_relaxed);
  }

  // Free bytes for a record's payload: the record, its padding and the next stamp slot must
  // all lie in space the consumer has released.
  std::size_t room_for_payload(std::uint64_t tail) const {
    const std::uint64_t used = head_ - tail;
    const std::uint64_t free = mask_ + 1 - used;
    const std::uint64_t overhead = sizeof(RecordHeader) + kRecordAlign;  // header + next slot
    if (free < overhead + kRecordAlign) return 0;
    // Round down so that padding never needs bytes we do not have.
    return static_cast<std::size_t>(((free - kRecordAlign) & ~std::uint64_t{kRecordAlign - 1}) -
                                    sizeof(RecordHeader));
  }

  segment::RingControl* control_ = nullptr;
  std::byte* data_ = nullptr;
  std::uint64_t mask_ = 0;
  std::uint64_t head_ = 0;
  std::uint64_t cached_tail_ = 0;
  int src_ = -1;
  int dst_ = -1;
};

// The consumer side. peek() looks at the record at the private tail; release() moves past it;
// publish() makes the freed space visible to the producer.
class RingConsumer {
 public:
  RingConsumer() = default;
  // Starts at position 0 (see "Trust" above): never at a position read from shared memory.
  RingConsumer(segment::RingControl* control, std::byte* data, std::uint64_t size)
      : control_(control), data_(data), mask_(size - 1) {}

  // The record at the tail, or nullptr if the producer has not published one yet.
  // Acquire pairs with the producer's release of the stamp: the whole record is visible.
  const RecordHeader* peek() const {
    if (stamp_at(data_, mask_, tail_).load(std::memory_order_acquire) != tail_ + 1) return nullptr;
    return reinterpret_cast<const RecordHeader*>(static_cast<const void*>(data_ + (tail_ & mask_)));
  }
  // Largest `length` a record can legally have in this ring; larger means a corrupt peer.
  std::uint64_t max_record_length() const {
    return mask_ + 1 - kRecordAlign - sizeof(RecordHeader);
  }

  // Copies `n` payload bytes starting at payload offset `offset` of the record at the tail.
  void copy_payload(std::uint64_t offset, std::byte* dst, std::size_t n) const {
    visit_payload(offset, n, [&](std::span<const std::byte> part) {
      copy_bytes(dst, part.data(), part.size());
      dst += part.size();
    });
  }
  // Calls visit(span) for the `n` payload bytes from payload offset `offset` of the record at
  // the tail, where they lie in the ring: one span, or two where the record wraps around.
  // As for copy_payload: peek()'s acquire made the bytes visible, and the producer writes
  // them again only after publish()'s release store of a tail past them (its acquire in
  // writable()), so visit must be done with them before release() and publish().
  template <class Visit>
  void visit_payload(std::uint64_t offset, std::size_t n, Visit&& visit) const {
    const std::uint64_t off = (tail_ + sizeof(RecordHeader) + offset) & mask_;
    const std::size_t first = std::min<std::uint64_t>(n, mask_ + 1 - off);
    visit(std::span<const std::byte>(data_ + off, first));
    if (first < n) visit(std::span<const std::byte>(data_, n - first));
  }
  // Pointer to a payload prefix that lies within the record's first 64 bytes (never wraps).
  const std::byte* payload_prefix() const {
    return data_ + ((tail_ + sizeof(RecordHeader)) & mask_);
  }

  void release(std::uint32_t length) { tail_ += padded_record_size(length); }

  // Publishes the private tail; returns false if there was nothing new to publish.
  // Release pairs with the producer's acquire in writable().
  bool publish() {
    if (tail_ == published_) return false;
    control_->tail.store(tail_, std::memory_order_release);
    published_ = tail_;
    return true;
  }

  // Whether the producer has published bytes past what we consumed (diagnostics/liveness).
  std::uint64_t tail() const { return tail_; }

 private:
  segment::RingControl* control_ = nullptr;
  std::byte* data_ = nullptr;
  std::uint64_t mask_ = 0;
  std::uint64_t tail_ = 0;
  std::uint64_t published_ = 0;
};

}  // namespace shmdist::ring
