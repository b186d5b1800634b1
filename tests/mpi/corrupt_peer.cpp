// A peer that breaks the MPI transport's wire format, against the real transport: run as 2 or
// 3 ranks under mpirun (test_across_hosts.cpp). Rank 0 polls an MpiTransport to every other
// rank until it has both of "good"'s messages or a failure, then half a second more (at most
// 30 s in all), and prints what it got: "PEERFAILURE <text>" once per distinct failure, "GOT tag
// T nbytes N bad B" per delivered message (B: bytes that differ from what rank 1 sent), then
// "END IN_PROGRESS 0 RELEASED 1" if no message from rank 1 is left arriving. Rank 2,
// if there, sends nothing (so rank 0 looks at two peers at once, MPI_Testsome's path). Rank 1
// writes on the transport's communicator by hand, as a corrupt peer or another build would:
//   good        a pieced message (64 KiB: header, then two pieces) and a packed one (100 B);
//   long_packed a packed message of 40000 payload bytes (a build that packs up to 64 KiB):
//               longer than the receive posted for it;
//   one_payload a 64 KiB payload as one message (a build before payloads went in pieces):
//               longer than the piece posted for it;
//   desync      a 64 KiB message whose first piece is short, its second piece, then a correct
//               64 KiB message: the stream is broken after the short piece, so nothing after
//               it may be delivered (its bytes would be the broken message's).
//   no_payload  the header of a 256 KiB message, and never its payload: rank 0 polls for 1.5 s
//               and prints "POLLS_RETURNED yes" if its polls came back (the transport did not
//               wait inside one for the payload), "IN_PROGRESS 1" if the message is still
//               arriving, and "RELEASED 1" if release_inbound() could stop it (MPI had
//               matched nothing to the piece's receive); then the transport ends, cancelling it.
//   stalled     an honest sender that stops calling MPI midway: after a barrier (connections
//               up), a 256 KiB message (its payload one rendezvous message), then 4 s without
//               a call into MPI. Rank 0 polls for 1.5 s, prints "IN_PROGRESS 1" and "RELEASED
//               0" (MPI matched the piece: it cannot be cancelled), gives the message up
//               (abandon_inbound) and prints the PeerFailure its next poll raises; its
//               transport's end then waits for the piece, which lands when rank 1 goes on.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <shmdist/errors.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "transport/frame.hpp"
#include "transport/mpi_transport.hpp"

namespace {

using namespace shmdist;
using namespace shmdist::transport;

constexpr int kHeaderTag = 1;   // as mpi_transport_impl.hpp
constexpr int kPayloadTag = 2;

std::byte pattern(std::size_t i, int tag) { return std::byte((i * 7 + tag * 31) & 0xff); }

std::vector<std::byte> payload(std::size_t n, int tag) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = pattern(i, tag);
  return b;
}

MessageHeader header(int tag, std::uint64_t n) {
  MessageHeader h{};
  h.tag = tag;
  h.dtype = static_cast<std::uint8_t>(DType::UInt8);
  h.numel = n;
  h.nbytes = n;
  return h;
}

class Collector final : public InboundHandler {
 public:
  int delivered = 0;
  InboundSink* on_message_start(const Envelope& env) override {
    bytes_.assign(env.nbytes, std::byte{0});
    sink_ = {};
    sink_.dest = bytes_.data();
    return &sink_;
  }
  void on_message_complete(InboundSink*, const Envelope& env) override {
    std::size_t bad = 0;
    for (std::size_t i = 0; i < bytes_.size(); ++i) bad += bytes_[i] != pattern(i, env.key.tag);
    std::printf("GOT tag %d nbytes %llu bad %zu\n", env.key.tag,
                static_cast<unsigned long long>(env.nbytes), bad);
    ++delivered;
  }

 private:
  InboundSink sink_;
  std::vector<std::byte> bytes_;
};

