#include "base/byte_size.hpp"

#include <cstdint>

#include <shmdist/errors.hpp>

namespace shmdist::env {

std::uint64_t parse_byte_size(const std::string& text, const std::string& what) {
  std::size_t i = 0;
  std::uint64_t value = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    if (value > (std::uint64_t{1} << 50))
      throw SetupError(what + " = '" + text + "' is too large");
    value = value * 10 + std::uint64_t(text[i] - '0');
    ++i;
  }
  std::string unit = text.substr(i);
  std::uint64_t scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "K" || unit == "KiB" || unit == "k") scale = std::uint64_t{1} << 10;
  else if (unit == "M" || unit == "MiB") scale = std::uint64_t{1} << 20;
  else if (unit == "G" || unit == "GiB") scale = std::uint64_t{1} << 30;
  if (i == 0 || scale == 0)
    throw SetupError(what + " = '" + text +
                     "' is not a byte size: expected a number with an optional K, M or G "
                     "suffix (powers of 1024), for example 65536, 64K or 1M");
  if (value > UINT64_MAX / scale)
    throw SetupError(what + " = '" + text + "' is too large: a ring holds at most 1G");
  return value * scale;
}

}  // namespace shmdist::env
