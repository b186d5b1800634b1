// The MPI transport (mpi_transport.hpp). Compiled only when CMake finds MPI.

#include "transport/mpi_transport.hpp"

// Only the C API: keep the deprecated C++ bindings (and their link symbols) out.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <shmdist/errors.hpp>

#include <algorithm>
#include <climits>
#include <cstring>
#include <list>
#include <map>
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
    int provided = 0;
    // One thread of each process calls MPI at a time (the rank's thread).
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
      throw SetupError("MPI_Init_thread failed: shmdist needs MPI to reach ranks on other hosts; "
                       "start the program with mpirun");
    s->handles_->initialised_by_us = true;
  }
  MPI_Comm_dup(MPI_COMM_WORLD, &s->handles_->comm);
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
  const int len = static_cast<int>(value.size());
  std::vector<int> lens(size_);
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, handles_->comm);
  std::vector<int> displs(size_);
  int total = 0;
  for (int r = 0; r < size_; ++r) {
    displs[r] = total;
    total += lens[r];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  MPI_Allgatherv(value.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR,
                 handles_->comm);
  std::vector<std::string> out;
  for (int r = 0; r < size_; ++r) out.push_back(all.substr(displs[r], lens[r]));
  return out;
}

namespace {

constexpr int kHeaderTag = 1;
constexpr int kPayloadTag = 2;
constexpr std::uint64_t kChunk = std::uint64_t{1} << 30;  // MPI counts are ints
constexpr int kMessagesPerPoll = 32;
constexpr std::chrono::nanoseconds kPollMin = std::chrono::microseconds(10);
constexpr std::chrono::nanoseconds kPollMax = std::chrono::milliseconds(1);
constexpr std::chrono::nanoseconds kPollWhileSending = std::chrono::microseconds(100);
// Packed messages this rank may hold copies of, beyond which a send waits for MPI again (a
// receiver that never polls must not make us buffer without bound).
constexpr std::uint64_t kMaxBufferedBytes = std::uint64_t{4} << 20;

class MpiTransport final : public RemoteTransport {
 public:
  MpiTransport(std::shared_ptr<MpiSession> session, std::vector<int> remote)
      : session_(std::move(session)),
        comm_(session_->handles().comm),
        rank_(session_->rank()),
        world_(session_->size()),
        remote_(std::move(remote)),
        peers_(world_) {}

