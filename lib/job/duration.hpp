// Durations on command lines: "30s", "500ms", "5m", "1h", "1.5s"; a bare number is seconds.
#pragma once

#include <chrono>
#include <string>

namespace shmdist::job {
std::chrono::milliseconds parse_duration(const std::string& text, const std::string& what);
}
