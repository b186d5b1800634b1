// Embedding: ProcessGroup objects without global state, launch() in process and thread mode,
// byte and struct messages, and the heat-diffusion example.
#include <signal.h>

#include <atomic>
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <thread>

#include "support/job.hpp"
#include "support/process.hpp"
#include "support/shm_check.hpp"

namespace dist = shmdist;
using shmdist::test::all_modes;
using shmdist::test::expect_job_ok;
using shmdist::test::JobOptions;
using shmdist::test::mode_name;
using shmdist::test::run_job;

BOOST_FIXTURE_TEST_SUITE(embedding, shmdist::test::ShmLeakCheck)

// Two jobs run at the same time in one process, each with its own groups: no global state.
// (Boost.Test is not thread-safe: the jobs' threads only collect outcomes; checks come after.)
BOOST_AUTO_TEST_CASE(independent_jobs_in_one_process) {
  auto job = [](int salt) {
    JobOptions o;
    o.mode = dist::LaunchOptions::Mode::Threads;
    return run_job(3, [salt](dist::ProcessGroup& pg) {
      const dist::Group pair = pg.new_group({0, 2});
      for (int i = 0; i < 200; ++i) {
        if (pg.get_rank() == 0) {
          pg.send(dist::tensor({std::int64_t(salt), std::int64_t(i)}), 2, pair);
        } else if (pg.get_rank() == 2) {
          dist::Tensor t = dist::zeros(2, dist::kLong);
          RANK_REQUIRE_EQ(pg.recv(t, 0, pair), 0);
          RANK_REQUIRE_EQ(t.data<std::int64_t>()[0], salt);
          RANK_REQUIRE_EQ(t.data<std::int64_t>()[1], i);
        }
      }
      pg.barrier();
    }, o);
  };
  std::vector<dist::RankOutcome> first, second;
  std::thread a([&] { first = job(1); });
  std::thread b([&] { second = job(2); });
  a.join();
  b.join();
  for (const auto* outcomes : {&first, &second}) {
    BOOST_TEST(outcomes->size() == 3u);
    for (const auto& r : *outcomes) BOOST_TEST(r.ok(), "rank " << r.rank << ": " << r.error);
  }
}

struct Particle {
  double x, y, z;
  std::int32_t id;
  std::uint8_t alive;
};

