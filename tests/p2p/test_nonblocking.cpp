// The non-blocking API (issue 4): isend/irecv ring exchanges at every size, head-to-head
// blocking sends far beyond the ring, a thousand outstanding any-source receives, Work
// semantics, and batch_isend_irecv.
#include <boost/test/unit_test.hpp>

#include <map>
#include <set>

#include "p2p_support.hpp"
#include "support/shm_check.hpp"

namespace dist = shmdist;
using namespace shmdist::test;
using namespace shmdist::test::p2p;

BOOST_FIXTURE_TEST_SUITE(nonblocking, ShmLeakCheck)

// Every rank isends to its right neighbour and irecvs from its left, with 2, 3 and 8 ranks and
// sizes from 1 byte to 16 MiB (4 MiB in sanitizer builds; odd sizes included); every payload is
// verified.
BOOST_AUTO_TEST_CASE(ring_exchange_with_isend_irecv) {
  const std::vector<std::int64_t> sizes = {1, 1000, 65537, 1 << 20, big_payload(16 << 20, 4 << 20)};
  for (auto mode : all_modes()) {
    for (int n : {2, 3, 8}) {
      BOOST_TEST_CONTEXT("mode " << mode_name(mode) << ", " << n << " ranks") {
        expect_job_ok(n, [&sizes](dist::ProcessGroup& pg) {
          const int me = pg.get_rank();
          const int world = pg.get_world_size();
          const int right = (me + 1) % world;
          const int left = (me - 1 + world) % world;
          for (std::size_t i = 0; i < sizes.size(); ++i) {
            dist::Tensor out = dist::empty({sizes[i]}, dist::kUInt8);
            fill_pattern(out, 100 * i + me);
            dist::Tensor in = dist::zeros({sizes[i]}, dist::kUInt8);
            dist::Work s = pg.isend(out, right, {}, static_cast<int>(i));
            dist::Work r = pg.irecv(in, left, {}, static_cast<int>(i));
            // Alternate the order of the waits: neither may depend on the other.
            if (i % 2) {
              s.wait();
              r.wait();
            } else {
              r.wait();
              s.wait();
            }
            RANK_REQUIRE(s.is_completed());
            RANK_REQUIRE(r.is_completed());
            RANK_REQUIRE_EQ(r.source_rank(), left);
            require_pattern(in, 100 * i + left, "size " + std::to_string(sizes[i]));
          }
        }, job_options(mode));
      }
    }
  }
}

// Both ranks send 64 MiB to each other with blocking sends (64x the default 1 MiB ring; 8 MiB in
// sanitizer builds), then receive: deadlock-free with unlimited buffering, so it must complete.
BOOST_AUTO_TEST_CASE(head_to_head_blocking_sends_of_64_mib) {
  constexpr std::int64_t kBytes = big_payload(64 << 20, 8 << 20);
  for (auto mode : all_modes()) {
    expect_job_ok(2, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      dist::Tensor out = dist::empty({kBytes}, dist::kUInt8);
      fill_pattern(out, 640 + me);
      pg.send(out, 1 - me);
      out = dist::Tensor();
      dist::Tensor in = dist::zeros({kBytes}, dist::kUInt8);
      RANK_REQUIRE_EQ(pg.recv(in, 1 - me), 1 - me);
      require_pattern(in, 640 + (1 - me), "64 MiB head to head");
    }, job_options(mode));
  }
}

