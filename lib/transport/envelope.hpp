// What a message is, as the transport carries it and the engine matches it: the match key
// (group, tag, channel), who sent it, and the description of its data. The ring below knows
// nothing of this (it moves records of bytes); frame.hpp encodes it into a Start record.
#pragma once

#include <cstdint>

#include <shmdist/tensor.hpp>

namespace shmdist::transport {

// Channels: user messages and the library's own (barrier) never match each other.
inline constexpr std::uint8_t kUserChannel = 0;
inline constexpr std::uint8_t kInternalChannel = 1;

// What a receive matches on, besides the source. group_sig does not take part in matching:
// a message whose group id matches but whose signature differs is a usage error (the ranks
// created their groups differently), which the engine reports instead of ignoring the message.
struct MatchKey {
  std::uint32_t group_id = 0;   // 0 = world; new_group() numbers groups in creation order
  std::uint32_t group_sig = 0;  // hash of the group's member list
  int tag = 0;
  std::uint8_t channel = kUserChannel;

  // The key a receive with this key takes messages of (group_sig is checked afterwards).
  bool routes(const MatchKey& message) const {
    return tag == message.tag && group_id == message.group_id && channel == message.channel;
  }
  friend bool operator==(const MatchKey&, const MatchKey&) = default;
};

// Who sent a message and what it carries: the match key plus the data description.
struct Envelope {
  int src = -1;  // global rank
  MatchKey key;
  DType dtype = DType::UInt8;
  std::uint64_t numel = 0;
  std::uint64_t nbytes = 0;
};

}  // namespace shmdist::transport
