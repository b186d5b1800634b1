// Message frames: what a Start record's payload begins with, and how to check it.
// A message is one Start record (MessageHeader + the first payload bytes) followed by as many
// Continuation records as its size needs. Everything read from a ring is untrusted: decoding
// checks every field and reports a corrupt frame as an exception, never reads out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <shmdist/tensor.hpp>

#include "ring/ring.hpp"

namespace shmdist::ring {

struct MessageHeader {
  std::uint32_t group_id;   // 0 = world; new_group() numbers groups in creation order
  std::uint32_t group_sig;  // hash of the group's member list (catches mismatched creation order)
  std::int32_t tag;
  std::uint8_t dtype;       // DType code
  std::uint8_t channel;     // 0 = user messages, 1 = the library's own (barrier), never mixed
  std::uint16_t reserved1;
  std::uint64_t numel;
  std::uint64_t nbytes;
};
static_assert(sizeof(MessageHeader) == 32);

// Largest message the protocol accepts (1 TiB): a bigger nbytes can only come from corruption.
inline constexpr std::uint64_t kMaxMessageBytes = std::uint64_t{1} << 40;
inline constexpr std::uint8_t kUserChannel = 0;
inline constexpr std::uint8_t kInternalChannel = 1;

// Who sent a message and what it carries: the matching key plus the data description.
struct Envelope {
  int src = -1;  // global rank
  std::uint32_t group_id = 0;
  std::uint32_t group_sig = 0;
  int tag = 0;
  std::uint8_t channel = 0;
  DType dtype = DType::UInt8;
  std::uint64_t numel = 0;
  std::uint64_t nbytes = 0;
};

inline MessageHeader encode_header(const Envelope& env) {
  MessageHeader h{};
  h.group_id = env.group_id;
  h.group_sig = env.group_sig;
  h.tag = env.tag;
  h.dtype = static_cast<std::uint8_t>(env.dtype);
  h.channel = env.channel;
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
                  raw.tag >= 0 && raw.channel <= kInternalChannel &&
                  raw.nbytes <= kMaxMessageBytes && raw.numel <= kMaxMessageBytes &&
                  raw.numel * detail::kDTypeSize[raw.dtype] == raw.nbytes &&
                  record_length - sizeof(MessageHeader) <= raw.nbytes;
  if (!ok) [[unlikely]]
    reject_header(raw, record_length, src);
  Envelope env;
  env.src = src;
  env.group_id = raw.group_id;
  env.group_sig = raw.group_sig;
  env.tag = raw.tag;
  env.channel = raw.channel;
  env.dtype = static_cast<DType>(raw.dtype);
  env.numel = raw.numel;
  env.nbytes = raw.nbytes;
  return env;
}

// Validates a record's kind and length against the ring's limit and the bytes the message in
// progress still owes (`in_message`: a Continuation is expected, a Start is not).
inline void check_record(std::uint16_t kind, std::uint64_t length, std::uint64_t max_length,
                         bool in_message, std::uint64_t bytes_remaining, int src) {
  const bool start = kind == static_cast<std::uint16_t>(RecordKind::Start);
  const bool continuation = kind == static_cast<std::uint16_t>(RecordKind::Continuation);
  const bool ok = length <= max_length &&
                  (start ? !in_message
                         : continuation && in_message && length > 0 && length <= bytes_remaining);
  if (!ok) [[unlikely]]
    reject_record(kind, length, max_length, in_message, bytes_remaining, src);
}

}  // namespace shmdist::ring