// Rank 0 posts 1000 any-source irecvs, then 4 senders send 250 messages each (sender, seq).
// Every message arrives exactly once; receives are matched in posting order, so for every
// sender the sequence numbers seen across the receives, in posting order, are increasing
// (0, 1, 2, ... with no gap). The waits run in reverse posting order: completion does not
// depend on the order of waiting.
BOOST_AUTO_TEST_CASE(thousand_outstanding_any_source_irecvs) {
  static constexpr int kSenders = 4;
  static constexpr int kPerSender = 250;
  static constexpr int kReceives = kSenders * kPerSender;
  for (auto mode : all_modes()) {
    expect_job_ok(kSenders + 1, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      if (me != 0) {
        pg.barrier();  // rank 0 has posted all its receives
        std::vector<dist::Work> sends;
        for (int k = 0; k < kPerSender; ++k) {
          dist::Tensor t = dist::tensor({static_cast<std::int64_t>(me), std::int64_t{k}});
          if (k % 3 == 0) pg.send(t, 0, {}, 1);
          else sends.push_back(pg.isend(t, 0, {}, 1));
        }
        for (auto& w : sends) w.wait();
        return;
      }
      std::vector<dist::Tensor> bufs;
      std::vector<dist::Work> works;
      for (int i = 0; i < kReceives; ++i) {
        bufs.push_back(dist::full({2}, -1.0, dist::kLong));
        works.push_back(pg.irecv(bufs.back(), dist::ANY_SOURCE, {}, 1));
      }
      RANK_REQUIRE(!works.front().is_completed());
      pg.barrier();
      for (int i = kReceives - 1; i >= 0; --i) works[i].wait();
      std::vector<int> next(kSenders + 1, 0);
      for (int i = 0; i < kReceives; ++i) {
        const std::int64_t* v = bufs[i].data<std::int64_t>();
        const int src = works[i].source_rank();
        RANK_REQUIRE(src >= 1 && src <= kSenders);
        RANK_REQUIRE_EQ(v[0], src);
        if (v[1] != next[src])
          throw std::runtime_error("receive #" + std::to_string(i) + " got sequence " +
                                   std::to_string(v[1]) + " of sender " + std::to_string(src) +
                                   ", expected " + std::to_string(next[src]) +
                                   " (posting order not respected, or a loss/duplicate)");
        ++next[src];
      }
      for (int s = 1; s <= kSenders; ++s) RANK_REQUIRE_EQ(next[s], kPerSender);
    }, job_options(mode));
  }
}

// Work: wait(timeout) is false while the operation is pending; is_completed() turns true
// without wait() (it makes progress itself); source_rank() of a send throws InvalidArgument;
// an empty Work throws InvalidArgument.
BOOST_AUTO_TEST_CASE(work_wait_timeout_and_is_completed) {
  for (auto mode : all_modes()) {
    expect_job_ok(2, [](dist::ProcessGroup& pg) {
      if (pg.get_rank() == 0) {
        dist::Tensor go = dist::zeros(1);
        pg.recv(go, 1, {}, 2);  // rank 1 saw its irecv pending
        dist::Work s = pg.isend(dist::tensor({11, 12, 13}), 1, {}, 1);
        s.wait();
        RANK_REQUIRE(s.is_completed());
        RANK_REQUIRE(s.is_send());
        require_throws<dist::InvalidArgument>([&] { (void)s.source_rank(); }, {"send"},
                                              "source_rank of a send");
        dist::Work empty;
        require_throws<dist::InvalidArgument>([&] { empty.wait(); }, {"empty"},
                                              "wait on an empty Work");
        pg.barrier();
        return;
      }
      dist::Tensor t = dist::zeros(3, dist::kLong);
      dist::Work r = pg.irecv(t, 0, {}, 1);
      RANK_REQUIRE(!r.is_send());
      // Rank 0 cannot send before it gets "go": the receive is certainly pending.
      RANK_REQUIRE(!r.wait(std::chrono::milliseconds(50)));
      RANK_REQUIRE(!r.is_completed());
      pg.send(dist::zeros(1), 0, {}, 2);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!r.is_completed()) {
        if (std::chrono::steady_clock::now() > deadline)
          throw std::runtime_error("is_completed() never turned true");
        std::this_thread::yield();
      }
      RANK_REQUIRE_EQ(r.source_rank(), 0);
      RANK_REQUIRE(t.equal(dist::tensor({11, 12, 13})));
      RANK_REQUIRE(r.wait(std::chrono::milliseconds(0)));  // done: true, immediately
      r.wait();                                            // and wait() returns at once
      pg.barrier();
    }, job_options(mode));
  }
}