BOOST_AUTO_TEST_CASE(bytes_and_structs_match_and_order_like_tensors) {
  for (auto mode : all_modes()) {
    BOOST_TEST_CONTEXT(mode_name(mode)) {
      JobOptions o;
      o.mode = mode;
      expect_job_ok(2, [](dist::ProcessGroup& pg) {
        if (pg.get_rank() == 0) {
          const char text[] = "hello, shmdist";
          pg.send_bytes(std::as_bytes(std::span(text)), 1, {}, 5);
          for (int i = 0; i < 10; ++i)
            pg.send_object(Particle{1.0 * i, 2.0, 3.0, i, 1}, 1, {}, 6);
          std::vector<std::byte> blob(100'000);
          for (std::size_t i = 0; i < blob.size(); ++i) blob[i] = std::byte(i * 7);
          pg.send_bytes(blob, 1, {}, 7);
          pg.send_bytes(std::as_bytes(std::span(text)), 1, {}, 8);
        } else {
          // Tags received out of order: tag 7 (any size) first, then the others.
          int from = -1;
          const std::vector<std::byte> blob = pg.recv_bytes(0, {}, 7, &from);
          RANK_REQUIRE_EQ(from, 0);
          RANK_REQUIRE_EQ(blob.size(), std::size_t{100'000});
          for (std::size_t i = 0; i < blob.size(); ++i)
            RANK_REQUIRE(blob[i] == std::byte(i * 7));
          char text[15] = {};
          RANK_REQUIRE_EQ(pg.recv_bytes(std::as_writable_bytes(std::span(text)), 0, {}, 5), 0);
          RANK_REQUIRE(std::strcmp(text, "hello, shmdist") == 0);
          for (int i = 0; i < 10; ++i) {
            Particle p{};
            RANK_REQUIRE_EQ(pg.recv_object(p, dist::ANY_SOURCE, {}, 6), 0);
            RANK_REQUIRE_EQ(p.id, i);
            RANK_REQUIRE(p.x == 1.0 * i && p.alive == 1);
          }
          // A span of the wrong size is refused and the message stays queued.
          char small[4];
          bool refused = false;
          try {
            pg.recv_bytes(std::as_writable_bytes(std::span(small)), 0, {}, 8);
          } catch (const dist::InvalidArgument& e) {
            refused = std::string(e.what()).find("15 elements") != std::string::npos;
          }
          RANK_REQUIRE(refused);
          RANK_REQUIRE_EQ(pg.recv_bytes(0, {}, 8).size(), std::size_t{15});
        }
      }, o);
    }
  }
}

BOOST_AUTO_TEST_CASE(launch_reports_each_rank_outcome) {
  for (auto mode : all_modes()) {
    BOOST_TEST_CONTEXT(mode_name(mode)) {
      JobOptions o;
      o.mode = mode;
      o.timeout = std::chrono::seconds(30);
      const auto outcomes = run_job(3, [](dist::ProcessGroup& pg) {
        if (pg.get_rank() == 1) throw std::runtime_error("rank 1 gives up");
        dist::Tensor t = dist::zeros(1);
        pg.recv(t, 1);  // never sent: must end with PeerFailure, not hang
      }, o);
      BOOST_REQUIRE_EQUAL(outcomes.size(), 3u);
      BOOST_TEST(outcomes[1].error.find("std::runtime_error: rank 1 gives up") != std::string::npos,
                 outcomes[1].error);
      for (int r : {0, 2}) {
        BOOST_TEST(!outcomes[r].ok());
        BOOST_TEST(outcomes[r].error.find("shmdist::PeerFailure") != std::string::npos,
                   outcomes[r].error);
        BOOST_TEST(outcomes[r].error.find("rank 1") != std::string::npos, outcomes[r].error);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(launch_reports_a_rank_killed_by_a_signal) {
  JobOptions o;
  o.timeout = std::chrono::seconds(30);
  const auto outcomes = run_job(2, [](dist::ProcessGroup& pg) {
    if (pg.get_rank() == 0) raise(SIGKILL);
    dist::Tensor t = dist::zeros(1);
    pg.recv(t, 0);
  }, o);
  BOOST_TEST(outcomes[0].signal == SIGKILL);
  BOOST_TEST(outcomes[1].error.find("killed by signal 9 (SIGKILL)") != std::string::npos,
             outcomes[1].error);
}

BOOST_AUTO_TEST_CASE(free_functions_work_in_thread_mode) {
  JobOptions o;
  o.mode = dist::LaunchOptions::Mode::Threads;
  expect_job_ok(2, [](dist::ProcessGroup&) {
    dist::init_process_group();  // already joined by launch(): a no-op
    RANK_REQUIRE(dist::is_initialized());
    if (dist::get_rank() == 0) {
      dist::send(dist::tensor({10, 20, 30, 40}), 1);
    } else {
      dist::Tensor res = dist::zeros(4, dist::kLong);
      RANK_REQUIRE_EQ(dist::recv(res, 0), 0);
      RANK_REQUIRE_EQ(res.to_string(), std::string("tensor([10, 20, 30, 40])"));
    }
    dist::destroy_process_group();
  }, o);
}

BOOST_AUTO_TEST_CASE(heat_example_matches_single_process_run) {
  const std::string heat = shmdist::test::examples_dir() + "/heat1d";
  const std::string expected =
      "heat1d: 4 ranks, 4096 cells, 2000 steps, total heat 68200.000000: identical to the "
      "single-process run\n";
  shmdist::test::CommandOptions options;
  options.timeout = std::chrono::seconds(120);
  for (const auto& argv : std::vector<std::vector<std::string>>{
           {heat, "--ranks", "4"},
           {heat, "--ranks", "4", "--threads"},
           {shmdist::test::shmrun_path(), "-n", "4", heat}}) {
    const auto r = shmdist::test::run_command(argv, options);
    BOOST_TEST_CONTEXT(argv.back()) {
      BOOST_TEST(r.exit_code == 0, r.err);
      BOOST_TEST(r.out == expected);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

// Issue 27.11: initializing again after destroy_process_group works in a launch() rank as
// under shmrun, in both modes: every rank destroys, then initializes again and gets a working
// group of the same world (twice over, and the ProcessGroup the rank function got works again).
// (Before: the second init_process_group threw InvalidArgument.)
BOOST_AUTO_TEST_CASE(init_again_after_destroy_in_a_launched_rank_works) {
  for (auto mode : all_modes()) {
    BOOST_TEST_CONTEXT(mode_name(mode)) {
      JobOptions o;
      o.mode = mode;
      expect_job_ok(3, [](dist::ProcessGroup& pg) {
        const int rank = pg.get_rank();
        for (int round = 0; round < 3; ++round) {
          RANK_REQUIRE(dist::is_initialized());
          RANK_REQUIRE_EQ(dist::get_rank(), rank);
          RANK_REQUIRE_EQ(dist::get_world_size(), 3);
          dist::Tensor t = dist::full({4}, static_cast<float>(rank + 1 + 10 * round));
          dist::all_reduce(t);  // 1 + 2 + 3 + 30 * round
          RANK_REQUIRE_EQ(t.to_string(), dist::full({4}, 6.0f + 30 * round).to_string());
          dist::Tensor p = dist::zeros(1, dist::kInt);  // a message around the ring
          if (rank == 0) {
            pg.send(dist::full({1}, round, dist::kInt), 1);
            pg.recv(p, 2);
          } else {
            pg.recv(p, rank - 1);
            pg.send(p, (rank + 1) % 3);
          }
          RANK_REQUIRE_EQ(p.to_string(), dist::full({1}, round, dist::kInt).to_string());
          dist::destroy_process_group();
          RANK_REQUIRE(!dist::is_initialized());
          dist::init_process_group();
        }
        // The ProcessGroup launch() handed over is this rank's group again.
        RANK_REQUIRE(pg.is_initialized());
        pg.barrier();
      }, o);
    }
  }
}

// Mismatched re-initializations fail at once with a clear error, never wait out the timeout
// or mix: one rank initializes again while the other returns from its rank function (rank 0
// re-initializing, then rank 1, which waits for rank 0's claim in process mode).
BOOST_AUTO_TEST_CASE(init_again_by_one_rank_only_fails_plainly) {
  for (auto mode : all_modes()) {
    for (int again : {0, 1}) {
      BOOST_TEST_CONTEXT(mode_name(mode) << ", rank " << again << " initializes again") {
        JobOptions o;
        o.mode = mode;
        const auto outcomes = run_job(2, [again](dist::ProcessGroup& pg) {
          const int rank = pg.get_rank();
          dist::destroy_process_group();
          if (rank != again) return;
          dist::InitOptions init;
          init.timeout = std::chrono::seconds(50);  // longer than the job may take: see below
          dist::init_process_group("shm", init);
        }, o);
        BOOST_REQUIRE_EQUAL(outcomes.size(), 2u);
        BOOST_TEST(outcomes[1 - again].ok(), outcomes[1 - again].error);
        // Not the timeout's message: the rank learned that its peer will never come.
        const std::string& e = outcomes[again].error;
        BOOST_TEST(!outcomes[again].ok());
        BOOST_TEST(e.find("shmdist::SetupError") != std::string::npos, e);
        BOOST_TEST(e.find("init_process_group on rank " + std::to_string(again)) !=
                       std::string::npos, e);
        BOOST_TEST(e.find("rank " + std::to_string(1 - again) +
                          " will not initialize again: its rank function already ended") !=
                       std::string::npos, e);
      }
    }
  }
}
