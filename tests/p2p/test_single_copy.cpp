// Single copy for large messages (transport/single_copy.hpp) keeps every promise of the ring
// path: data at every size and dtype pair, unexpected offers (taken in while the receiver does
// something else), any-source order, count mismatches that keep the message, a blocking send
// that times out and is revoked (its bytes still arrive whole, from a private copy), head-to-
// head sends, a sender that dies before its offer is read (PeerFailure, no crash), and a
// tensor in memory only its owner can read (memfd_secret: streamed instead). Each
// case runs with SHMDIST_SINGLE_COPY=4K and, where the ring path must agree, with off.
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "p2p_support.hpp"
#include "support/shm_check.hpp"

namespace dist = shmdist;
using namespace shmdist::test;
using namespace shmdist::test::p2p;

BOOST_FIXTURE_TEST_SUITE(single_copy, ShmLeakCheck)

// Sizes around and far above the threshold, both directions, same dtype and converting.
BOOST_AUTO_TEST_CASE(large_messages_arrive_whole_with_and_without_single_copy) {
  const std::vector<std::int64_t> sizes = {4096, 65536, (1 << 20) + 3, big_payload(8 << 20, 1 << 20)};
  for (const char* setting : {"4K", "off"}) {
    ScopedEnv env("SHMDIST_SINGLE_COPY", setting);
    for (auto mode : all_modes()) {
      BOOST_TEST_CONTEXT("SHMDIST_SINGLE_COPY=" << setting << ", mode " << mode_name(mode)) {
        expect_job_ok(2, [&sizes](dist::ProcessGroup& pg) {
          const int me = pg.get_rank();
          for (std::size_t i = 0; i < sizes.size(); ++i) {
            dist::Tensor out = dist::empty({sizes[i]}, dist::kUInt8);
            fill_pattern(out, 10 * i + me);
            dist::Tensor in = dist::zeros({sizes[i]}, dist::kUInt8);
            if (me == 0) {
              pg.send(out, 1, {}, static_cast<int>(i));
              RANK_REQUIRE_EQ(pg.recv(in, 1, {}, static_cast<int>(i)), 1);
            } else {
              RANK_REQUIRE_EQ(pg.recv(in, 0, {}, static_cast<int>(i)), 0);
              pg.send(out, 0, {}, static_cast<int>(i));
            }
            require_pattern(in, 10 * i + (1 - me), "size " + std::to_string(sizes[i]));
          }
          // int32 into float32: the offer's bytes are converted like streamed ones.
          constexpr std::int64_t kCount = 300000;
          if (me == 0) {
            dist::Tensor ints = dist::arange(kCount).to(dist::kInt32);
            pg.send(ints, 1, {}, 99);
          } else {
            dist::Tensor floats = dist::zeros({kCount}, dist::kFloat32);
            pg.recv(floats, 0, {}, 99);
            for (std::int64_t k = 0; k < kCount; k += 997)
              RANK_REQUIRE_EQ(floats.data<float>()[k], static_cast<float>(k));
            RANK_REQUIRE_EQ(floats.data<float>()[kCount - 1], static_cast<float>(kCount - 1));
          }
        }, job_options(mode));
      }
    }
  }
}

