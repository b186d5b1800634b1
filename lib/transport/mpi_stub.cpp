// A build without MPI: a job across hosts cannot start, and says why.

#include <shmdist/errors.hpp>

#include "transport/mpi_transport.hpp"

namespace shmdist::transport {

struct MpiSession::Handles {};

bool MpiSession::built_with_mpi() { return false; }

std::shared_ptr<MpiSession> MpiSession::start() {
  throw SetupError(
      "this job spans several hosts (or sets SHMDIST_HOST_ID), but this build of shmdist has "
      "no MPI support: CMake did not find MPI when it was built. Install Open MPI "
      "(apt-get install openmpi-bin libopenmpi-dev) and rebuild shmdist, or run every rank on "
      "one host.");
}

MpiSession::~MpiSession() = default;

void MpiSession::abandon() {}

std::vector<std::string> MpiSession::allgather(const std::string&) const { return {}; }

std::unique_ptr<RemoteTransport> make_mpi_transport(std::shared_ptr<MpiSession>,
                                                    std::vector<int>) {
  throw SetupError("this build of shmdist has no MPI support");
}

}  // namespace shmdist::transport
