// The MPI transport: messages to and from ranks on other hosts travel over Open MPI's
// point-to-point layer (whatever network it picked: TCP, InfiniBand, ...), on a duplicate of
// MPI_COMM_WORLD, so the program's own MPI traffic never matches ours. Ranks are global
// (MPI_COMM_WORLD ranks). A message of at most kMpiPackedMax payload bytes is one MPI
// message on the header tag: its 32-byte MessageHeader and the payload, packed (copied) into
// one buffer. A larger one is the header alone on the header tag, then the payload on the
// payload tag, sent straight from the tensor with MPI_Isend: in pieces of kMpiPackedMax up to
// kMpiPiecedMax bytes, else in chunks of at most 1 GiB (MPI counts being ints). The receiver keeps one receive posted on the
// header tag per remote peer (into a buffer of 32 bytes + kMpiPackedMax), so a message that
// arrives lands there at once, as in a raw MPI_Recv loop (no probe, no unexpected-message
// copy), and tells header from packed message by its length. MPI's non-overtaking rule per
// (source, tag, communicator) keeps per-source order. A zero-length message on the header tag
// says "this rank finalized": it follows every data message of that rank.
//
// This header names no MPI type, so the library builds without MPI: then MpiSession::start()
// throws SetupError saying the build has no MPI support (mpi_stub.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <shmdist/version.hpp>

#include "transport/frame.hpp"
#include "transport/transport.hpp"

namespace shmdist::transport {

// Messages up to this many payload bytes cross as one MPI message (header and payload packed):
// over TCP a second small message costs about a whole second latency, while copying 32 KiB
// costs under a microsecond. 32 KiB keeps a packed message within Open MPI's TCP eager limit
// (64 KiB with its own headers), so it never needs a rendezvous. Larger ones go straight from
// the tensor, unpacked (no copy on either side; the payload's rendezvous overlaps the header).
inline constexpr std::uint64_t kMpiPackedMax = std::uint64_t{32} << 10;

// Payloads up to this many bytes cross in pieces of kMpiPackedMax, each within Open MPI's TCP
// eager limit, instead of one message that needs a rendezvous (the receiver's acknowledgement,
// then the sender's progress to push the rest: on 2 CPUs shared by 4 ranks, each a wait for a
// rank to be scheduled). Measured on 2 emulated hosts over TCP loopback (docs/hosts.md):
// all_reduce of 128 KiB (64 KiB crossing each way) 302-327 -> 218-243 us, of 256 KiB 384-400
// -> 345-349; a 64 KiB send's bandwidth 1.5 -> 2.4 GB/s. Pieces of larger payloads gained
// nothing at 256 KiB and lost 10-35% at 1-2 MiB (a copy out of Open MPI's buffers per piece).
inline constexpr std::uint64_t kMpiPiecedMax = std::uint64_t{128} << 10;

// How this build cuts its MPI messages. The ranks of a job across hosts compare it when they
// join (bootstrap/join_hosts.cpp): ranks that cut them differently would take each other's
// messages for corrupt ones mid-job, so such a job is refused at the start instead.
// Larger payloads cross in chunks of at most this many bytes (MPI counts are ints).
inline constexpr std::uint64_t kMpiChunkMax = std::uint64_t{1} << 30;
// The MPI wire protocol's version: bump it with any change to how messages are tagged, cut
// or laid out that the sizes below do not show.
inline constexpr int kMpiWireVersion = 2;
inline std::string mpi_wire_format() {
  return std::string("shmdist ") + kVersionString + ", MPI wire " +
         std::to_string(kMpiWireVersion) + ": a " + std::to_string(sizeof(MessageHeader)) +
         "-byte header, payloads packed with it up to " + std::to_string(kMpiPackedMax) +
         " bytes, in pieces of " + std::to_string(kMpiPackedMax) + " up to " +
         std::to_string(kMpiPiecedMax) + " bytes, else in chunks of " +
         std::to_string(kMpiChunkMax);
}

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

  struct Handles;  // the MPI objects (mpi_transport_impl.hpp)
  Handles& handles() const { return *handles_; }

 private:
  MpiSession() = default;
  std::unique_ptr<Handles> handles_;
  int rank_ = 0;
  int size_ = 0;
  bool abandoned_ = false;
};

// How long a rank that waits may sleep before it looks at MPI again: MPI cannot ring our
// doorbell, so sleepers poll it. The interval starts at kMin and doubles per sleep up to kMax
// while nothing arrives (so a sleeper never sleeps much longer than it has already waited:
// a remote wake-up costs at most about the time spent asleep so far, and never more than
// kMax), starts over at kMin when something arrives, and is at most kWhileSending while sends
// are in flight (MPI moves a large message only when its sender polls; while a payload
// arrives the transport asks for kMin). Plain data, no MPI.
class PollBackoff {
 public:
  static constexpr std::chrono::nanoseconds kMin{std::chrono::microseconds(10)};
  static constexpr std::chrono::nanoseconds kMax{std::chrono::milliseconds(10)};
  static constexpr std::chrono::nanoseconds kWhileSending{std::chrono::microseconds(100)};

  // The next sleep's bound; grows the following one unless `sending`.
  std::chrono::nanoseconds next(bool sending) {
    if (sending) return interval_ < kWhileSending ? interval_ : kWhileSending;
    const auto now = interval_;
    interval_ = interval_ * 2 < kMax ? interval_ * 2 : kMax;
    return now;
  }
  // Something arrived: the next sleeps are short again.
  void reset() { interval_ = kMin; }

 private:
  std::chrono::nanoseconds interval_ = kMin;
};

// A Transport to other hosts, with what a waiting rank needs to know about polling it.
class RemoteTransport : public Transport {
 public:
  // How long a rank that waits may sleep before it polls MPI again (PollBackoff).
  virtual std::chrono::nanoseconds poll_interval() = 0;
  // Whether sends this transport started, or a payload it receives, are still in MPI's hands
  // (only progress calls move them on: the other side may be waiting for them).
  virtual bool transfers_in_flight() const = 0;
  // Whether a payload is arriving: it moves only while this rank looks at MPI, so the remote
  // side is looked at on every progress call meanwhile (RoutingTransport).
  virtual bool payload_arriving() const { return false; }
  // Peers (RoutingPeers): whether `peer` said it will send nothing more, and saying so to
  // every remote peer. A remote rank that dies ends the job through mpirun: nothing to watch.
  virtual bool peer_finalized(int peer) const = 0;
  virtual void send_finalized() = 0;
};

// The MPI transport of this rank. `remote` lists the global ranks it serves (those on other
// hosts); it must never be asked about others.
std::unique_ptr<RemoteTransport> make_mpi_transport(std::shared_ptr<MpiSession> session,
                                                    std::vector<int> remote);

}  // namespace shmdist::transport
