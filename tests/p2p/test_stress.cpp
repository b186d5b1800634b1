// Oversubscribed and sleep-heavy runs: more ranks than the machine has cores, and waiting
// forced onto the futex path (SHMDIST_SPIN_US=0), so that every hand-off goes through the
// doorbell. Each job is bounded by its timeouts: a lost wake-up or a deadlock fails the test
// (Timeout, PeerFailure or the job timeout) instead of hanging CI.
//
// A sleeping rank normally also wakes every 100 ms to check its peers' health, which would
// turn a lost wake-up into a mere 100 ms delay. The wake-up tests below set that interval to
// an hour (SHMDIST_HEALTH_CHECK_MS), so a single lost wake-up leaves its rank asleep until the
// group's timeout: the job fails with Timeout instead of passing slowly.
#include <boost/test/unit_test.hpp>

#include <thread>

#include "p2p_support.hpp"
#include "support/shm_check.hpp"

namespace dist = shmdist;
using namespace shmdist::test;
using namespace shmdist::test::p2p;

BOOST_FIXTURE_TEST_SUITE(stress, ShmLeakCheck)

// 8 ranks on this 2-core machine: every rank sends 1 MiB to every other rank with blocking
// sends (messages larger than the 1 MiB ring), then receives from each; twice. Deadlock-free with
// unlimited buffering, so it must finish, with every payload intact. (Once in sanitizer builds.)
BOOST_AUTO_TEST_CASE(all_to_all_1_mib_on_8_ranks) {
  constexpr int kRanks = 8;
  constexpr std::int64_t kBytes = 1 << 20;
  for (auto mode : all_modes()) {
    expect_job_ok(kRanks, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      for (int round = 0; round < (kSanitizerBuild ? 1 : 2); ++round) {
        for (int d = 1; d < kRanks; ++d) {
          const int dst = (me + d) % kRanks;
          dist::Tensor out = dist::empty({kBytes}, dist::kUInt8);
          fill_pattern(out, round * 4096 + me * 64 + dst);
          pg.send(out, dst, {}, round);
        }
        for (int d = 1; d < kRanks; ++d) {
          const int src = (me - d + kRanks) % kRanks;
          dist::Tensor in = dist::zeros({kBytes}, dist::kUInt8);
          RANK_REQUIRE_EQ(pg.recv(in, src, {}, round), src);
          require_pattern(in, round * 4096 + src * 64 + me, "from " + std::to_string(src));
        }
      }
    }, job_options(mode, 1 << 20));
  }
}

// Lost wake-up stress: no spinning at all, 4 ranks on 2 cores, two pairs ping-ponging in both
// directions (each side leads in turn), with blocking recv, any-source recv and irecv+wait
// alternating, so every hand-off sleeps on and rings the doorbell.
BOOST_AUTO_TEST_CASE(ping_pong_without_spinning_oversubscribed) {
  constexpr int kRounds = 2000;  // per direction and pair
  ScopedEnv no_spin("SHMDIST_SPIN_US", "0");
  ScopedEnv wake_ups_only("SHMDIST_HEALTH_CHECK_MS", "3600000");
  for (auto mode : all_modes()) {
    JobOptions o = job_options(mode);
    o.job_timeout = std::chrono::seconds(100);
    expect_job_ok(4, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      const int peer = me ^ 1;
      dist::Tensor t = dist::zeros(1, dist::kLong);
      auto receive = [&](int i) {
        switch (i % 3) {
          case 0: RANK_REQUIRE_EQ(pg.recv(t, peer), peer); break;
          case 1: RANK_REQUIRE_EQ(pg.recv(t, dist::ANY_SOURCE), peer); break;
          default: {
            dist::Work w = pg.irecv(t, peer);
            w.wait();
            RANK_REQUIRE_EQ(w.source_rank(), peer);
          }
        }
      };
      for (int leader : {0, 1}) {
        const bool leads = (me & 1) == leader;
        for (int i = 0; i < kRounds; ++i) {
          if (leads) {
            t.data<std::int64_t>()[0] = i;
            pg.send(t, peer);
            receive(i);
            RANK_REQUIRE_EQ(t.data<std::int64_t>()[0], i + 1);
          } else {
            receive(i);
            RANK_REQUIRE_EQ(t.data<std::int64_t>()[0], i);
            t.data<std::int64_t>()[0] = i + 1;
            pg.send(t, peer);
          }
        }
      }
    }, o);
  }
}

// Full-ring hand-offs without spinning, on the smallest ring (4 KiB, 512-byte records):
//  - head to head: both ranks of each pair send 2 MiB at once, so each one sleeps on a full
//    ring while its own inbound ring fills, and must be woken for space and for data;
//  - slow receiver: the receiver sleeps outside the library between receives, so the sender
//    blocks on a full ring and sleeps until the receiver frees space and wakes it.
// Two pairs on 2 cores; every byte verified.
BOOST_AUTO_TEST_CASE(full_ring_producer_consumer_without_spinning) {
  ScopedEnv no_spin("SHMDIST_SPIN_US", "0");
  ScopedEnv wake_ups_only("SHMDIST_HEALTH_CHECK_MS", "3600000");
  for (auto mode : all_modes()) {
    JobOptions o = job_options(mode, 4 << 10);
    o.job_timeout = std::chrono::seconds(100);
    expect_job_ok(4, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      const int peer = me ^ 1;
      {
        constexpr std::int64_t kBytes = 2 << 20;
        dist::Tensor out = dist::empty({kBytes}, dist::kUInt8);
        fill_pattern(out, 500 + me);
        pg.send(out, peer);
        dist::Tensor in = dist::zeros({kBytes}, dist::kUInt8);
        RANK_REQUIRE_EQ(pg.recv(in, peer), peer);
        require_pattern(in, 500 + peer, "head to head");
      }
      constexpr std::int64_t kChunk = 64 << 10;
      constexpr int kMessages = 24;
      for (int sender : {0, 1}) {
        if ((me & 1) == sender) {
          for (int k = 0; k < kMessages; ++k) {
            dist::Tensor out = dist::empty({kChunk}, dist::kUInt8);
            fill_pattern(out, 1000 * sender + k);
            pg.send(out, peer, {}, 1);
          }
        } else {
          for (int k = 0; k < kMessages; ++k) {
            std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a slow consumer
            dist::Tensor in = dist::zeros({kChunk}, dist::kUInt8);
            RANK_REQUIRE_EQ(pg.recv(in, peer, {}, 1), peer);
            require_pattern(in, 1000 * sender + k, "slow receiver, message " + std::to_string(k));
          }
        }
      }
    }, o);
  }
}

BOOST_AUTO_TEST_SUITE_END()
