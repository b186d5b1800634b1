// A receive's consumer (transport::ByteConsumer) for tests: keeps what it is handed and
// whether it came in order, every byte once (each piece starting where the last one ended).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "transport/transport.hpp"

namespace shmdist::test {

struct RecordingConsumer final : transport::ByteConsumer {
  std::vector<std::byte> bytes;
  bool in_order = true;
  void consume(std::uint64_t at, std::span<const std::byte> piece) override {
    in_order = in_order && at == bytes.size();
    bytes.insert(bytes.end(), piece.begin(), piece.end());
  }
};

}  // namespace shmdist::test
