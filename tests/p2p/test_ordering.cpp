// Matching and ordering: FIFO per (source, tag), tags taken in any order without deadlock, and
// any-source receives that lose nothing, keep each sender's order and starve no sender.
#include <boost/test/unit_test.hpp>

#include <map>

#include "p2p_support.hpp"
#include "support/shm_check.hpp"

namespace dist = shmdist;
using namespace shmdist::test;
using namespace shmdist::test::p2p;

BOOST_FIXTURE_TEST_SUITE(ordering, ShmLeakCheck)

// 300 messages on tags 0, 1, 2 in rotation, sent with send and isend mixed; the receiver takes
// all of tag 2, then tag 0, then tag 1: each tag's messages come in the order they were sent.
BOOST_AUTO_TEST_CASE(fifo_per_source_and_tag) {
  constexpr int kMessages = 300;
  for (auto mode : all_modes()) {
    expect_job_ok(2, [](dist::ProcessGroup& pg) {
      if (pg.get_rank() == 0) {
        std::vector<dist::Work> pending;
        for (int k = 0; k < kMessages; ++k) {
          dist::Tensor t = dist::tensor({static_cast<std::int64_t>(k)});
          if (k % 2) pg.send(t, 1, {}, k % 3);
          else pending.push_back(pg.isend(t, 1, {}, k % 3));
        }
        for (auto& w : pending) w.wait();
      } else {
        for (int tag : {2, 0, 1}) {
          for (int k = tag; k < kMessages; k += 3) {
            dist::Tensor t = dist::zeros(1, dist::kLong);
            RANK_REQUIRE_EQ(pg.recv(t, 0, {}, tag), 0);
            RANK_REQUIRE_EQ(t.data<std::int64_t>()[0], k);
          }
        }
      }
    }, job_options(mode));
  }
}

// gloo deadlocks here; shmdist must not: two blocking sends of 4 MiB (64x the ring) on tags 1
// then 2, received tag 2 first. The first send can only complete because the receiver, while
// blocked on tag 2, takes tag 1's bytes in as an unexpected message.
BOOST_AUTO_TEST_CASE(tags_received_in_the_opposite_order) {
  constexpr std::int64_t kBytes = 4 << 20;
  for (auto mode : all_modes()) {
    expect_job_ok(2, [](dist::ProcessGroup& pg) {
      if (pg.get_rank() == 0) {
        for (int tag : {1, 2}) {
          dist::Tensor t = dist::empty({kBytes}, dist::kUInt8);
          fill_pattern(t, tag);
          pg.send(t, 1, {}, tag);
        }
      } else {
        for (int tag : {2, 1}) {
          dist::Tensor t = dist::zeros({kBytes}, dist::kUInt8);
          RANK_REQUIRE_EQ(pg.recv(t, 0, {}, tag), 0);
          require_pattern(t, tag, "tag " + std::to_string(tag));
        }
      }
    }, job_options(mode, 64 << 10));
  }
}

