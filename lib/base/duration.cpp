#include "base/duration.hpp"

#include <cmath>
#include <cstdlib>

#include <shmdist/errors.hpp>

namespace shmdist::env {

std::chrono::milliseconds parse_duration(const std::string& text, const std::string& what) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  const std::string unit = end ? std::string(end) : std::string();
  double scale_ms = -1;
  if (unit.empty() || unit == "s") scale_ms = 1000;
  else if (unit == "ms") scale_ms = 1;
  else if (unit == "m" || unit == "min") scale_ms = 60'000;
  else if (unit == "h") scale_ms = 3'600'000;
  const double ms = value * scale_ms;
  if (end == text.c_str() || scale_ms < 0 || !std::isfinite(ms) || ms <= 0 || ms > 1e12)
    throw InvalidArgument(what + " = '" + text +
                          "' is not a duration: expected a positive number with an optional "
                          "unit ms, s, m or h, for example 30s, 500ms or 5m");
  return std::chrono::milliseconds(static_cast<long long>(std::llround(ms)));
}

}  // namespace shmdist::env