// Offers that arrive before their receive is posted are taken in (copied into a private
// buffer) by whatever call the receiver makes, so the sender's Work completes; later receives
// get them in per-(source, tag) order, any-source included, and a count mismatch keeps one.
BOOST_AUTO_TEST_CASE(unexpected_offers_keep_order_and_count_checks) {
  ScopedEnv env("SHMDIST_SINGLE_COPY", "4K");
  constexpr std::int64_t kBytes = 1 << 20;
  for (auto mode : all_modes()) {
    SharedCounters posted(1);
    BOOST_TEST_CONTEXT("mode " << mode_name(mode)) {
      expect_job_ok(2, [&posted](dist::ProcessGroup& pg) {
        if (pg.get_rank() == 0) {
          std::vector<dist::Tensor> outs;
          std::vector<dist::Work> works;
          for (int k = 0; k < 3; ++k) {
            outs.push_back(dist::empty({kBytes}, dist::kUInt8));
            fill_pattern(outs.back(), 500 + k);
            works.push_back(pg.isend(outs.back(), 1, {}, k == 1 ? 2 : 1));  // tags 1, 2, 1
          }
          posted[0].store(1);
          for (auto& w : works) w.wait();  // completes although rank 1 receives tag 2 first
          pg.send(dist::tensor({1}), 1, {}, 7);
        } else {
          posted.wait_at_least(0, 1);
          dist::Tensor in = dist::zeros({kBytes}, dist::kUInt8);
          RANK_REQUIRE_EQ(pg.recv(in, 0, {}, 2), 0);
          require_pattern(in, 501, "tag 2");
          dist::Tensor wrong = dist::zeros({kBytes / 2}, dist::kUInt8);
          require_throws<dist::InvalidArgument>([&] { pg.recv(wrong, 0, {}, 1); },
                                                {"expected 524288 elements", "stays queued"},
                                                "a receive of the wrong size");
          RANK_REQUIRE_EQ(pg.recv(in, dist::ANY_SOURCE, {}, 1), 0);
          require_pattern(in, 500, "first tag 1");
          RANK_REQUIRE_EQ(pg.recv(in, dist::ANY_SOURCE, {}, 1), 0);
          require_pattern(in, 502, "second tag 1");
          dist::Tensor ack = dist::zeros(1, dist::kLong);
          pg.recv(ack, 0, {}, 7);
        }
      }, job_options(mode));
    }
  }
}

// A blocking send whose receiver takes nothing times out; its offer is revoked (the receiver
// never claimed it), the caller may reuse its tensor at once, and the message still arrives
// whole: streamed from a private copy once the receiver looks.
BOOST_AUTO_TEST_CASE(a_timed_out_send_is_revoked_and_still_arrives) {
  ScopedEnv env("SHMDIST_SINGLE_COPY", "4K");
  for (auto mode : all_modes()) {
    SharedCounters flag(1);
    JobOptions o = job_options(mode);
    o.timeout = std::chrono::milliseconds(500);
    o.job_timeout = std::chrono::seconds(60);
    BOOST_TEST_CONTEXT("mode " << mode_name(mode)) {
      expect_job_ok(2, [&flag](dist::ProcessGroup& pg) {
        constexpr std::int64_t kBytes = 2 << 20;
        if (pg.get_rank() == 0) {
          dist::Tensor big = dist::empty({kBytes}, dist::kUInt8);
          fill_pattern(big, 77);
          require_throws<dist::Timeout>([&] { pg.send(big, 1, {}, 4); }, {"timed out", "rank 1"},
                                        "a send nobody receives");
          fill_pattern(big, 78);  // the caller owns its tensor again
          flag[0].store(1);
          dist::Tensor ack = dist::zeros(1, dist::kLong);
          pg.recv(ack, 1, {}, 5);  // makes progress: the copy streams meanwhile
          RANK_REQUIRE_EQ(ack.data<std::int64_t>()[0], 1);
        } else {
          flag.wait_at_least(0, 1);
          dist::Tensor big = dist::zeros({kBytes}, dist::kUInt8);
          RANK_REQUIRE_EQ(pg.recv(big, 0, {}, 4), 0);
          require_pattern(big, 77, "the timed-out send's message");
          pg.send(dist::tensor({1}), 0, {}, 5);
        }
      }, o);
    }
  }
}

// Many ranks offering to each other at once, each both sending and receiving large messages
// before it receives: no rank may wait for another's receive.
BOOST_AUTO_TEST_CASE(everyone_sends_large_to_everyone_then_receives) {
  ScopedEnv env("SHMDIST_SINGLE_COPY", "4K");
  constexpr std::int64_t kBytes = big_payload(3 << 20, 1 << 20);
  for (auto mode : all_modes()) {
    BOOST_TEST_CONTEXT("mode " << mode_name(mode)) {
      expect_job_ok(4, [](dist::ProcessGroup& pg) {
        const int me = pg.get_rank();
        const int world = pg.get_world_size();
        dist::Tensor out = dist::empty({kBytes}, dist::kUInt8);
        fill_pattern(out, 900 + me);
        for (int d = 1; d < world; ++d) pg.send(out, (me + d) % world);
        dist::Tensor in = dist::zeros({kBytes}, dist::kUInt8);
        for (int d = 1; d < world; ++d) {
          const int from = pg.recv(in, dist::ANY_SOURCE);
          require_pattern(in, 900 + from, "from rank " + std::to_string(from));
        }
      }, job_options(mode));
    }
  }
}

