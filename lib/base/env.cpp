#include "base/env.hpp"

#include <cerrno>
#include <cstdlib>

#include <shmdist/errors.hpp>

namespace shmdist::env {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

long long parse_int(const char* name, const std::string& value, long long min, long long max,
                    const char* hint) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  const bool number = !value.empty() && end && *end == '\0' && errno == 0;
  if (!number || v < min || v > max)
    throw SetupError("environment variable " + std::string(name) + "='" + value + "' is " +
                     (number ? "out of range" : "not an integer") + ": expected an integer from " +
                     std::to_string(min) + " to " + std::to_string(max) + ". " + hint);
  return v;
}

std::optional<long long> get_int(const char* name, long long min, long long max) {
  auto v = get(name);
  if (!v) return std::nullopt;
  return parse_int(name, *v, min, max);
}

}  // namespace shmdist::env
