// Message frames: what a Start record's payload begins with, and how to check it.
// A message is one Start record (MessageHeader + the first payload bytes) followed by as many
// Continuation records as its size needs. Everything read from a ring is untrusted: decoding
// checks every field and reports a corrupt frame as an exception, never reads out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <shmdist/tensor.hpp>

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
// Bytes per element by dtype code (the tests check it against element_size()); a table here
// keeps the per-message checks free of calls.
inline constexpr std::uint64_t kElementSize[kNumDTypes] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8};
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

MessageHeader encode_header(const Envelope& env);

// Validates a Start record whose payload (record_length bytes) begins with `raw`.
// Throws PeerFailure naming `src` and the bad field if anything is inconsistent.
Envelope decode_header(const MessageHeader& raw, std::uint64_t record_length, int src);

// Validates a record's length against the ring's limit and the bytes the message still owes.
// `in_message` says whether a message is being streamed (so a Continuation is expected).
void check_record(std::uint16_t kind, std::uint64_t length, std::uint64_t max_length,
                  bool in_message, std::uint64_t bytes_remaining, int src);

}  // namespace shmdist::ring
