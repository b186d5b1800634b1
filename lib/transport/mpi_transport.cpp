// The MPI transport (mpi_transport.hpp). Compiled only when CMake finds MPI.

#include "transport/mpi_transport.hpp"

// Only the C API: keep the deprecated C++ bindings (and their link symbols) out.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <sched.h>

#include <shmdist/errors.hpp>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <list>
#include <optional>
#include <thread>

#include "transport/frame.hpp"

namespace shmdist::transport {

struct MpiSession::Handles {
  MPI_Comm comm = MPI_COMM_NULL;
  bool initialised_by_us = false;
};

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

namespace {

constexpr int kHeaderTag = 1;
constexpr int kPayloadTag = 2;
// The pieces a payload of `n` bytes crosses in, sender and receiver alike (kMpiPiecedMax).
std::uint64_t piece_of(std::uint64_t n) {
  return n <= kMpiPiecedMax ? kMpiPackedMax : kMpiChunkMax;
}
constexpr int kMessagesPerPoll = 32;
constexpr int kHeaderBytes = static_cast<int>(sizeof(MessageHeader));
// What one posted receive on the header tag takes: a header, or a packed message.
constexpr int kPostedBytes = kHeaderBytes + static_cast<int>(kMpiPackedMax);
// Packed messages this rank may hold copies of, beyond which a send waits for MPI again (a
// receiver that never polls must not make us buffer without bound).
constexpr std::uint64_t kMaxBufferedBytes = std::uint64_t{4} << 20;
// Finished send slots kept for reuse (with their buffers), so that a steady stream of small
// sends allocates nothing.
constexpr std::size_t kSpareSlots = 64;

// What MPI said about a failed call on the communicator with `peer` (its global rank), as a
// PeerFailure's text: a truncation is a message longer than the receive posted for it.
std::string mpi_failure(int code, int peer, const char* what) {
  int cls = code;
  MPI_Error_class(code, &cls);
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(code, text, &len);
  const std::string said(text, static_cast<std::size_t>(std::max(len, 0)));
  if (cls == MPI_ERR_TRUNCATE)
    return "rank " + std::to_string(peer) + " sent a " + what + " over MPI longer than the " +
           "receive this rank posted for it (MPI: " + said + "); is it running another build "
           "of shmdist? Every rank must run the same build; the stream from it is corrupt";
  return "MPI failed on the " + std::string(what) + " from or to rank " + std::to_string(peer) +
         " (MPI: " + said + "); the link to it is broken";
}

class MpiTransport final : public RemoteTransport {
 public:
  MpiTransport(std::shared_ptr<MpiSession> session, std::vector<int> remote)
      : session_(std::move(session)),
        comm_(session_->handles().comm),
        rank_(session_->rank()),
        world_(session_->size()),
        remote_(std::move(remote)),
        peers_(world_),
        posted_(remote_.size(), MPI_REQUEST_NULL),
        done_index_(remote_.size()),
        done_status_(remote_.size()),
        sending_(world_) {
    for (std::size_t i = 0; i < remote_.size(); ++i) {
      Peer& p = peers_[remote_[i]];
      p.slot = static_cast<int>(i);
      p.staged.resize(kPostedBytes);
      post(p);
    }
  }

