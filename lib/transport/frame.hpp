// Message frames: how an Envelope travels in a ring's records. A Start record's payload
// begins with a MessageHeader; this file encodes it and checks what comes back.
// A message is one Start record (MessageHeader + the first payload bytes) followed by as many
// Continuation records as its size needs. Everything read from a ring is untrusted: decoding
// checks every field and reports a corrupt frame as an exception, never reads out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <shmdist/tensor.hpp>

#include "ring/ring.hpp"
#include "transport/envelope.hpp"

namespace shmdist::transport {

struct MessageHeader {
  std::uint32_t group_id;   // 0 = world; new_group() numbers groups in creation order
  std::uint32_t group_sig;  // hash of the group's member list (catches mismatched creation order)
  std::int32_t tag;
  std::uint8_t dtype;       // DType code
  std::uint8_t channel;     // 0 = user messages, 1 = the library's own (barrier), never mixed
  std::uint16_t flags;      // 0, or kFrameOffer
  std::uint64_t numel;
  std::uint64_t nbytes;
  friend bool operator==(const MessageHeader&, const MessageHeader&) = default;
};
static_assert(sizeof(MessageHeader) == 32);

// MessageHeader::flags. kFrameOffer: the record carries no payload but an offer to read it
// from the sender's memory (transport/single_copy.hpp), or, if revoked, Continuations follow.
inline constexpr std::uint16_t kFrameOffer = 1;

// Largest message the protocol accepts (1 TiB): a bigger nbytes can only come from corruption.
inline constexpr std::uint64_t kMaxMessageBytes = std::uint64_t{1} << 40;

inline MessageHeader encode_header(const Envelope& env) {
  MessageHeader h{};
  h.group_id = env.key.group_id;
  h.group_sig = env.key.group_sig;
  h.tag = env.key.tag;
  h.dtype = static_cast<std::uint8_t>(env.dtype);
  h.channel = env.key.channel;
  h.numel = env.numel;
  h.nbytes = env.nbytes;
  return h;
}

// Out-of-line, cold: work out what exactly is wrong and throw PeerFailure naming `src`.
[[noreturn]] void reject_header(const MessageHeader& raw, std::uint64_t record_length, int src);
[[noreturn]] void reject_record(std::uint16_t kind, std::uint64_t length, std::uint64_t max_length,
                                bool in_message, std::uint64_t bytes_remaining, int src);

// Validates a Start record whose payload (record_length bytes) begins with `raw`.
// Throws PeerFailure naming `src` and the bad field if anything is inconsistent.
inline Envelope decode_header(const MessageHeader& raw, std::uint64_t record_length, int src) {
  // numel <= 2^40 and element sizes <= 8 keep the product far from overflow.
  const bool ok = record_length >= sizeof(MessageHeader) && raw.dtype < kNumDTypes &&
                  raw.flags <= kFrameOffer &&
                  raw.tag >= 0 && raw.channel <= kInternalChannel &&
                  raw.nbytes <= kMaxMessageBytes && raw.numel <= kMaxMessageBytes &&
                  raw.numel * detail::kDTypeSize[raw.dtype] == raw.nbytes &&
                  record_length - sizeof(MessageHeader) <= raw.nbytes;
  if (!ok) [[unlikely]]
    reject_header(raw, record_length, src);
  Envelope env;
  env.src = src;
  env.key = {raw.group_id, raw.group_sig, raw.tag, raw.channel};
  env.dtype = static_cast<DType>(raw.dtype);
  env.numel = raw.numel;
  env.nbytes = raw.nbytes;
  return env;
}

// Validates a record's kind and length against the ring's limit and the bytes the message in
// progress still owes (`in_message`: a Continuation is expected, a Start is not).
inline void check_record(std::uint16_t kind, std::uint64_t length, std::uint64_t max_length,
                         bool in_message, std::uint64_t bytes_remaining, int src) {
  const bool start = kind == static_cast<std::uint16_t>(ring::RecordKind::Start);
  const bool continuation = kind == static_cast<std::uint16_t>(ring::RecordKind::Continuation);
  const bool ok = length <= max_length &&
                  (start ? !in_message
                         : continuation && in_message && length > 0 && length <= bytes_remaining);
  if (!ok) [[unlikely]]
    reject_record(kind, length, max_length, in_message, bytes_remaining, src);
}

}  // namespace shmdist::transport
