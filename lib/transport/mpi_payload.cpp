// The MPI transport (mpi_transport_impl.hpp): a message's payload larger than a packed
// message arrives across polls, piece by piece, straight into the engine's memory. While a
// piece is posted MPI may write there at any MPI call, so the engine asks release_inbound
// before it moves the message, and abandon_inbound keeps the memory when MPI cannot let go.
// Compiled only when CMake finds MPI.

#include <sched.h>

#include <shmdist/errors.hpp>

#include <algorithm>
#include <exception>
#include <utility>

#include "transport/mpi_transport_impl.hpp"

namespace shmdist::transport {

// The piece posted for the payload from `src` is cancelled, unless MPI matched it already
// (then it completes, and its bytes count, before this returns true).
bool MpiTransport::release_inbound(int src) {
  Peer& p = peers_[src];
  if (p.sink == nullptr || p.piece == MPI_REQUEST_NULL) return true;
  if (!p.cancelling) {
    MPI_Cancel(&p.piece);
    p.cancelling = true;
  }
  int done = 0;
  MPI_Status st;
  const int code = MPI_Test(&p.piece, &done, &st);
  try {
    if (code != MPI_SUCCESS) piece_failed(p, code, done);
    else if (done) settle_piece(p, st);
  } catch (const PeerFailure&) {
    // Kept (Peer::failure): the next poll throws it.
  } catch (const std::exception& e) {  // a consumer's, as the bytes landed: the same
    mark_failed(p, "a message from rank " + std::to_string(src) + " could not be taken in: " +
                       e.what());
  }
  return p.piece == MPI_REQUEST_NULL;
}

// A piece MPI may still write into (it matched it) stays posted, and its memory is kept
// for the life of the process (MPI may progress it at any MPI call, the program's own and
// MPI_Finalize included); the stream from `src` is broken, since the rest of the message
// would otherwise be taken for the next one.
void MpiTransport::abandon_inbound(int src, std::shared_ptr<void> memory) {
  Peer& p = peers_[src];
  if (p.sink == nullptr) return;
  if (!release_inbound(src)) {
    static auto* const parked = new std::vector<std::shared_ptr<void>>();  // never freed
    if (memory) parked->push_back(std::move(memory));
    abandoned_pieces_.push_back(std::exchange(p.piece, MPI_REQUEST_NULL));
  }
  if (p.sink == nullptr) return;  // the release found the stream broken: it is over already
  const bool whole = p.sink->received == p.env.nbytes;
  end_payload(p);
  if (whole) post(p);  // though never handed over: the stream goes on
  else
    mark_failed(p, "a " + std::to_string(p.env.nbytes) + "-byte message from rank " +
                       std::to_string(src) + " was given up midway (its receive gave up on "
                       "it, or the process group ended); the stream from rank " +
                       std::to_string(src) + " cannot go on after it");
}

// The payload arriving from `p` is no longer this transport's to move.
void MpiTransport::end_payload(Peer& p) {
  if (p.sink == nullptr) return;
  p.sink = nullptr;
  --receiving_;
}

// Moves every payload that is arriving on. Returns whether a piece landed.
bool MpiTransport::advance_payloads(InboundHandler& handler) {
  bool moved = false;
  for (int r : remote_)
    if (peers_[r].sink) moved |= advance_payload(peers_[r], handler);
  return moved;
}

// Posts the payload's pieces one after another (as its sender cut them) and waits for each,
// giving the CPU away between looks (the sender's progress may need it: Open MPI does not
// yield, MpiSession::start), for at most kPayloadSpin. The message completes when its last
// piece lands. Returns whether a piece landed.
bool MpiTransport::advance_payload(Peer& p, InboundHandler& handler) {
  const auto give_up = std::chrono::steady_clock::now() + kPayloadSpin;
  bool moved = false;
  for (;;) {
    if (p.piece == MPI_REQUEST_NULL) {
      if (p.sink->received == p.env.nbytes) {
        finish_payload(p, handler);
        return true;
      }
      post_piece(p);
    }
    int done = 0;
    MPI_Status st;
    const int code = MPI_Test(&p.piece, &done, &st);
    if (code != MPI_SUCCESS) {
      piece_failed(p, code, done);
      throw PeerFailure(p.failure);
    }
    if (done) {
      settle_piece(p, st);
      moved = true;
      continue;
    }
    if (std::chrono::steady_clock::now() >= give_up) return moved;
    sched_yield();
  }
}

void MpiTransport::post_piece(Peer& p) {
  const std::uint64_t at = p.sink->received;
  p.piece_len = static_cast<int>(std::min(piece_of(p.env.nbytes), p.env.nbytes - at));
  const int code = MPI_Irecv(p.sink->dest + at, p.piece_len, MPI_BYTE, remote_[p.slot],
                             kPayloadTag, comm_, &p.piece);
  if (code != MPI_SUCCESS) {
    p.piece = MPI_REQUEST_NULL;
    fail(p, mpi_failure(code, remote_[p.slot], "message payload"));
  }
}

// MPI_Test failed on the posted piece: the stream is broken. A request MPI completed is
// freed (Open MPI keeps a failed request allocated); one it did not stays posted, and
// release_inbound says so to the engine.
void MpiTransport::piece_failed(Peer& p, int code, int done) {
  if (done && p.piece != MPI_REQUEST_NULL) MPI_Request_free(&p.piece);
  if (done) p.piece = MPI_REQUEST_NULL;
  mark_failed(p, mpi_failure(code, remote_[p.slot], "message payload"));
}

// The posted piece completed with `st`: its bytes count (a cancelled one's do not: it is
// posted again, wherever the sink then points).
void MpiTransport::settle_piece(Peer& p, const MPI_Status& st) {
  p.piece = MPI_REQUEST_NULL;
  if (std::exchange(p.cancelling, false)) {
    int cancelled = 0;
    MPI_Test_cancelled(&st, &cancelled);
    if (cancelled) return;
  }
  int count = 0;
  MPI_Get_count(&st, MPI_BYTE, &count);
  if (count != p.piece_len) {
    const std::uint64_t piece = piece_of(p.env.nbytes);
    fail(p, "rank " + std::to_string(remote_[p.slot]) + " sent " + std::to_string(count) +
                " bytes as piece " + std::to_string(p.sink->received / piece + 1) +
                " of the payload of a " + std::to_string(p.env.nbytes) +
                "-byte message over MPI, where " + std::to_string(p.piece_len) +
                " bytes were due; the stream from it is corrupt");
  }
  p.sink->landed(static_cast<std::uint64_t>(count));
}

void MpiTransport::finish_payload(Peer& p, InboundHandler& handler) {
  InboundSink* sink = p.sink;
  end_payload(p);
  post(p);
  backoff_.reset();
  handler.on_message_complete(sink, p.env);
}

}  // namespace shmdist::transport