// 8 ranks: 7 senders, rank 0 receives everything with ANY_SOURCE.
//
// Part 1 makes starvation observable without timing: every sender queues kQueued messages and
// reports it through a shared counter; rank 0 makes no library call (so takes nothing in) until
// all 7 have done so, and only then starts receiving. With every sender's messages waiting at
// once, a fair any-source receive must serve every sender early: each sender has to appear in
// the first half of those 7 * kQueued receives. (Draining one ring completely before looking at
// the next would serve the last sender only after 6 * kQueued messages.)
//
// Part 2: each sender then streams kStreamed more while rank 0 keeps receiving.
// Throughout: the returned source matches the payload's sender, every sender's sequence numbers
// arrive exactly once and in order, and nothing is left over.
BOOST_AUTO_TEST_CASE(any_source_from_seven_senders_is_fair_and_ordered) {
  constexpr int kRanks = 8;
  constexpr int kQueued = 500;    // 64-byte records: 32 KB per ring, far below the 1 MiB ring
  constexpr int kStreamed = 300;
  for (auto mode : all_modes()) {
    SharedCounters queued(1);
    expect_job_ok(kRanks, [&queued](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      if (me != 0) {
        for (int k = 0; k < kQueued + kStreamed; ++k) {
          if (k == kQueued) queued[0].fetch_add(1);
          pg.send(dist::tensor({static_cast<std::int64_t>(me), static_cast<std::int64_t>(k)}), 0);
        }
        return;
      }
      queued.wait_at_least(0, kRanks - 1);
      std::vector<int> next(kRanks, 0);
      std::vector<int> first_seen(kRanks, -1);
      const int total = (kRanks - 1) * (kQueued + kStreamed);
      for (int i = 0; i < total; ++i) {
        dist::Tensor t = dist::zeros(2, dist::kLong);
        const int src = pg.recv(t, dist::ANY_SOURCE);
        const std::int64_t* v = t.data<std::int64_t>();
        RANK_REQUIRE(src >= 1 && src < kRanks);
        RANK_REQUIRE_EQ(v[0], src);
        RANK_REQUIRE_EQ(v[1], next[src]);  // no loss, no duplicate, no reordering per sender
        ++next[src];
        if (first_seen[src] < 0) first_seen[src] = i;
      }
      for (int s = 1; s < kRanks; ++s) {
        RANK_REQUIRE_EQ(next[s], kQueued + kStreamed);
        if (first_seen[s] >= (kRanks - 1) * kQueued / 2)
          throw std::runtime_error("sender " + std::to_string(s) + " was first served at receive " +
                                   std::to_string(first_seen[s]) + " although its " +
                                   std::to_string(kQueued) +
                                   " messages were all waiting from the start (starved)");
      }
    }, job_options(mode, 1 << 20));
  }
}

// ANY_SOURCE still matches the exact tag, and stays FIFO per sender after specific-source
// receives on the same tag took some of a sender's messages.
BOOST_AUTO_TEST_CASE(any_source_matches_only_its_tag) {
  for (auto mode : all_modes()) {
    expect_job_ok(3, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      if (me != 0) {
        for (int k = 0; k < 20; ++k)
          pg.send(dist::tensor({static_cast<std::int64_t>(me * 1000 + k)}), 0, {}, k % 2 ? 7 : 5);
        pg.barrier();
        return;
      }
      pg.barrier();  // everything has arrived; now the choice is purely the matching's
      std::map<int, int> next{{1, 0}, {2, 0}};
      auto take = [&](int src_wanted) {
        dist::Tensor t = dist::zeros(1, dist::kLong);
        const int src = pg.recv(t, src_wanted, {}, 7);
        if (src_wanted != dist::ANY_SOURCE) RANK_REQUIRE_EQ(src, src_wanted);
        const std::int64_t v = t.data<std::int64_t>()[0];
        RANK_REQUIRE_EQ(v / 1000, src);
        RANK_REQUIRE_EQ(v % 1000, 2 * next[src] + 1);  // tag 7 carries the odd k, in order
        ++next[src];
      };
      for (int i = 0; i < 5; ++i) take(2);
      for (int i = 0; i < 15; ++i) take(dist::ANY_SOURCE);
      RANK_REQUIRE_EQ(next[1], 10);
      RANK_REQUIRE_EQ(next[2], 10);
      for (int i = 0; i < 20; ++i) {  // then tag 5: the even k
        dist::Tensor t = dist::zeros(1, dist::kLong);
        const int src = pg.recv(t, dist::ANY_SOURCE, {}, 5);
        RANK_REQUIRE_EQ(t.data<std::int64_t>()[0] % 2, 0);
        RANK_REQUIRE_EQ(t.data<std::int64_t>()[0] / 1000, src);
      }
    }, job_options(mode));
  }
}

BOOST_AUTO_TEST_SUITE_END()
