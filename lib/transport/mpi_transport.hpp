// The MPI transport: messages to and from ranks on other hosts travel over Open MPI's
// point-to-point layer (whatever network it picked: TCP, InfiniBand, ...), on a duplicate of
// MPI_COMM_WORLD, so the program's own MPI traffic never matches ours. Ranks are global
// (MPI_COMM_WORLD ranks). A message of at most kMpiPackedMax payload bytes is one MPI
// message on the header tag: its 32-byte MessageHeader and the payload, packed (copied) into
// one buffer. A larger one is two MPI messages: the header alone on the header tag, then the
// payload on the payload tag (in chunks of at most 1 GiB, MPI counts being ints), sent
// straight from the tensor with MPI_Isend. The receiver tells them apart by the header
// message's length. MPI's non-overtaking rule per (source, tag, communicator) keeps
// per-source order. A zero-length message on the header tag says "this rank finalized": it
// follows every data message of that rank.
//
// This header names no MPI type, so the library builds without MPI: then MpiSession::start()
// throws SetupError saying the build has no MPI support (mpi_stub.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/transport.hpp"

namespace shmdist::transport {

// Messages up to this many payload bytes cross as one MPI message (header and payload packed):
// over TCP a second small message costs about a whole second latency, while copying 32 KiB
// costs under a microsecond. 32 KiB keeps a packed message within Open MPI's TCP eager limit
// (64 KiB with its own headers), so it never needs a rendezvous. Larger ones go straight from
// the tensor, unpacked (no copy on either side; the payload's rendezvous overlaps the header).
inline constexpr std::uint64_t kMpiPackedMax = std::uint64_t{32} << 10;

// MPI, initialised by shmdist (and finalized when the last user lets go) unless the program
// initialised it itself (then shmdist neither initialises nor finalizes it).
class MpiSession {
 public:
  // Throws SetupError if this build has no MPI support or MPI cannot start.
  static std::shared_ptr<MpiSession> start();
  static bool built_with_mpi();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Every rank's `value`, by rank (collective over MPI_COMM_WORLD).
  std::vector<std::string> allgather(const std::string& value) const;

  // Sends could not complete: do not finalize MPI (it would wait for them).
  void abandon();

  struct Handles;  // the MPI objects (mpi_transport.cpp)
  Handles& handles() const { return *handles_; }

 private:
  MpiSession() = default;
  std::unique_ptr<Handles> handles_;
  int rank_ = 0;
  int size_ = 0;
  bool abandoned_ = false;
};

// A Transport to other hosts, with what a waiting rank needs to know about polling it.
class RemoteTransport : public Transport {
 public:
  // How long a rank that waits may sleep before it polls MPI again. MPI cannot ring our
  // doorbell, so sleepers poll it: the interval grows from 10 us (doubling per sleep) to
  // 1 ms while nothing arrives, back to 10 us when something does, and stays at most 100 us
  // while sends are in flight (MPI moves a large message only when its sender polls).
  virtual std::chrono::nanoseconds poll_interval() = 0;
  // Whether sends this transport started are still in MPI's hands (only progress calls move
  // them on: the receiver may be waiting for them).
  virtual bool sends_in_flight() const = 0;
};

// The MPI transport of this rank. `remote` lists the global ranks it serves (those on other
// hosts); it must never be asked about others.
std::unique_ptr<RemoteTransport> make_mpi_transport(std::shared_ptr<MpiSession> session,
                                                    std::vector<int> remote);

}  // namespace shmdist::transport