  ~MpiTransport() override {
    // Sends still in flight (finalize markers, packed and orphaned sends) must complete
    // before MPI is finalized; every peer drains its inbound traffic until it has seen our
    // marker. A rank ending without destroy_process_group may leave sends nobody takes: wait
    // for them a bounded time, then leave MPI as it is (mpirun then reports the rank's exit).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (auto it = inflight_.begin(); it != inflight_.end();) {
      if (complete(*it)) {
        it = inflight_.erase(it);
        continue;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        session_->abandon();
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  bool poll(InboundHandler& handler, int preferred, bool /*full_scan*/) override {
    reap();
    bool moved = false;
    if (preferred >= 0) moved |= take_from(preferred, handler);
    for (int i = 0; i < kMessagesPerPoll; ++i) {
      const int src = next_source(moved);
      if (src < 0) break;
      deliver(src, handler);
      moved = true;
    }
    if (moved) interval_ = kPollMin;
    return moved;
  }

  DirectResult receive_direct(int src, const Expectation& want) override {
    Peer& p = peers_[src];
    if (!p.stashed) fetch(src);
    if (!p.stashed) return DirectResult::Empty;  // nothing, or a finalize marker
    if (!(p.header == encode_header(want.env))) return DirectResult::Other;
    receive_payload(src, want.dest, 0);
    interval_ = kPollMin;
    return DirectResult::Received;
  }

  int receive_direct_any(const Expectation& want, DirectResult& result) override {
    bool moved = false;
    for (int i = 0; i < 4; ++i) {
      const int src = next_source(moved);
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
    auto it = sending_.find(dst);
    if (it == sending_.end()) return false;
    if (!complete(*it->second)) return false;
    msg.sent = msg.env.nbytes;
    msg.next += msg.env.nbytes;
    forget(it->second);
    sending_.erase(it);
    return true;
  }

  void flush() override { reap(); }
  bool inbound_in_progress(int) const override { return false; }  // payloads arrive whole
  bool inbound_pending(int src) const override {
    if (peers_[src].stashed) return true;
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(src, kHeaderTag, comm_, &flag, &st);
    int count = 0;
    if (flag) MPI_Get_count(&st, MPI_BYTE, &count);
    return count > 0;  // a finalize marker (0 bytes) is not data
  }
  bool sends_in_flight() const override { return !inflight_.empty(); }

  int awake_ranks() const override { return 1; }
  std::uint32_t arm() override { return 0; }
  void sleep(std::uint32_t, std::chrono::nanoseconds timeout) override {
    std::this_thread::sleep_for(std::min(timeout, poll_interval()));
  }
  void disarm() override {}

  std::chrono::nanoseconds poll_interval() override {
    if (!sending_.empty()) return std::min(interval_, kPollWhileSending);
    const auto now = interval_;
    interval_ = std::min(interval_ * 2, kPollMax);
    return now;
  }

  PeerState peer_state(int peer) override {
    if (peers_[peer].finalized) return {PeerStatus::Finalized, true, {}};
    return {PeerStatus::Running, false, {}};
  }
  // A rank on another host that dies ends the whole job through mpirun (Open MPI's error
  // handling names the rank and its host), so there is nothing to watch or record here.
  void check_job() override {}
  void report_failure(int) override {}
  void set_blocked(const BlockedInfo&) override {}
  void clear_blocked() override {}

  void mark_finalized() override {
    for (int peer : remote_) {
      Inflight& f = inflight_.emplace_back();
      f.reqs.emplace_back();
      MPI_Isend(nullptr, 0, MPI_BYTE, peer, kHeaderTag, comm_, &f.reqs.back());
    }
  }

 private:
  struct Peer {
    MessageHeader header{};
    bool stashed = false;         // `header` was received; its payload is not delivered yet
    bool packed = false;          // ... and the payload is in `staged`, after the header
    std::vector<std::byte> staged;  // a packed message as it arrived (header + payload)
    bool finalized = false;
  };
  struct Inflight {
    MessageHeader header{};
    std::vector<std::byte> packed;  // header + payload of a packed message
    std::vector<MPI_Request> reqs;
    OutboundMessage* msg = nullptr;  // set while the engine waits for it
  };

  bool complete(Inflight& f) {
    int flag = 0;
    MPI_Testall(static_cast<int>(f.reqs.size()), f.reqs.data(), &flag, MPI_STATUSES_IGNORE);
    return flag != 0;
  }

  void forget(std::list<Inflight>::iterator it) {
    buffered_ -= it->packed.size();
    inflight_.erase(it);
  }

  // A message of at most kMpiPackedMax payload bytes travels as one MPI message, header and
  // payload packed into a buffer of ours: one message crossing instead of two (over TCP the
  // second costs a whole extra latency), and the engine's send is done at once (its bytes
  // are copied) unless kMaxBufferedBytes are already held. A larger one sends the header,
  // then the payload straight from the tensor (no copy), and is done when MPI is.
  bool start_send(int dst, OutboundMessage& msg) {
    Inflight& f = inflight_.emplace_back();
    f.header = encode_header(msg.env);
    msg.started = true;
    const std::uint64_t n = msg.env.nbytes;
    if (n > 0 && n <= kMpiPackedMax) {
      f.packed.resize(sizeof(MessageHeader) + n);
      std::memcpy(f.packed.data(), &f.header, sizeof(MessageHeader));
      std::memcpy(f.packed.data() + sizeof(MessageHeader), msg.next, n);
      buffered_ += f.packed.size();
      f.reqs.emplace_back();
      MPI_Isend(f.packed.data(), static_cast<int>(f.packed.size()), MPI_BYTE, dst, kHeaderTag,
                comm_, &f.reqs.back());
      if (buffered_ <= kMaxBufferedBytes) {
        msg.sent = n;
        msg.next += n;
        return true;
      }
    } else {
      f.reqs.emplace_back();
      MPI_Isend(&f.header, sizeof f.header, MPI_BYTE, dst, kHeaderTag, comm_, &f.reqs.back());
      for (std::uint64_t off = 0; off < n; off += kChunk) {
        const auto len = static_cast<int>(std::min(kChunk, n - off));
        f.reqs.emplace_back();
        MPI_Isend(msg.next + off, len, MPI_BYTE, dst, kPayloadTag, comm_, &f.reqs.back());
      }
      // An empty message is done for the engine now (no user bytes are referenced); its
      // header buffer stays in inflight_ until MPI is done with it.
      if (n == 0) return true;
    }
    f.msg = &msg;
    sending_[dst] = std::prev(inflight_.end());
    return true;
  }

  // A source whose next message is stashed: stashed ones first (in rotation), then whatever
  // MPI has (MPI_ANY_SOURCE: only when nothing is stashed, so the message it takes cannot
  // queue behind a stashed one). -1 if none; sets `moved` if finalize markers were taken.
  int next_source(bool& moved) {
    for (std::size_t i = 0; i < remote_.size(); ++i) {
      cursor_ = cursor_ + 1 >= remote_.size() ? 0 : cursor_ + 1;
      if (peers_[remote_[cursor_]].stashed) return remote_[cursor_];
    }
    for (;;) {
      const int src = fetch(MPI_ANY_SOURCE);
      if (src < 0) return -1;
      if (peers_[src].stashed) return src;
      moved = true;  // a finalize marker
    }
  }

  // Receives the next message on the header tag from `src` (or any source) if one has
  // arrived: a header (its payload follows on the payload tag), a packed message, or a
  // finalize marker (0 bytes, stashes nothing). Returns its source, or -1 if none arrived.
  // The caller makes sure nothing is stashed for a source it may return.
  int fetch(int src) {
    int flag = 0;
    MPI_Message handle;
    MPI_Status st;
    MPI_Improbe(src, kHeaderTag, comm_, &flag, &handle, &st);
    if (!flag) return -1;
    const int from = st.MPI_SOURCE;
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    Peer& p = peers_[from];
    constexpr int kHeader = static_cast<int>(sizeof(MessageHeader));
    if (count != 0 && (count < kHeader || static_cast<std::uint64_t>(count) > kHeader + kMpiPackedMax))
      throw PeerFailure("rank " + std::to_string(from) + " sent a " + std::to_string(count) +
                        "-byte message header over MPI; expected 32 bytes, or 32 plus at most " +
                        std::to_string(kMpiPackedMax) + " payload bytes (is it running another "
                        "version of shmdist?)");
    if (count == 0) {
      MPI_Mrecv(nullptr, 0, MPI_BYTE, &handle, MPI_STATUS_IGNORE);
      p.finalized = true;
      return from;
    }
    p.packed = count > kHeader;
    if (p.packed) {
      p.staged.resize(static_cast<std::size_t>(count));
      MPI_Mrecv(p.staged.data(), count, MPI_BYTE, &handle, MPI_STATUS_IGNORE);
      std::memcpy(&p.header, p.staged.data(), sizeof(MessageHeader));
    } else {
      MPI_Mrecv(&p.header, count, MPI_BYTE, &handle, MPI_STATUS_IGNORE);
    }
    decode_header(p.header, sizeof(MessageHeader), from);  // throws PeerFailure if corrupt
    if (p.header.flags != 0 || (p.packed && p.header.nbytes != std::uint64_t(count - kHeader)))
      throw PeerFailure("rank " + std::to_string(from) + " sent a message over MPI whose header "
                        "(flags " + std::to_string(p.header.flags) + ", " +
                        std::to_string(p.header.nbytes) + " bytes) does not match its " +
                        std::to_string(count - kHeader) + " payload bytes; the stream from it "
                        "is corrupt");
    p.stashed = true;
    return from;
  }

  // Delivers the next message from `src`. Returns whether anything was received.
  bool take_from(int src, InboundHandler& handler) {
    Peer& p = peers_[src];
    if (!p.stashed) {
      if (fetch(src) < 0) return false;
      if (!p.stashed) return true;  // a finalize marker
    }
    deliver(src, handler);
    return true;
  }

  // Hands the engine the stashed message of `src`.
  void deliver(int src, InboundHandler& handler) {
    const Envelope env = decode_header(peers_[src].header, sizeof(MessageHeader), src);
    InboundSink* sink = handler.on_message_start(env);  // may throw: the message stays stashed
    receive_payload(src, sink->dest + sink->received, sink->received);
    sink->received = env.nbytes;
    handler.on_message_complete(sink, env);
  }

  // Puts the stashed message's payload from byte `from` on into `dest` and unstashes it. A
  // packed one is here already; otherwise its sender posted the payload with the header, so
  // this blocking receive waits only for the bytes to cross (MPI progresses every request
  // meanwhile).
  void receive_payload(int src, std::byte* dest, std::uint64_t from) {
    Peer& p = peers_[src];
    const std::uint64_t nbytes = p.header.nbytes - from;
    p.stashed = false;
    if (p.packed) {
      if (nbytes) std::memcpy(dest, p.staged.data() + sizeof(MessageHeader) + from, nbytes);
      return;
    }
    for (std::uint64_t off = 0; off < nbytes; off += kChunk) {
      const auto n = static_cast<int>(std::min(kChunk, nbytes - off));
      MPI_Status st;
      MPI_Recv(dest + off, n, MPI_BYTE, src, kPayloadTag, comm_, &st);
      int count = 0;
      MPI_Get_count(&st, MPI_BYTE, &count);
      if (count != n)
        throw PeerFailure("rank " + std::to_string(src) + " sent " + std::to_string(count) +
                          " payload bytes over MPI where its header announced " +
                          std::to_string(n) + "; the stream from it is corrupt");
    }
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
  std::vector<Peer> peers_;  // by global rank
  std::list<Inflight> inflight_;
  std::map<int, std::list<Inflight>::iterator> sending_;  // by destination: the engine's head
  std::uint64_t buffered_ = 0;  // bytes of packed messages in inflight_
  std::size_t cursor_ = 0;
  std::chrono::nanoseconds interval_ = kPollMin;
};

}  // namespace

std::unique_ptr<RemoteTransport> make_mpi_transport(std::shared_ptr<MpiSession> session,
                                                    std::vector<int> remote) {
  return std::make_unique<MpiTransport>(std::move(session), std::move(remote));
}

}  // namespace shmdist::transport
