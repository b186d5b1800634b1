#include "transport/frame.hpp"

#include "tensor/dtype_check.hpp"

namespace shmdist::transport {
namespace {

[[noreturn]] [[gnu::cold]] void corrupt(int src, const std::string& what) {
  throw PeerFailure("corrupt frame from rank " + std::to_string(src) + ": " + what +
                    ". The peer wrote something the protocol forbids (a bug, memory corruption "
                    "or a foreign process writing the segment); the job cannot continue safely.");
}

}  // namespace

void reject_header(const MessageHeader& raw, std::uint64_t record_length, int src) {
  if (record_length < sizeof(MessageHeader))
    corrupt(src, "a message record of " + std::to_string(record_length) +
                     " bytes, shorter than its " + std::to_string(sizeof(MessageHeader)) +
                     "-byte header");
  // Not corruption but another version: a newer build appends dtypes to the table with the
  // next codes, and its frames are otherwise well formed.
  if (raw.dtype >= kNumDTypes) throw PeerFailure(detail::unknown_dtype_text(src, raw.dtype));
  if (raw.flags > kFrameOffer)
    corrupt(src, "frame flags " + std::to_string(raw.flags) + ", expected 0 or 1 (offer)");
  if (raw.tag < 0) corrupt(src, "negative tag " + std::to_string(raw.tag));
  if (raw.channel > kInternalChannel) corrupt(src, "channel " + std::to_string(raw.channel));
  const auto dtype = static_cast<DType>(raw.dtype);
  const std::uint64_t esize = detail::kDTypeSize[raw.dtype];
  if (raw.nbytes > kMaxMessageBytes)
    corrupt(src, "a message of " + std::to_string(raw.nbytes) + " bytes, above the " +
                     std::to_string(kMaxMessageBytes) + "-byte limit");
  if (raw.numel > kMaxMessageBytes || raw.numel * esize != raw.nbytes)
    corrupt(src, "byte count " + std::to_string(raw.nbytes) + " for " +
                     std::to_string(raw.numel) + " elements of " +
                     std::string(dtype_name(dtype)) + " (expected " +
                     std::to_string(raw.numel * esize) + ")");
  corrupt(src, "a first record carrying " +
                   std::to_string(record_length - sizeof(MessageHeader)) +
                   " payload bytes for a message of " + std::to_string(raw.nbytes));
}

void reject_record(std::uint16_t kind, std::uint64_t length, std::uint64_t max_length,
                   bool in_message, std::uint64_t bytes_remaining, int src) {
  if (length > max_length)
    corrupt(src, "a record of " + std::to_string(length) + " bytes in a ring that holds at most " +
                     std::to_string(max_length));
  if (kind == static_cast<std::uint16_t>(ring::RecordKind::Start))
    corrupt(src, "a new message while " + std::to_string(bytes_remaining) +
                     " bytes of the previous one were still due");
  if (kind == static_cast<std::uint16_t>(ring::RecordKind::Continuation)) {
    if (!in_message) corrupt(src, "a continuation record outside any message");
    corrupt(src, "a continuation of " + std::to_string(length) + " bytes when " +
                     std::to_string(bytes_remaining) + " were due");
  }
  corrupt(src, "record kind " + std::to_string(kind) + ", expected 1 (start) or 2 (continuation)");
}

}  // namespace shmdist::transport
