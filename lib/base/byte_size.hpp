// Byte sizes on command lines and in variables: "65536", "64K", "64KiB", "1M", "1MiB", "1G"
// (powers of 1024). Throws SetupError naming `what` (for example "--ring-size" or
// "SHMDIST_RING_SIZE") otherwise.
#pragma once

#include <cstdint>
#include <string>

namespace shmdist::env {
std::uint64_t parse_byte_size(const std::string& text, const std::string& what);
}
