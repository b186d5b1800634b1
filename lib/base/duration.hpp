// Durations on command lines and in variables: "30s", "500ms", "5m", "1h", "1.5s"; a bare
// number is seconds. Throws InvalidArgument naming `what` otherwise.
#pragma once

#include <chrono>
#include <string>

namespace shmdist::env {
std::chrono::milliseconds parse_duration(const std::string& text, const std::string& what);
}
