// Every error shmdist throws derives from shmdist::Error (itself std::runtime_error).
// Messages say what was expected, what was found, and what to do.
#pragma once

#include <stdexcept>
#include <string>

namespace shmdist {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed something the API cannot accept (bad rank, tag, size, dtype, ...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A blocking call waited longer than its process group's timeout.
class Timeout : public Error {
 public:
  using Error::Error;
};

// A peer died, the job was aborted, or a peer wrote something the protocol forbids.
class PeerFailure : public Error {
 public:
  using Error::Error;
};

// The environment, the shared segment (creation, attach, version) or the launcher setup is wrong.
class SetupError : public Error {
 public:
  using Error::Error;
};

// A process-group call was made before init_process_group or after destroy_process_group.
class NotInitialized : public Error {
 public:
  using Error::Error;
};

}  // namespace shmdist
