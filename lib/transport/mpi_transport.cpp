// The MPI transport (mpi_transport.hpp, its class in mpi_transport_impl.hpp): its looks at
// MPI, message headers and packed messages, sends and failures. A larger message's payload
// arrives in mpi_payload.cpp. Compiled only when CMake finds MPI.

#include <sched.h>

#include <shmdist/errors.hpp>

#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>

#include "transport/mpi_transport_impl.hpp"

namespace shmdist::transport {
namespace {

constexpr int kMessagesPerPoll = 32;
// Packed messages this rank may hold copies of, beyond which a send waits for MPI again (a
// receiver that never polls must not make us buffer without bound).
constexpr std::uint64_t kMaxBufferedBytes = std::uint64_t{4} << 20;
// Finished send slots kept for reuse (with their buffers), so that a steady stream of small
// sends allocates nothing.
constexpr std::size_t kSpareSlots = 64;

}  // namespace

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

MpiTransport::MpiTransport(std::shared_ptr<MpiSession> session, std::vector<int> remote)
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

MpiTransport::~MpiTransport() {
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

// One look at MPI (MPI_Testsome over the posted receives) takes in whatever arrived; the
// preferred source is served first, then stashed messages in rotation. MPI is looked at
// again only while looks deliver, up to kMessagesPerPoll messages.
bool MpiTransport::poll(InboundHandler& handler, int preferred, bool /*full_scan*/) {
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

DirectResult MpiTransport::receive_direct(int src, const Expectation& want) {
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

int MpiTransport::receive_direct_any(const Expectation& want, DirectResult& result) {
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

bool MpiTransport::send_some(int dst, OutboundMessage& msg) {
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

bool MpiTransport::inbound_pending(int src) const {
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

std::chrono::nanoseconds MpiTransport::poll_interval() {
  if (receiving_ > 0) return PollBackoff::kMin;  // a payload moves only while we poll
  return backoff_.next(waiting_sends_ > 0);
}

void MpiTransport::send_finalized() {
  for (int peer : remote_) {
    Inflight& f = new_slot();
    f.dst = peer;
    isend(f, nullptr, 0, peer, kHeaderTag);
  }
}

// Sleeps a moment before the destructor looks again; past `deadline`, leaves MPI as it is
// (not finalized: it would wait for what is still in flight) and returns false.
bool MpiTransport::wait_a_little(std::chrono::steady_clock::time_point deadline) {
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
bool MpiTransport::complete(Inflight& f) {
  const int code = test_all(f);
  if (code == kPending) return false;
  if (code != MPI_SUCCESS && f.dst >= 0) send_failed(f.dst, code);
  return true;
}

// MPI_SUCCESS, kPending, or the error of a failed request of `f`.
int MpiTransport::test_all(Inflight& f) {
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
void MpiTransport::send_failed(int dst, int code) {
  std::string& why = peers_[dst].send_failure;
  if (why.empty()) why = mpi_failure(code, dst, "message");
}

// Records why the stream from `p` broke (the first reason stays). A payload that was
// arriving is over, unless a piece's receive is still posted (the engine may still ask to
// release it, and then abandons it).
void MpiTransport::mark_failed(Peer& p, std::string why) {
  if (p.sink && p.piece == MPI_REQUEST_NULL) end_payload(p);
  if (!p.failure.empty()) return;
  p.failure = std::move(why);
  ++failed_;
}

void MpiTransport::fail(Peer& p, std::string why) {
  mark_failed(p, std::move(why));
  throw PeerFailure(p.failure);
}

// Throws the failure of the first broken peer, if any.
void MpiTransport::rethrow_failure() const {
  if (failed_ == 0) return;
  for (int r : remote_)
    if (!peers_[r].failure.empty()) throw PeerFailure(peers_[r].failure);
}

// A send slot at the end of inflight_, reused from spare_ when one is there.
MpiTransport::Inflight& MpiTransport::new_slot() {
  if (spare_.empty()) return inflight_.emplace_back();
  inflight_.splice(inflight_.end(), spare_, spare_.begin());
  Inflight& f = inflight_.back();
  f.packed_bytes = 0;
  f.reqs.clear();
  f.msg = nullptr;
  return f;
}

void MpiTransport::forget(Slot it) {
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
bool MpiTransport::start_send(int dst, OutboundMessage& msg) {
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
void MpiTransport::isend(Inflight& f, const void* data, int len, int dst, int tag) {
  f.reqs.push_back(MPI_REQUEST_NULL);
  const int code = MPI_Isend(data, len, MPI_BYTE, dst, tag, comm_, &f.reqs.back());
  if (code != MPI_SUCCESS) {
    f.reqs.back() = MPI_REQUEST_NULL;
    send_failed(dst, code);
  }
}

// (Re)posts the receive on the header tag from `p`; if MPI refuses, the stream from `p` is
// broken (its next look throws).
void MpiTransport::post(Peer& p) {
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
bool MpiTransport::collect() {
  if (remote_.size() == 1) return collect_one(peers_[remote_[0]]);
  return collect_some() || collect_some();
}

bool MpiTransport::collect_some() {
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
bool MpiTransport::collect_one(Peer& p) {
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
void MpiTransport::arrived(Peer& p, const MPI_Status& st) {
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
int MpiTransport::next_stashed() {
  if (stashed_ == 0) return -1;
  for (std::size_t i = 0; i < remote_.size(); ++i) {
    cursor_ = cursor_ + 1 >= remote_.size() ? 0 : cursor_ + 1;
    if (peers_[remote_[cursor_]].stashed) return remote_[cursor_];
  }
  return -1;
}

// Hands the engine the stashed message of `src`: a packed one whole; a larger one's payload
// starts arriving (advance_payload).
void MpiTransport::deliver(int src, InboundHandler& handler) {
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
void MpiTransport::take_packed(Peer& p, std::byte* dest) {
  p.stashed = false;
  --stashed_;
  if (p.header.nbytes) std::memcpy(dest, p.staged.data() + sizeof(MessageHeader), p.header.nbytes);
  post(p);
}

// Frees finished sends nobody waits for (packed and empty messages, finalize markers), in
// the order they were started, stopping at the first one still in flight: testing every
// one would run MPI's progress engine once per pending send.
void MpiTransport::reap() {
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

std::unique_ptr<RemoteTransport> make_mpi_transport(std::shared_ptr<MpiSession> session,
                                                    std::vector<int> remote) {
  return std::make_unique<MpiTransport>(std::move(session), std::move(remote));
}

}  // namespace shmdist::transport
