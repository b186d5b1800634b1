// MpiSession (mpi_transport.hpp): MPI's lifetime for shmdist, our communicator, and the
// join's exchange over it. Compiled only when CMake finds MPI.

#include <climits>
#include <cstdlib>

#include <shmdist/errors.hpp>

#include "transport/mpi_transport_impl.hpp"

namespace shmdist::transport {

bool MpiSession::built_with_mpi() { return true; }

std::shared_ptr<MpiSession> MpiSession::start() {
  std::shared_ptr<MpiSession> s(new MpiSession());
  s->handles_ = std::make_unique<Handles>();
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    // Open MPI, seeing more ranks than CPUs, makes every progress call that finds nothing
    // give the CPU away (mpi_yield_when_idle). Our calls into MPI are polls inside the
    // engine's waits, which already give the CPU away by their own policy (wait/spin.hpp:
    // when the ranks awake outnumber the CPUs), and polls right after a message arrived,
    // where giving it away only delays the reply: so ours is the one policy, unless the
    // user chose Open MPI's (overwrite 0 keeps a value already set). The one wait inside
    // MPI, for a payload's pieces, yields by itself (advance_payload). Open MPI 4 reads the
    // variable in MPI_Init_thread; it is taken away again after, so that the program's child
    // processes (another mpirun) do not inherit it.
    const bool set_yield = std::getenv("OMPI_MCA_mpi_yield_when_idle") == nullptr;
    if (set_yield) setenv("OMPI_MCA_mpi_yield_when_idle", "0", 0);
    int provided = 0;
    // One thread of each process calls MPI at a time (the rank's thread).
    const int init = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (set_yield) unsetenv("OMPI_MCA_mpi_yield_when_idle");
    if (init != MPI_SUCCESS)
      throw SetupError("MPI_Init_thread failed: shmdist needs MPI to reach ranks on other hosts; "
                       "start the program with mpirun");
    s->handles_->initialised_by_us = true;
  }
  MPI_Comm_dup(MPI_COMM_WORLD, &s->handles_->comm);
  // Errors on our communicator come back as codes, whatever the program chose for its own
  // (MPI_COMM_WORLD's handler is inherited by the duplicate; mpi4py, for one, sets it to
  // MPI_ERRORS_RETURN): a peer whose message does not fit the receive posted for it (another
  // build of shmdist, or a corrupt one) is then a PeerFailure naming it, never an abort of
  // the whole job, and never a receive whose reported length exceeds its buffer unnoticed.
  MPI_Comm_set_errhandler(s->handles_->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(s->handles_->comm, &s->rank_);
  MPI_Comm_size(s->handles_->comm, &s->size_);
  return s;
}

void MpiSession::abandon() { abandoned_ = true; }

MpiSession::~MpiSession() {
  if (!handles_ || abandoned_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (handles_->comm != MPI_COMM_NULL) MPI_Comm_free(&handles_->comm);
  if (handles_->initialised_by_us) MPI_Finalize();
}

std::vector<std::string> MpiSession::allgather(const std::string& value) const {
  // What a join exchanges is a few short lines a rank; a peer's length beyond this (or one
  // that does not add up) is a corrupt or foreign peer, refused before anything is allocated.
  constexpr int kMaxValue = 1 << 16;
  const int len = static_cast<int>(std::min<std::size_t>(value.size(), kMaxValue + 1));
  std::vector<int> lens(size_);
  const auto refuse = [](const std::string& why) {
    throw SetupError("the ranks' exchange over MPI at the join failed: " + why +
                     "; every rank must run the same build of shmdist under one mpirun");
  };
  if (MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, handles_->comm) != MPI_SUCCESS)
    refuse("MPI_Allgather of the lengths returned an error");
  std::vector<int> displs(size_);
  std::int64_t total = 0;
  for (int r = 0; r < size_; ++r) {
    if (lens[r] < 0 || lens[r] > kMaxValue)
      refuse("rank " + std::to_string(r) + " announced " + std::to_string(lens[r]) +
             " bytes where at most " + std::to_string(kMaxValue) + " are expected");
    displs[r] = static_cast<int>(total);
    total += lens[r];
    if (total > INT_MAX) refuse("the announced lengths add up to more than an int holds");
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  if (MPI_Allgatherv(value.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(),
                     MPI_CHAR, handles_->comm) != MPI_SUCCESS)
    refuse("MPI_Allgatherv of the values returned an error");
  std::vector<std::string> out;
  for (int r = 0; r < size_; ++r) out.push_back(all.substr(displs[r], lens[r]));
  return out;
}

}  // namespace shmdist::transport
