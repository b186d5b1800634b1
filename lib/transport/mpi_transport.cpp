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
    // Sends still in flight (finalize markers, orphaned sends) must complete before MPI is
    // finalized; every peer drains its inbound traffic until it has seen our marker. A rank
    // ending without destroy_process_group may leave sends nobody takes: wait for them a
    // bounded time, then leave MPI as it is (mpirun then reports the rank's exit).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (auto it = inflight_.begin(); it != inflight_.end();) {
      int flag = 0;
      MPI_Testall(static_cast<int>(it->reqs.size()), it->reqs.data(), &flag, MPI_STATUSES_IGNORE);
      if (flag) {
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
      const int src = next_source();
      if (src < 0 || !take_from(src, handler)) break;
      moved = true;
    }
    if (moved) interval_ = kPollMin;
    return moved;
  }

  DirectResult receive_direct(int src, const Expectation& want) override {
    Peer& p = peers_[src];
    if (!p.stashed && !fetch_header(src)) return DirectResult::Empty;
    if (!p.stashed) return DirectResult::Empty;  // it was a finalize marker
    if (!(p.header == encode_header(want.env))) return DirectResult::Other;
    receive_payload(src, want.dest, want.env.nbytes);
    p.stashed = false;
    interval_ = kPollMin;
    return DirectResult::Received;
  }

  int receive_direct_any(const Expectation& want, DirectResult& result) override {
    for (int i = 0; i < 4; ++i) {
      const int src = next_source();
      if (src < 0) break;
      result = receive_direct(src, want);
      if (result == DirectResult::Received) return src;
      if (result == DirectResult::Other) return -1;
    }
    result = DirectResult::Empty;
    return -1;
  }

  bool send_some(int dst, OutboundMessage& msg) override {
    bool moved = false;
    if (!msg.started) {
      Inflight& f = inflight_.emplace_back();
      f.header = encode_header(msg.env);
      f.reqs.emplace_back();
      MPI_Isend(&f.header, sizeof f.header, MPI_BYTE, dst, kHeaderTag, comm_, &f.reqs.back());
      for (std::uint64_t off = 0; off < msg.env.nbytes; off += kChunk) {
        const auto n = static_cast<int>(std::min(kChunk, msg.env.nbytes - off));
        f.reqs.emplace_back();
        MPI_Isend(msg.next + off, n, MPI_BYTE, dst, kPayloadTag, comm_, &f.reqs.back());
      }
      msg.started = true;
      moved = true;
      // An empty message is done for the engine now (no user bytes are referenced); its
      // header buffer stays in inflight_ until MPI is done with it.
      if (msg.env.nbytes == 0) return true;
      f.msg = &msg;
      sending_[dst] = std::prev(inflight_.end());
    }
    auto it = sending_.find(dst);
    if (it == sending_.end()) return moved;
    Inflight& f = *it->second;
    int flag = 0;
    MPI_Testall(static_cast<int>(f.reqs.size()), f.reqs.data(), &flag, MPI_STATUSES_IGNORE);
    if (!flag) return moved;
    msg.sent = msg.env.nbytes;
    msg.next += msg.env.nbytes;
    inflight_.erase(it->second);
    sending_.erase(it);
    return true;
  }

  void flush() override { reap(); }
  bool inbound_in_progress(int) const override { return false; }  // payloads arrive whole
  bool inbound_pending(int src) const override {
    if (peers_[src].stashed) return true;
    const int count = probe_header(src);
    return count > 0;  // a finalize marker (0 bytes) is not data
  }

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
    bool stashed = false;  // `header` was received; its payload is still in MPI
    bool finalized = false;
  };
  struct Inflight {
    MessageHeader header{};
    std::vector<MPI_Request> reqs;
    OutboundMessage* msg = nullptr;  // set while the engine waits for it
  };

  // A source with a header ready: stashed ones first (in rotation), then whatever MPI has.
  int next_source() {
    for (std::size_t i = 0; i < remote_.size(); ++i) {
      cursor_ = cursor_ + 1 >= remote_.size() ? 0 : cursor_ + 1;
      if (peers_[remote_[cursor_]].stashed) return remote_[cursor_];
    }
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, kHeaderTag, comm_, &flag, &st);
    return flag ? st.MPI_SOURCE : -1;
  }

  // The size in bytes of the next header message from `src` (0: a finalize marker), or -1 if
  // none has arrived.
  int probe_header(int src) const {
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(src, kHeaderTag, comm_, &flag, &st);
    if (!flag) return -1;
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    return count;
  }

  // Receives the next header from `src` if one is there. Returns whether one was received
  // (a finalize marker counts, and leaves nothing stashed).
  bool fetch_header(int src) {
    const int count = probe_header(src);
    if (count < 0) return false;
    Peer& p = peers_[src];
    if (count != 0 && count != static_cast<int>(sizeof(MessageHeader)))
      throw PeerFailure("rank " + std::to_string(src) + " sent a " + std::to_string(count) +
                        "-byte message header over MPI; expected 32 bytes (is it running "
                        "another version of shmdist?)");
    MPI_Recv(count ? &p.header : nullptr, count, MPI_BYTE, src, kHeaderTag, comm_,
             MPI_STATUS_IGNORE);
    if (count == 0) {
      p.finalized = true;
      return true;
    }
    decode_header(p.header, sizeof(MessageHeader), src);  // throws PeerFailure if corrupt
    p.stashed = true;
    return true;
  }

  // Delivers the next message from `src`. Returns whether anything was received.
  bool take_from(int src, InboundHandler& handler) {
    Peer& p = peers_[src];
    if (!p.stashed) {
      if (!fetch_header(src)) return false;
      if (!p.stashed) return true;  // a finalize marker
    }
    const Envelope env = decode_header(p.header, sizeof(MessageHeader), src);
    InboundSink* sink = handler.on_message_start(env);  // may throw: the header stays stashed
    receive_payload(src, sink->dest + sink->received, env.nbytes - sink->received);
    sink->received = env.nbytes;
    p.stashed = false;
    handler.on_message_complete(sink, env);
    return true;
  }

  // The payload follows its header; its sender posted it with the header, so this blocking
  // receive waits only for the bytes to cross (MPI progresses every request meanwhile).
  void receive_payload(int src, std::byte* dest, std::uint64_t nbytes) {
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

  // Frees the requests of finished sends nobody waits for (empty messages, finalize markers).
  void reap() {
    for (auto it = inflight_.begin(); it != inflight_.end();) {
      if (it->msg != nullptr) {
        ++it;
        continue;
      }
      int flag = 0;
      MPI_Testall(static_cast<int>(it->reqs.size()), it->reqs.data(), &flag, MPI_STATUSES_IGNORE);
      it = flag ? inflight_.erase(it) : std::next(it);
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
  std::size_t cursor_ = 0;
  std::chrono::nanoseconds interval_ = kPollMin;
};

}  // namespace

std::unique_ptr<RemoteTransport> make_mpi_transport(std::shared_ptr<MpiSession> session,
                                                    std::vector<int> remote) {
  return std::make_unique<MpiTransport>(std::move(session), std::move(remote));
}

}  // namespace shmdist::transport