// A Work keeps its tensor's storage alive: the caller drops its Tensor handle right after isend
// / irecv and reuses the memory; the message still goes out intact (4 MiB, 64x the ring, so the
// isend is certainly still pending when the handle goes) and the irecv still completes. Rank 1
// enters the library only after rank 0 has checked and scribbled (a shared flag), so that a
// single-copy offer (read from rank 0's memory by rank 1) is still open then too.
BOOST_AUTO_TEST_CASE(work_keeps_storage_alive) {
  constexpr std::int64_t kBytes = 4 << 20;
  for (auto mode : all_modes()) {
    SharedCounters scribbled(1);
    expect_job_ok(2, [&scribbled](dist::ProcessGroup& pg) {
      if (pg.get_rank() == 0) {
        dist::Work s;
        {
          dist::Tensor t = dist::empty({kBytes}, dist::kUInt8);
          fill_pattern(t, 77);
          s = pg.isend(t, 1);
        }
        RANK_REQUIRE(!s.is_completed());
        // Allocations of the same size may reuse freed memory; scribble over them.
        std::vector<dist::Tensor> junk;
        for (int i = 0; i < 4; ++i) junk.push_back(dist::full({kBytes}, 255.0, dist::kUInt8));
        scribbled[0].store(1);
        pg.barrier();
        s.wait();
        dist::Work r;
        {
          dist::Tensor sink = dist::zeros(kBytes, dist::kUInt8);
          r = pg.irecv(sink, 1, {}, 1);
        }
        pg.barrier();
        r.wait();
        RANK_REQUIRE_EQ(r.source_rank(), 1);
      } else {
        scribbled.wait_at_least(0, 1);
        pg.barrier();
        dist::Tensor t = dist::zeros(kBytes, dist::kUInt8);
        RANK_REQUIRE_EQ(pg.recv(t, 0), 0);
        require_pattern(t, 77, "isend whose tensor handle was dropped");
        pg.barrier();
        dist::Tensor out = dist::empty({kBytes}, dist::kUInt8);
        fill_pattern(out, 78);
        pg.send(out, 0, {}, 1);
      }
    }, job_options(mode, 64 << 10));
  }
}

// torch's batch_isend_irecv example: rank r sends [2r, 2r+1] (float) to r+1 and receives from
// r-1; and the same on a sub-group. Mixing groups in one batch throws InvalidArgument.
BOOST_AUTO_TEST_CASE(batch_isend_irecv_ring) {
  for (auto mode : all_modes()) {
    for (int n : {2, 4}) {
      BOOST_TEST_CONTEXT("mode " << mode_name(mode) << ", " << n << " ranks") {
        expect_job_ok(n, [](dist::ProcessGroup& pg) {
          const int rank = pg.get_rank();
          const int world = pg.get_world_size();
          dist::Tensor send_tensor = dist::arange(2, dist::kFloat32);
          float* s = send_tensor.data<float>();
          s[0] += 2.0f * rank;
          s[1] += 2.0f * rank;
          dist::Tensor recv_tensor = dist::full({2}, -1.0, dist::kFloat32);
          const int left = (rank - 1 + world) % world;
          auto reqs = pg.batch_isend_irecv(
              {dist::P2PSend(send_tensor, (rank + 1) % world), dist::P2PRecv(recv_tensor, left)});
          RANK_REQUIRE_EQ(reqs.size(), std::size_t{2});
          for (auto& req : reqs) req.wait();
          RANK_REQUIRE(recv_tensor.equal(dist::tensor({2.0f * left, 2.0f * left + 1})));
          RANK_REQUIRE_EQ(reqs[1].source_rank(), left);
          if (world == 2)  // the docs' printed results
            RANK_REQUIRE_EQ(recv_tensor.to_string(),
                            std::string(rank == 0 ? "tensor([2., 3.])" : "tensor([0., 1.])"));

          // On a sub-group of the even ranks (global ranks as peers), with a tag.
          std::vector<int> evens;
          for (int r = 0; r < world; r += 2) evens.push_back(r);
          dist::Group g = pg.new_group(evens);
          if (evens.size() > 1 && rank % 2 == 0) {
            const int gw = static_cast<int>(evens.size());
            const int gr = pg.get_rank(g);
            dist::Tensor in = dist::zeros(2);
            auto gr_reqs = pg.batch_isend_irecv(
                {dist::P2PRecv(in, pg.get_global_rank(g, (gr - 1 + gw) % gw), g, 3),
                 dist::P2PSend(send_tensor, pg.get_global_rank(g, (gr + 1) % gw), g, 3)});
            for (auto& req : gr_reqs) req.wait();
            const int from = pg.get_global_rank(g, (gr - 1 + gw) % gw);
            RANK_REQUIRE_EQ(gr_reqs[0].source_rank(), from);
            RANK_REQUIRE(in.equal(dist::tensor({2.0f * from, 2.0f * from + 1})));
          }

          dist::Group all = pg.new_group([&] {
            std::vector<int> v;
            for (int r = 0; r < world; ++r) v.push_back(r);
            return v;
          }());
          dist::Tensor x = dist::zeros(2);
          require_throws<dist::InvalidArgument>(
              [&] {
                pg.batch_isend_irecv({dist::P2PSend(send_tensor, (rank + 1) % world),
                                      dist::P2PRecv(x, (rank - 1 + world) % world, all)});
              },
              {"same group"}, "batch mixing the world and a sub-group");
          pg.barrier();
        }, job_options(mode));
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
