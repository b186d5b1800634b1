// The MPI transport's class (mpi_transport.hpp says what it does and how messages cross),
// shared by the two files that implement it: mpi_transport.cpp (its looks at MPI, message
// headers and packed messages, sends, failures) and mpi_payload.cpp (a larger message's
// payload, which arrives across polls). It names MPI's types: only files built with MPI
// include it.
#pragma once

// Only the C API: keep the deprecated C++ bindings (and their link symbols) out.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "transport/frame.hpp"
#include "transport/mpi_transport.hpp"

namespace shmdist::transport {

struct MpiSession::Handles {
  MPI_Comm comm = MPI_COMM_NULL;
  bool initialised_by_us = false;
};

// What MPI said about a failed call on the communicator with `peer` (its global rank), as a
// PeerFailure's text: a truncation is a message longer than the receive posted for it.
std::string mpi_failure(int code, int peer, const char* what);

class MpiTransport final : public RemoteTransport {
 public:
  MpiTransport(std::shared_ptr<MpiSession> session, std::vector<int> remote);
  ~MpiTransport() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  bool poll(InboundHandler& handler, int preferred, bool full_scan) override;
  DirectResult receive_direct(int src, const Expectation& want) override;
  int receive_direct_any(const Expectation& want, DirectResult& result) override;
  bool send_some(int dst, OutboundMessage& msg) override;
  void flush() override { reap(); }
  bool inbound_in_progress(int src) const override { return peers_[src].sink != nullptr; }
  bool inbound_pending(int src) const override;
  bool transfers_in_flight() const override { return !inflight_.empty() || receiving_ > 0; }
  bool payload_arriving() const override { return receiving_ > 0; }
  std::chrono::nanoseconds poll_interval() override;
  bool release_inbound(int src) override;                                // mpi_payload.cpp
  void abandon_inbound(int src, std::shared_ptr<void> memory) override;  // mpi_payload.cpp
  bool peer_finalized(int peer) const override { return peers_[peer].finalized; }
  void send_finalized() override;

 private:
  static constexpr int kHeaderTag = 1;
  static constexpr int kPayloadTag = 2;
  static constexpr int kHeaderBytes = static_cast<int>(sizeof(MessageHeader));
  // What one posted receive on the header tag takes: a header, or a packed message.
  static constexpr int kPostedBytes = kHeaderBytes + static_cast<int>(kMpiPackedMax);
  // The pieces a payload of `n` bytes crosses in, sender and receiver alike (kMpiPiecedMax).
  static std::uint64_t piece_of(std::uint64_t n) {
    return n <= kMpiPiecedMax ? kMpiPackedMax : kMpiChunkMax;
  }

  struct Peer {
    int slot = -1;                // index in remote_ / posted_; -1 for ranks on this host
    MessageHeader header{};
    bool stashed = false;         // `header` was received; its payload is not delivered yet
    bool packed = false;          // ... and the payload is in `staged`, after the header
    std::vector<std::byte> staged;  // the posted receive's buffer (kPostedBytes)
    bool finalized = false;
    // Why the stream from this peer broke (a corrupt message, an MPI error), once it has: from
    // then on every look at it throws this again (PeerFailure) and nothing more is delivered
    // from it, since whatever follows may belong to the broken message.
    std::string failure;
    // Why a send to this peer failed, once one has: that send fails (the engine's rule: it
    // alone), and so does every later one, since the link to the peer is broken. Receiving
    // from it goes on.
    std::string send_failure;
    // The payload arriving now, across polls (advance_payload): the engine's sink and the
    // message, and the receive posted for its next piece at sink->dest + sink->received
    // (MPI_REQUEST_NULL between pieces). While a piece is posted MPI may write into the
    // engine's memory at any MPI call, so the engine asks release_inbound() before it moves
    // the message. The header receive is posted again only once the payload is in.
    InboundSink* sink = nullptr;
    Envelope env{};
    MPI_Request piece = MPI_REQUEST_NULL;
    int piece_len = 0;
    bool cancelling = false;  // MPI_Cancel was called on `piece`
  };
  struct Inflight {
    MessageHeader header{};
    std::vector<std::byte> packed;  // header + payload of a packed message (capacity reused)
    std::size_t packed_bytes = 0;   // of `packed` in use
    std::vector<MPI_Request> reqs;
    std::vector<MPI_Status> status;  // MPI_Testall's, by request (capacity reused)
    int dst = -1;
    OutboundMessage* msg = nullptr;  // set while the engine waits for it
    MPI_Status* statuses(std::size_t n) {
      status.resize(n);
      return status.data();
    }
  };
  using Slot = std::list<Inflight>::iterator;

  // Sends.
  bool start_send(int dst, OutboundMessage& msg);
  void isend(Inflight& f, const void* data, int len, int dst, int tag);
  void send_failed(int dst, int code);
  bool complete(Inflight& f);
  static constexpr int kPending = -1;
  int test_all(Inflight& f);
  Inflight& new_slot();
  void forget(Slot it);
  void reap();

  // Looks at MPI: headers and packed messages.
  void post(Peer& p);
  bool collect();
  bool collect_some();
  bool collect_one(Peer& p);
  void arrived(Peer& p, const MPI_Status& st);
  int next_stashed();
  void deliver(int src, InboundHandler& handler);
  void take_packed(Peer& p, std::byte* dest);

  // A payload arriving across polls (mpi_payload.cpp).
  // How long one look at an arriving payload waits for its pieces before it returns (and lets
  // the engine check its deadlines, its peers and its other work): a piece the sender posted
  // with the header usually lands well within it.
  static constexpr std::chrono::milliseconds kPayloadSpin{10};
  bool advance_payloads(InboundHandler& handler);
  bool advance_payload(Peer& p, InboundHandler& handler);
  void post_piece(Peer& p);
  void piece_failed(Peer& p, int code, int done);
  void settle_piece(Peer& p, const MPI_Status& st);
  void finish_payload(Peer& p, InboundHandler& handler);
  void end_payload(Peer& p);

  // Broken streams.
  void mark_failed(Peer& p, std::string why);
  [[noreturn]] void fail(Peer& p, std::string why);
  void rethrow_failure() const;

  bool wait_a_little(std::chrono::steady_clock::time_point deadline);

  std::shared_ptr<MpiSession> session_;
  MPI_Comm comm_;
  int rank_;
  int world_;
  std::vector<int> remote_;
  std::vector<Peer> peers_;               // by global rank
  std::vector<MPI_Request> posted_;       // by slot: the receive posted on the header tag
                                          // (MPI_REQUEST_NULL while its message is stashed,
                                          // and after the finalize marker)
  std::vector<int> done_index_;           // MPI_Testsome's results
  std::vector<MPI_Status> done_status_;
  std::size_t stashed_ = 0;               // peers with a stashed message
  std::size_t failed_ = 0;                // peers whose stream broke (Peer::failure)
  std::size_t receiving_ = 0;             // peers whose payload is arriving (Peer::sink)
  std::vector<MPI_Request> abandoned_pieces_;  // abandon_inbound's (their memory is parked)
  std::list<Inflight> inflight_;
  std::list<Inflight> spare_;             // finished slots, for reuse
  std::vector<std::optional<Slot>> sending_;  // by destination: the engine's head
  std::size_t waiting_sends_ = 0;         // slots the engine waits for (sending_)
  std::uint64_t buffered_ = 0;            // bytes of packed messages in inflight_
  std::size_t cursor_ = 0;
  PollBackoff backoff_;
};

}  // namespace shmdist::transport