// The sender dies (SIGKILL) after offering, before the receiver reads: the receive ends with
// PeerFailure (the copy finds the process gone, or the peer check does), never a crash.
BOOST_AUTO_TEST_CASE(a_sender_dying_before_the_copy_is_a_peer_failure) {
  ScopedEnv env("SHMDIST_SINGLE_COPY", "4K");
  SharedCounters flag(1);
  const auto outcomes = run_job(2, [&flag](dist::ProcessGroup& pg) {
    constexpr std::int64_t kBytes = 4 << 20;
    if (pg.get_rank() == 0) {
      dist::Tensor big = dist::empty({kBytes}, dist::kUInt8);
      fill_pattern(big, 5);
      dist::Work w = pg.isend(big, 1);
      flag[0].store(1);
      raise(SIGKILL);
    }
    flag.wait_at_least(0, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // rank 0 is gone by then
    dist::Tensor in = dist::zeros({kBytes}, dist::kUInt8);
    pg.recv(in, 0);
  }, job_options(Mode::Processes));
  BOOST_REQUIRE(outcomes.size() == 2u);
  BOOST_TEST(outcomes[0].signal == SIGKILL);
  BOOST_TEST(outcomes[1].error.find("PeerFailure") != std::string::npos, outcomes[1].error);
}

#ifdef SYS_memfd_secret
namespace {
// 1 MiB of memfd_secret memory (readable by this process only: process_vm_readv gets EFAULT),
// or nullptr with errno set.
void* secret_memory(std::size_t n) {
  const int fd = static_cast<int>(syscall(SYS_memfd_secret, 0));
  if (fd < 0) return nullptr;
  void* mem = ftruncate(fd, static_cast<off_t>(n)) == 0
                  ? mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
  const int saved = errno;
  close(fd);
  errno = saved;
  return mem == MAP_FAILED ? nullptr : mem;
}
}  // namespace

// An isend of a tensor over memfd_secret memory, larger than the ring: the receiver's copy
// gets EFAULT from a sender that runs, answers Streaming, and the message streams whole.
BOOST_AUTO_TEST_CASE(a_tensor_only_its_owner_can_read_is_streamed_instead) {
  constexpr std::size_t kBytes = 1 << 20;
  if (void* probe = secret_memory(kBytes)) {
    munmap(probe, kBytes);
  } else {
    BOOST_TEST_MESSAGE("memfd_secret unavailable here (" << std::strerror(errno)
                                                         << "): case skipped");
    return;
  }
  ScopedEnv env("SHMDIST_SINGLE_COPY", "4K");
  expect_job_ok(2, [](dist::ProcessGroup& pg) {
    if (pg.get_rank() == 0) {
      void* mem = secret_memory(kBytes);
      if (!mem) throw std::runtime_error("memfd_secret failed in rank 0: " + std::string(std::strerror(errno)));
      dist::Tensor secret = dist::Tensor::from_blob(mem, {static_cast<std::int64_t>(kBytes)}, dist::kUInt8);
      fill_pattern(secret, 31);
      dist::Work w = pg.isend(secret, 1, {}, 6);
      w.wait();
      pg.send(secret, 1, {}, 7);  // and a blocking send
      munmap(mem, kBytes);
    } else {
      dist::Tensor in = dist::zeros({static_cast<std::int64_t>(kBytes)}, dist::kUInt8);
      RANK_REQUIRE_EQ(pg.recv(in, 0, {}, 6), 0);
      require_pattern(in, 31, "the isend from memfd_secret memory");
      dist::Tensor again = dist::zeros({static_cast<std::int64_t>(kBytes)}, dist::kUInt8);
      RANK_REQUIRE_EQ(pg.recv(again, 0, {}, 7), 0);
      require_pattern(again, 31, "the send from memfd_secret memory");
    }
  }, job_options(Mode::Processes, 64 * 1024));
}
#endif

BOOST_AUTO_TEST_SUITE_END()