void victim(int world, const std::string& mode) {
  using Clock = std::chrono::steady_clock;
  auto session = MpiSession::start();
  {
    std::vector<int> others;
    for (int r = 1; r < world; ++r) others.push_back(r);
    auto transport = make_mpi_transport(session, others);
    Collector collector;
    if (mode == "stalled" || mode == "no_payload") MPI_Barrier(MPI_COMM_WORLD);  // links up
    if (mode == "no_payload" || mode == "stalled") {
      const auto end = Clock::now() + std::chrono::milliseconds(1500);
      int polls = 0;
      while (Clock::now() < end) {
        transport->poll(collector, -1, true);
        ++polls;
      }
      std::printf("POLLS_RETURNED %s\nIN_PROGRESS %d\n", polls > 1 ? "yes" : "no",
                  transport->inbound_in_progress(1) ? 1 : 0);
      const bool released = transport->release_inbound(1);
      std::printf("RELEASED %d\n", released ? 1 : 0);
      if (mode == "stalled") {
        transport->abandon_inbound(1, nullptr);  // the collector outlives the transport
        try {
          transport->poll(collector, -1, true);
          std::printf("NO FAILURE\n");
        } catch (const PeerFailure& e) {
          std::printf("PEERFAILURE %s\n", e.what());
        }
      }
      std::fflush(stdout);
      transport.reset();
      MPI_Barrier(MPI_COMM_WORLD);
      return;
    }
    std::set<std::string> failures;
    auto end = Clock::now() + std::chrono::seconds(30);
    bool settled = false;  // the outcome is in: from now on only the grace period
    while (Clock::now() < end) {
      bool moved = false;
      try {
        moved = transport->poll(collector, -1, true);
      } catch (const PeerFailure& e) {
        if (failures.insert(e.what()).second) std::printf("PEERFAILURE %s\n", e.what());
      }
      if (!settled && (collector.delivered >= 2 || !failures.empty())) {
        settled = true;
        end = Clock::now() + std::chrono::milliseconds(500);
      }
      if (!moved) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    // Nothing from rank 1 is left arriving, whatever became of its messages.
    std::printf("END IN_PROGRESS %d RELEASED %d\n", transport->inbound_in_progress(1) ? 1 : 0,
                transport->release_inbound(1) ? 1 : 0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

void corrupt_peer(const std::string& mode) {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);  // the transport's communicator (MpiSession::start)
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  std::vector<MPI_Request> reqs;
  std::vector<std::vector<std::byte>> keep;
  auto send = [&](std::vector<std::byte> bytes, int tag) {
    keep.push_back(std::move(bytes));
    reqs.emplace_back();
    MPI_Isend(keep.back().data(), static_cast<int>(keep.back().size()), MPI_BYTE, 0, tag, comm,
              &reqs.back());
  };
  auto send_header = [&](const MessageHeader& h) {
    std::vector<std::byte> b(sizeof h);
    std::memcpy(b.data(), &h, sizeof h);
    send(std::move(b), kHeaderTag);
  };
  auto send_packed = [&](int tag, std::size_t n) {
    std::vector<std::byte> b(sizeof(MessageHeader) + n);
    const MessageHeader h = header(tag, n);
    std::memcpy(b.data(), &h, sizeof h);
    const auto p = payload(n, tag);
    std::memcpy(b.data() + sizeof h, p.data(), n);
    send(std::move(b), kHeaderTag);
  };
  auto send_pieces = [&](int tag, std::size_t n, std::size_t first_piece) {
    send_header(header(tag, n));
    const auto p = payload(n, tag);
    send({p.begin(), p.begin() + static_cast<std::ptrdiff_t>(first_piece)}, kPayloadTag);
    for (std::size_t at = 32768; at < n; at += 32768)
      send({p.begin() + static_cast<std::ptrdiff_t>(at),
            p.begin() + static_cast<std::ptrdiff_t>(std::min(n, at + 32768))},
           kPayloadTag);
  };
  if (mode == "good") {
    send_pieces(1, 65536, 32768);
    send_packed(2, 100);
  } else if (mode == "long_packed") {
    send_packed(1, 40000);
  } else if (mode == "one_payload") {
    send_header(header(1, 65536));
    send(payload(65536, 1), kPayloadTag);
  } else if (mode == "desync") {
    send_pieces(1, 65536, 1000);
    send_pieces(2, 65536, 32768);
  } else if (mode == "no_payload") {
    MPI_Barrier(MPI_COMM_WORLD);
    send_header(header(1, 256 << 10));
  } else if (mode == "stalled") {
    MPI_Barrier(MPI_COMM_WORLD);
    send_header(header(1, 256 << 10));
    send(payload(256 << 10, 1), kPayloadTag);
    std::this_thread::sleep_for(std::chrono::seconds(4));  // no MPI call meanwhile
  }
  // Until MPI is done with the sends (at most 30 s): the victim's receives take what they
  // take; what they leave is dropped.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int done = 0;
  while (!done && std::chrono::steady_clock::now() < end) {
    MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (MPI_Request& r : reqs)
    if (r != MPI_REQUEST_NULL) {
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Comm_free(&comm);
}

// A well-behaved peer with nothing to say: the transport's communicator, then the end.
void silent_peer() {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Comm_free(&comm);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr,
                 "usage: mpirun -n 2|3 %s good|long_packed|one_payload|desync|no_payload|"
                 "stalled\n",
                 argv[0]);
    return 2;
  }
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (rank == 0) victim(world, argv[1]);
  else if (rank == 1) corrupt_peer(argv[1]);
  else silent_peer();
  std::fflush(stdout);
  MPI_Finalize();
  return 0;
}