  ~MpiTransport() override {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    // Payload receives still posted first (a message whose sender stopped midway, abandoned
    // ones): cancelled, or, once MPI has matched one, waited for. Past the deadline MPI is
    // left as it is, not finalized; the memory of abandoned ones stays parked.
    for (int r : remote_)
      if (peers_[r].piece != MPI_REQUEST_NULL) abandoned_pieces_.push_back(peers_[r].piece);
    for (MPI_Request& piece : abandoned_pieces_) {
      if (piece == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&piece);
      for (int flag = 0;;) {
        if (MPI_Test(&piece, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS && flag &&
            piece != MPI_REQUEST_NULL)
          MPI_Request_free(&piece);  // Open MPI keeps a request that completed with an error
        if (flag || piece == MPI_REQUEST_NULL) break;
        if (!wait_a_little(deadline)) return;
      }
    }
    // Sends still in flight (finalize markers, packed and orphaned sends) must complete
    // before MPI is finalized; every peer drains its inbound traffic until it has seen our
    // marker. A rank ending without destroy_process_group may leave sends nobody takes: wait
    // for them a bounded time, then leave MPI as it is (mpirun then reports the rank's exit).
    for (auto it = inflight_.begin(); it != inflight_.end();) {
      if (complete(*it)) {
        it = inflight_.erase(it);
        continue;
      }
      if (!wait_a_little(deadline)) return;
    }
    // Receives still posted (peers whose finalize marker never came: they ended without
    // destroy_process_group) are cancelled; one a message matched already completes instead.
    for (MPI_Request& r : posted_) {
      if (r == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&r);
      for (int flag = 0;;) {
        MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
        if (flag) break;
        if (!wait_a_little(deadline)) return;
      }
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  // One look at MPI (MPI_Testsome over the posted receives) takes in whatever arrived; the
  // preferred source is served first, then stashed messages in rotation. MPI is looked at
  // again only while looks deliver, up to kMessagesPerPoll messages.
  bool poll(InboundHandler& handler, int preferred, bool /*full_scan*/) override {
    rethrow_failure();
    reap();
    bool moved = receiving_ > 0 && advance_payloads(handler);
    moved |= collect();
    if (preferred >= 0 && peers_[preferred].stashed) {
      deliver(preferred, handler);
      moved = true;
    }
    for (int i = 0; i < kMessagesPerPoll; ++i) {
      int src = next_stashed();
      if (src < 0 && moved && collect()) src = next_stashed();
      if (src < 0) break;
      deliver(src, handler);
      moved = true;
    }
    if (moved) backoff_.reset();
    return moved;
  }

  DirectResult receive_direct(int src, const Expectation& want) override {
    Peer& p = peers_[src];
    if (!p.failure.empty()) throw PeerFailure(p.failure);
    if (p.sink) return DirectResult::Other;  // a payload is arriving: poll() goes on with it
    if (!p.stashed) collect_one(p);
    if (!p.stashed) return DirectResult::Empty;  // nothing, or a finalize marker
    // A payload that is not packed arrives across polls (deliver): the general path.
    const bool whole = p.packed || p.header.nbytes == 0;
    if (!whole || !(p.header == encode_header(want.env))) return DirectResult::Other;
    take_packed(p, want.dest);
    backoff_.reset();
    return DirectResult::Received;
  }

  int receive_direct_any(const Expectation& want, DirectResult& result) override {
    rethrow_failure();
    for (int i = 0; i < 4; ++i) {
      int src = next_stashed();
      if (src < 0 && collect()) src = next_stashed();
      if (src < 0) break;
      result = receive_direct(src, want);
      if (result == DirectResult::Received) return src;
      if (result == DirectResult::Other) return -1;
    }
    result = DirectResult::Empty;
    return -1;
  }

  bool send_some(int dst, OutboundMessage& msg) override {
    if (!msg.started) return start_send(dst, msg);
    auto& head = sending_[dst];
    if (!head) return false;
    const int code = test_all(**head);
    if (code == kPending) return false;
    msg.sent = msg.env.nbytes;
    msg.next += msg.env.nbytes;
    if (code != MPI_SUCCESS) {  // this send fails (the engine's rule: it alone), naming the peer
      send_failed(dst, code);
      msg.failure = &peers_[dst].send_failure;
    }
    forget(*head);
    head.reset();
    return true;
  }

  void flush() override { reap(); }
  bool inbound_in_progress(int src) const override { return peers_[src].sink != nullptr; }
  bool inbound_pending(int src) const override {
    const Peer& p = peers_[src];
    if (p.stashed || !p.failure.empty()) return true;  // a failure: the next look throws it
    if (p.slot < 0 || posted_[p.slot] == MPI_REQUEST_NULL) return false;
    // Whether the posted receive completed, without completing it (the request stays ours).
    int flag = 0;
    MPI_Status st;
    MPI_Request_get_status(posted_[p.slot], &flag, &st);
    int count = 0;
    if (flag) MPI_Get_count(&st, MPI_BYTE, &count);
    return count > 0;  // a finalize marker (0 bytes) is not data
  }
  bool transfers_in_flight() const override { return !inflight_.empty() || receiving_ > 0; }
  bool payload_arriving() const override { return receiving_ > 0; }

  std::chrono::nanoseconds poll_interval() override {
    if (receiving_ > 0) return PollBackoff::kMin;  // a payload moves only while we poll
    return backoff_.next(waiting_sends_ > 0);
  }

  // The piece posted for the payload from `src` is cancelled, unless MPI matched it already
  // (then it completes, and its bytes count, before this returns true).
  bool release_inbound(int src) override {
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
  void abandon_inbound(int src, std::shared_ptr<void> memory) override {
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

  bool peer_finalized(int peer) const override { return peers_[peer].finalized; }
  void send_finalized() override {
    for (int peer : remote_) {
      Inflight& f = new_slot();
      f.dst = peer;
      isend(f, nullptr, 0, peer, kHeaderTag);
    }
  }

 private:
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

  // Sleeps a moment before the destructor looks again; past `deadline`, leaves MPI as it is
  // (not finalized: it would wait for what is still in flight) and returns false.
  bool wait_a_little(std::chrono::steady_clock::time_point deadline) {
    if (std::chrono::steady_clock::now() >= deadline) {
      session_->abandon();
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    return true;
  }

  // Whether MPI is done with a send slot. One that failed counts as done, and later sends to
  // its peer fail (a finalize marker or a packed message nobody waits for can fail no send of
  // its own); send_some fails the engine's send itself.
  bool complete(Inflight& f) {
    const int code = test_all(f);
    if (code == kPending) return false;
    if (code != MPI_SUCCESS && f.dst >= 0) send_failed(f.dst, code);
    return true;
  }
  static constexpr int kPending = -1;
  // MPI_SUCCESS, kPending, or the error of a failed request of `f`.
  int test_all(Inflight& f) {
    int flag = 0;
    const int code = MPI_Testall(static_cast<int>(f.reqs.size()), f.reqs.data(), &flag,
                                 f.statuses(f.reqs.size()));
    if (code == MPI_ERR_IN_STATUS) {
      // Some MPIs report a failed request while others of the slot are still active
      // (MPI_ERR_PENDING): the slot, and the memory they read, stay in use until those end.
      int error = kPending;
      for (std::size_t i = 0; i < f.reqs.size(); ++i) {
        if (f.status[i].MPI_ERROR == MPI_ERR_PENDING) return kPending;
        if (f.status[i].MPI_ERROR != MPI_SUCCESS && error == kPending) error = f.status[i].MPI_ERROR;
      }
      return error;
    }
    if (code != MPI_SUCCESS) return code;
    return flag ? MPI_SUCCESS : kPending;
  }

  // Records why sends to `dst` fail (the first reason stays).
  void send_failed(int dst, int code) {
    std::string& why = peers_[dst].send_failure;
    if (why.empty()) why = mpi_failure(code, dst, "message");
  }

  // Records why the stream from `p` broke (the first reason stays). A payload that was
  // arriving is over, unless a piece's receive is still posted (the engine may still ask to
  // release it, and then abandons it).
  void mark_failed(Peer& p, std::string why) {
    if (p.sink && p.piece == MPI_REQUEST_NULL) end_payload(p);
    if (!p.failure.empty()) return;
    p.failure = std::move(why);
    ++failed_;
  }

  // The payload arriving from `p` is no longer this transport's to move.
  void end_payload(Peer& p) {
    if (p.sink == nullptr) return;
    p.sink = nullptr;
    --receiving_;
  }
  [[noreturn]] void fail(Peer& p, std::string why) {
    mark_failed(p, std::move(why));
    throw PeerFailure(p.failure);
  }
  // Throws the failure of the first broken peer, if any.
  void rethrow_failure() const {
    if (failed_ == 0) return;
    for (int r : remote_)
      if (!peers_[r].failure.empty()) throw PeerFailure(peers_[r].failure);
  }

  // A send slot at the end of inflight_, reused from spare_ when one is there.
  Inflight& new_slot() {
    if (spare_.empty()) return inflight_.emplace_back();
    inflight_.splice(inflight_.end(), spare_, spare_.begin());
    Inflight& f = inflight_.back();
    f.packed_bytes = 0;
    f.reqs.clear();
    f.msg = nullptr;
    return f;
  }

  void forget(Slot it) {
    buffered_ -= it->packed_bytes;
    if (it->msg != nullptr) --waiting_sends_;
    if (spare_.size() < kSpareSlots) spare_.splice(spare_.begin(), inflight_, it);
    else inflight_.erase(it);
  }

  // A message of at most kMpiPackedMax payload bytes travels as one MPI message, header and
  // payload packed into a buffer of ours: one message crossing instead of two (over TCP the
  // second costs a whole extra latency), and the engine's send is done at once (its bytes
  // are copied) unless kMaxBufferedBytes are already held. A larger one sends the header,
  // then the payload straight from the tensor (no copy), and is done when MPI is.
  bool start_send(int dst, OutboundMessage& msg) {
    // Finished sends are freed here too, not only in poll(): a ping-pong whose receives all
    // take the direct path never polls, and would otherwise hold every packed message sent.
    reap();
    msg.started = true;
    if (!peers_[dst].send_failure.empty()) {  // the link to dst is broken: this send fails too
      msg.sent = msg.env.nbytes;
      msg.next += msg.env.nbytes;
      msg.failure = &peers_[dst].send_failure;
      return true;
    }
    Inflight& f = new_slot();
    f.header = encode_header(msg.env);
    f.dst = dst;
    const std::uint64_t n = msg.env.nbytes;
    if (n > 0 && n <= kMpiPackedMax) {
      f.packed_bytes = sizeof(MessageHeader) + n;
      if (f.packed.size() < f.packed_bytes) f.packed.resize(f.packed_bytes);
      std::memcpy(f.packed.data(), &f.header, sizeof(MessageHeader));
      std::memcpy(f.packed.data() + sizeof(MessageHeader), msg.next, n);
      buffered_ += f.packed_bytes;
      isend(f, f.packed.data(), static_cast<int>(f.packed_bytes), dst, kHeaderTag);
      if (buffered_ <= kMaxBufferedBytes) {
        msg.sent = n;
        msg.next += n;
        return true;
      }
    } else {
      isend(f, &f.header, sizeof f.header, dst, kHeaderTag);
      const std::uint64_t piece = piece_of(n);
      for (std::uint64_t off = 0; off < n; off += piece) {
        const auto len = static_cast<int>(std::min(piece, n - off));
        isend(f, msg.next + off, len, dst, kPayloadTag);
      }
      // An empty message is done for the engine now (no user bytes are referenced); its
      // header buffer stays in inflight_ until MPI is done with it.
      if (n == 0) return true;
    }
    f.msg = &msg;
    ++waiting_sends_;
    sending_[dst] = std::prev(inflight_.end());
    return true;
  }

  // Starts one send of slot `f`. One MPI refuses leaves no request (the slot completes at
  // once) and fails the sends to `dst` (send_failed).
  void isend(Inflight& f, const void* data, int len, int dst, int tag) {
    f.reqs.push_back(MPI_REQUEST_NULL);
    const int code = MPI_Isend(data, len, MPI_BYTE, dst, tag, comm_, &f.reqs.back());
    if (code != MPI_SUCCESS) {
      f.reqs.back() = MPI_REQUEST_NULL;
      send_failed(dst, code);
    }
  }

  // (Re)posts the receive on the header tag from `p`; if MPI refuses, the stream from `p` is
  // broken (its next look throws).
  void post(Peer& p) {
    const int code = MPI_Irecv(p.staged.data(), kPostedBytes, MPI_BYTE, remote_[p.slot],
                               kHeaderTag, comm_, &posted_[p.slot]);
    if (code != MPI_SUCCESS) {
      posted_[p.slot] = MPI_REQUEST_NULL;
      mark_failed(p, mpi_failure(code, remote_[p.slot], "message header"));
    }
  }

  // One look at MPI over every posted receive: stashes what arrived. Returns whether anything
  // did (messages or finalize markers). Open MPI's MPI_Testsome, finding nothing complete,
  // runs the progress engine (which may complete receives) and returns without looking
  // again, so a look that found nothing looks once more: otherwise a message pulled in by the
  // first would wait for the next poll, which for a sleeper is a whole poll interval later
  // (MPI_Test looks again by itself: with one remote peer that is the one call).
  bool collect() {
    if (remote_.size() == 1) return collect_one(peers_[remote_[0]]);
    return collect_some() || collect_some();
  }

  bool collect_some() {
    int count = 0;
    const int code = MPI_Testsome(static_cast<int>(posted_.size()), posted_.data(), &count,
                                  done_index_.data(), done_status_.data());
    if (code != MPI_SUCCESS && code != MPI_ERR_IN_STATUS) {
      // Not one request's error: MPI failed as a whole, so every stream from another host is
      // broken (those MPI completed in this call are lost with it).
      char text[MPI_MAX_ERROR_STRING] = {};
      int len = 0;
      MPI_Error_string(code, text, &len);
      const std::string why = "MPI failed while looking for messages from the other hosts "
                              "(MPI_Testsome: " + std::string(text, std::max(len, 0)) +
                              "); the links to them are broken";
      for (int r : remote_) mark_failed(peers_[r], why);
      rethrow_failure();
    }
    if (count == MPI_UNDEFINED || count == 0) return false;  // undefined: nothing posted
    // Every completed receive is taken in before a corrupt one is reported: their requests
    // are spent.
    std::exception_ptr corrupt;
    for (int k = 0; k < count; ++k) {
      Peer& p = peers_[remote_[done_index_[k]]];
      try {
        const int error = code == MPI_ERR_IN_STATUS ? done_status_[k].MPI_ERROR : MPI_SUCCESS;
        if (error != MPI_SUCCESS) fail(p, mpi_failure(error, remote_[p.slot], "message header"));
        arrived(p, done_status_[k]);
      } catch (const PeerFailure&) {
        if (!corrupt) corrupt = std::current_exception();
      }
    }
    if (corrupt) std::rethrow_exception(corrupt);
    return true;
  }

  // The same for one source's receive only (MPI_Test runs the progress engine at most once).
  bool collect_one(Peer& p) {
    if (p.slot < 0 || posted_[p.slot] == MPI_REQUEST_NULL) return false;
    int flag = 0;
    MPI_Status st;
    const int code = MPI_Test(&posted_[p.slot], &flag, &st);
    if (code != MPI_SUCCESS) fail(p, mpi_failure(code, remote_[p.slot], "message header"));
    if (flag) arrived(p, st);
    return flag != 0;
  }

  // The posted receive of `p` completed with `st`: a header (its payload follows on the
  // payload tag), a packed message, or a finalize marker (0 bytes: nothing follows, the
  // receive is not posted again). A message longer than kPostedBytes is an error MPI reports
  // (truncation: collect's callers fail the peer); the count is checked again here, since
  // some MPIs report the sender's length with it.
  void arrived(Peer& p, const MPI_Status& st) {
    const int from = remote_[p.slot];
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    if (count == 0) {
      p.finalized = true;
      return;
    }
    if (count < kHeaderBytes || count > kPostedBytes)
      fail(p, "rank " + std::to_string(from) + " sent a " + std::to_string(count) +
                  "-byte message header over MPI; expected 32 bytes, or 32 plus at most " +
                  std::to_string(kMpiPackedMax) + " payload bytes (is it running another "
                  "build of shmdist? Every rank must run the same build); the stream from it "
                  "is corrupt");
    p.packed = count > kHeaderBytes;
    std::memcpy(&p.header, p.staged.data(), sizeof(MessageHeader));
    try {
      decode_header(p.header, sizeof(MessageHeader), from);
    } catch (const PeerFailure& e) {
      fail(p, e.what());
    }
    if (p.header.flags != 0 ||
        (p.packed && p.header.nbytes != std::uint64_t(count - kHeaderBytes)))
      fail(p, "rank " + std::to_string(from) + " sent a message over MPI whose header "
                  "(flags " + std::to_string(p.header.flags) + ", " +
                  std::to_string(p.header.nbytes) + " bytes) does not match its " +
                  std::to_string(count - kHeaderBytes) + " payload bytes; the stream from it is "
                  "corrupt");
    p.stashed = true;
    ++stashed_;
  }

  // The next source with a stashed message, in rotation (fairness); -1 if none.
  int next_stashed() {
    if (stashed_ == 0) return -1;
    for (std::size_t i = 0; i < remote_.size(); ++i) {
      cursor_ = cursor_ + 1 >= remote_.size() ? 0 : cursor_ + 1;
      if (peers_[remote_[cursor_]].stashed) return remote_[cursor_];
    }
    return -1;
  }

  // Hands the engine the stashed message of `src`: a packed one whole; a larger one's payload
  // starts arriving (advance_payload).
  void deliver(int src, InboundHandler& handler) {
    Peer& p = peers_[src];
    const Envelope env = decode_header(p.header, sizeof(MessageHeader), src);
    InboundSink* sink = handler.on_message_start(env);  // may throw: the message stays stashed
    // A sink starts empty (the engine's on_message_start).
    if (p.packed || env.nbytes == 0) {
      take_packed(p, sink->dest);
      sink->landed(env.nbytes);
      handler.on_message_complete(sink, env);
      return;
    }
    p.stashed = false;
    --stashed_;
    p.sink = sink;
    p.env = env;
    ++receiving_;
    advance_payload(p, handler);
  }

  // Copies the stashed packed message's payload (none for an empty message) to `dest`,
  // unstashes it and posts the source's next header receive.
  void take_packed(Peer& p, std::byte* dest) {
    p.stashed = false;
    --stashed_;
    if (p.header.nbytes) std::memcpy(dest, p.staged.data() + sizeof(MessageHeader), p.header.nbytes);
    post(p);
  }

  // Moves every payload that is arriving on. Returns whether a piece landed.
  bool advance_payloads(InboundHandler& handler) {
    bool moved = false;
    for (int r : remote_)
      if (peers_[r].sink) moved |= advance_payload(peers_[r], handler);
    return moved;
  }

  // How long one look at an arriving payload waits for its pieces before it returns (and lets
  // the engine check its deadlines, its peers and its other work): a piece the sender posted
  // with the header usually lands well within it.
  static constexpr std::chrono::milliseconds kPayloadSpin{10};

  // Posts the payload's pieces one after another (as its sender cut them) and waits for each,
  // giving the CPU away between looks (the sender's progress may need it: Open MPI does not
  // yield, MpiSession::start), for at most kPayloadSpin. The message completes when its last
  // piece lands. Returns whether a piece landed.
  bool advance_payload(Peer& p, InboundHandler& handler) {
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

  void post_piece(Peer& p) {
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
  void piece_failed(Peer& p, int code, int done) {
    if (done && p.piece != MPI_REQUEST_NULL) MPI_Request_free(&p.piece);
    if (done) p.piece = MPI_REQUEST_NULL;
    mark_failed(p, mpi_failure(code, remote_[p.slot], "message payload"));
  }

  // The posted piece completed with `st`: its bytes count (a cancelled one's do not: it is
  // posted again, wherever the sink then points).
  void settle_piece(Peer& p, const MPI_Status& st) {
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

  void finish_payload(Peer& p, InboundHandler& handler) {
    InboundSink* sink = p.sink;
    end_payload(p);
    post(p);
    backoff_.reset();
    handler.on_message_complete(sink, p.env);
  }

  // Frees finished sends nobody waits for (packed and empty messages, finalize markers), in
  // the order they were started, stopping at the first one still in flight: testing every
  // one would run MPI's progress engine once per pending send.
  void reap() {
    for (auto it = inflight_.begin(); it != inflight_.end();) {
      if (it->msg != nullptr) {
        ++it;
        continue;
      }
      if (!complete(*it)) return;
      auto done = it++;
      forget(done);
    }
  }

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

}  // namespace

std::unique_ptr<RemoteTransport> make_mpi_transport(std::shared_ptr<MpiSession> session,
                                                    std::vector<int> remote) {
  return std::make_unique<MpiTransport>(std::move(session), std::move(remote));
}

}  // namespace shmdist::transport
