// Random point-to-point traffic among all ranks until a peer fails (or MAX_SECONDS pass).
//
//   storm_rank SEED MAX_SECONDS
//
// Every rank draws the same schedule from SEED: in each round, a shift s picks the pattern
// "send to rank+s, receive from rank-s" (deadlock-free with any buffering) and one of three
// ways to do it (isend+recv, irecv+send, batch_isend_irecv), sometimes receiving from any
// source. Message sizes vary per (round, sender), from empty to a few hundred KiB, so that
// messages stream through the rings. Contents are checked.
//
// Output: "READY rank=R pid=P world=W"; on PeerFailure "PEER_FAILURE rank=R t=NS what=...",
// exit 42; after MAX_SECONDS (rank 0's clock) without failure "STORM_DONE rank=R rounds=N",
// exit 0.
#include <random>
#include <string>
#include <vector>

#include "report.hpp"

namespace dist = shmdist;
using namespace shmdist::programs;

namespace {

std::int64_t elements_for(std::uint64_t seed, std::int64_t round, int sender) {
  static constexpr std::int64_t kSizes[] = {0, 1, 7, 64, 1000, 4096, 20'000, 100'000};
  std::mt19937_64 rng(seed * 1'000'003 + static_cast<std::uint64_t>(round) * 131 +
                      static_cast<std::uint64_t>(sender));
  return kSizes[rng() % std::size(kSizes)];
}

std::int32_t stamp(std::int64_t round, int sender) {
  return static_cast<std::int32_t>((round % 1'000'000) * 64 + sender);
}

// Whether to stop: rank 0 decides by its clock and tells everyone, so that all ranks stop
// after the same round (a rank that stopped alone would leave its peers waiting for it).
bool time_is_up(std::chrono::steady_clock::time_point stop_at) {
  dist::Tensor flag = dist::zeros(1, dist::kInt);
  const int world = dist::get_world_size();
  if (dist::get_rank() == 0) {
    flag.data<std::int32_t>()[0] = std::chrono::steady_clock::now() >= stop_at;
    for (int r = 1; r < world; ++r) dist::send(flag, r, {}, /*tag=*/1'000'000);
  } else {
    dist::recv(flag, 0, {}, /*tag=*/1'000'000);
  }
  return flag.data<std::int32_t>()[0] != 0;
}

int storm(std::uint64_t seed, int max_seconds) {
  dist::init_process_group("shm");
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();
  emit("READY rank=" + std::to_string(rank) + " pid=" + std::to_string(getpid()) +
       " world=" + std::to_string(world));
  dist::barrier();
  std::mt19937_64 schedule(seed);
  const auto stop_at = std::chrono::steady_clock::now() + std::chrono::seconds(max_seconds);
  std::int64_t round = 0;
  try {
    for (;; ++round) {
      if (round % 64 == 0 && time_is_up(stop_at)) break;
      const int shift = 1 + static_cast<int>(schedule() % static_cast<std::uint64_t>(world - 1));
      const int how = static_cast<int>(schedule() % 3);
      const bool any_source = schedule() % 4 == 0;
      const int dst = (rank + shift) % world;
      const int src = (rank - shift + world) % world;
      const int tag = static_cast<int>(round % 100'000);
      dist::Tensor out = dist::full({elements_for(seed, round, rank)}, 0, dist::kInt);
      if (out.numel() > 0) {
        out.data<std::int32_t>()[0] = stamp(round, rank);
        out.data<std::int32_t>()[out.numel() - 1] = stamp(round, rank);
      }
      dist::Tensor in = dist::zeros({elements_for(seed, round, src)}, dist::kInt);
      const int from = any_source && how != 2 ? dist::ANY_SOURCE : src;
      int got = src;
      if (how == 0) {
        dist::Work w = dist::isend(out, dst, {}, tag);
        got = dist::recv(in, from, {}, tag);
        w.wait();
      } else if (how == 1) {
        dist::Work w = dist::irecv(in, from, {}, tag);
        dist::send(out, dst, {}, tag);
        w.wait();
        got = w.source_rank();
      } else {
        auto works = dist::batch_isend_irecv({dist::P2PSend(out, dst, {}, tag),
                                              dist::P2PRecv(in, src, {}, tag)});
        for (auto& w : works) w.wait();
      }
      const std::int32_t* got_data = in.data<std::int32_t>();
      const bool ok = got == src && (in.numel() == 0 ||
                                     (got_data[0] == stamp(round, src) &&
                                      got_data[in.numel() - 1] == stamp(round, src)));
      if (!ok) {
        emit("CORRUPT rank=" + std::to_string(rank) + " round=" + std::to_string(round) +
             " from=" + std::to_string(got) + " expected=" + std::to_string(src));
        return kExitUnexpected;
      }
    }
  } catch (const dist::PeerFailure& e) {
    emit("PEER_FAILURE rank=" + std::to_string(rank) + " t=" + std::to_string(steady_ns()) +
         " round=" + std::to_string(round) + " what=" + one_line(e.what()));
    dist::destroy_process_group();
    return kExitCaughtPeerFailure;
  }
  emit("STORM_DONE rank=" + std::to_string(rank) + " rounds=" + std::to_string(round));
  dist::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main([&] {
    if (argc != 3) {
      emit_err("usage: storm_rank SEED MAX_SECONDS");
      return 2;
    }
    return storm(std::stoull(argv[1]), std::atoi(argv[2]));
  });
}
