// Output for the test programs: one write() per line, so that the lines of ranks sharing a
// pipe never interleave, and timestamps on the steady clock (CLOCK_MONOTONIC), which every
// process on the host shares, so that tests can compare them with their own clock.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <string>

#include <shmdist/shmdist.hpp>

namespace shmdist::programs {

inline std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void write_all(int fd, const std::string& text) {
  for (std::size_t off = 0; off < text.size();) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n <= 0) return;
    off += static_cast<std::size_t>(n);
  }
}

// Free text goes last on a line ("what=..."): newlines in it would break the line apart.
inline std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n') c = '|';
  return text;
}

inline void emit(const std::string& line) { write_all(STDOUT_FILENO, line + "\n"); }
inline void emit_err(const std::string& line) { write_all(STDERR_FILENO, line + "\n"); }

inline const char* error_type(const std::exception& e) {
  if (dynamic_cast<const SetupError*>(&e)) return "SetupError";
  if (dynamic_cast<const InvalidArgument*>(&e)) return "InvalidArgument";
  if (dynamic_cast<const PeerFailure*>(&e)) return "PeerFailure";
  if (dynamic_cast<const Timeout*>(&e)) return "Timeout";
  if (dynamic_cast<const NotInitialized*>(&e)) return "NotInitialized";
  if (dynamic_cast<const Error*>(&e)) return "Error";
  return "std::exception";
}

// Exit codes the tests look for.
inline constexpr int kExitCaughtPeerFailure = 42;
inline constexpr int kExitShmdistError = 3;    // an unexpected shmdist::Error (ERROR line)
inline constexpr int kExitOtherError = 4;      // anything else thrown
inline constexpr int kExitUnexpected = 5;      // a call succeeded that should have failed, bad data

// Runs a program body; an error that escapes is printed as an ERROR line and becomes exit
// code 3 (shmdist::Error) or 4, never an abort.
template <class Body>
int run_main(Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    emit(std::string("ERROR type=") + error_type(e) + " what=" + one_line(e.what()));
    return dynamic_cast<const Error*>(&e) ? kExitShmdistError : kExitOtherError;
  }
}

inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

}  // namespace shmdist::programs
