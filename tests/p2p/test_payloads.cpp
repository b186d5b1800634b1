// What a message carries: every dtype bit-exactly, every size from 0 bytes to 64 MiB (far
// beyond the ring), and dtype conversion on receive on every path a message can take
// (posted receive, complete unexpected message, message still streaming in).
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "p2p_support.hpp"
#include "support/shm_check.hpp"

namespace dist = shmdist;
using namespace shmdist::test;
using namespace shmdist::test::p2p;

namespace {

constexpr dist::DType kAllDTypes[] = {dist::kBool,    dist::kUInt8,    dist::kInt8,
                                      dist::kInt16,   dist::kInt32,    dist::kInt64,
                                      dist::kFloat16, dist::kBFloat16, dist::kFloat32,
                                      dist::kFloat64};

// Random bits for every dtype (NaN payloads, denormals, -0. included), 0/1 for bool.
dist::Tensor random_bits(dist::DType dtype, std::vector<std::int64_t> shape, std::uint64_t seed) {
  dist::Tensor t = dist::empty(std::move(shape), dtype);
  fill_pattern(t, seed);
  if (dtype == dist::kBool) {
    auto* b = static_cast<unsigned char*>(t.data_ptr());
    for (std::size_t i = 0; i < t.nbytes(); ++i) b[i] &= 1;
  }
  return t;
}

void require_same_bytes(const dist::Tensor& got, const dist::Tensor& want,
                        const std::string& what) {
  RANK_REQUIRE_EQ(got.dtype(), want.dtype());
  RANK_REQUIRE_EQ(got.nbytes(), want.nbytes());
  if (std::memcmp(got.data_ptr(), want.data_ptr(), got.nbytes()) != 0)
    throw std::runtime_error(what + ": received bytes differ from the sent ones");
}

// Values that exercise every conversion rule (truncation, wrap, overflow, nan/inf, rounding).
dist::Tensor conversion_source(dist::DType dtype) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // 20 values: more than 16, so the bfloat16 NaN layout rule (blocks of 16) is exercised.
  return dist::tensor({0.0, 1.0, -1.0, 2.5, -2.5, 7.0, 300.0, -300.0, 65504.0, 1e5, 0.1, nan, inf,
                       -inf, 127.9, -128.5, 255.5, 1e20, -0.0, 70001.7},
                      dist::kFloat64)
      .to(dtype);
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(payloads, ShmLeakCheck)

// Every dtype goes there and back bit-exactly (same dtype: no conversion may touch the bits),
// in a 2-d shape; a receive tensor of another shape with the same element count is accepted.
BOOST_AUTO_TEST_CASE(every_dtype_round_trips_bit_exactly) {
  for (auto mode : all_modes()) {
    expect_job_ok(2, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      for (int d = 0; d < dist::kNumDTypes; ++d) {
        const dist::DType dtype = kAllDTypes[d];
        const std::string what = std::string(dist::dtype_name(dtype));
        const dist::Tensor there = random_bits(dtype, {3, 37}, 100 + d);
        const dist::Tensor back = random_bits(dtype, {3, 37}, 200 + d);
        if (me == 0) {
          pg.send(there, 1, {}, d);
          dist::Tensor got = dist::zeros({111}, dtype);  // same count, other shape
          RANK_REQUIRE_EQ(pg.recv(got, 1, {}, d), 1);
          RANK_REQUIRE(got.sizes() == std::vector<std::int64_t>{111});
          require_same_bytes(got, back, what + " back");
        } else {
          dist::Tensor got = dist::zeros({3, 37}, dtype);
          RANK_REQUIRE_EQ(pg.recv(got, 0, {}, d), 0);
          RANK_REQUIRE(got.equal(there));
          require_same_bytes(got, there, what + " there");
          pg.send(back, 0, {}, d);
        }
      }
    }, job_options(mode));
  }
}

// 0-d scalars and tensors with a zero-size dimension are messages too.
BOOST_AUTO_TEST_CASE(scalars_and_empty_tensors) {
  for (auto mode : all_modes()) {
    expect_job_ok(2, [](dist::ProcessGroup& pg) {
      if (pg.get_rank() == 0) {
        pg.send(dist::scalar_tensor(5), 1);
        pg.send(dist::zeros({2, 0}, dist::kFloat64), 1, {}, 1);
        pg.send(dist::scalar_tensor(2.5), 1, {}, 2);
      } else {
        dist::Tensor s = dist::zeros(std::vector<std::int64_t>{}, dist::kLong);
        RANK_REQUIRE_EQ(pg.recv(s, 0), 0);
        RANK_REQUIRE_EQ(s.to_string(), std::string("tensor(5)"));
        dist::Tensor e = dist::zeros({0, 3}, dist::kFloat64);
        RANK_REQUIRE_EQ(pg.recv(e, 0, {}, 1), 0);
        RANK_REQUIRE_EQ(e.numel(), 0);
        dist::Tensor f = dist::zeros(std::vector<std::int64_t>{}, dist::kFloat32);
        RANK_REQUIRE_EQ(pg.recv(f, 0, {}, 2), 0);
        RANK_REQUIRE_EQ(f.to_string(), std::string("tensor(2.5000)"));
      }
    }, job_options(mode));
  }
}

// Sizes from 0 bytes to 64 MiB (8 MiB in sanitizer builds) through a 64 KiB ring,
// both directions, each payload verified byte by byte; and the smallest legal ring (4 KiB) with
// sizes around its record and chunk boundaries.
BOOST_AUTO_TEST_CASE(sizes_from_zero_to_64_mib_through_small_rings) {
  struct Case {
    std::uint64_t ring;
    std::vector<std::size_t> sizes;
  };
  const std::vector<Case> cases = {
      {64 << 10,
       {0, 1, 7, 8, 63, 64, 65, 4095, 4096, 4097, 8191, 65535, 65536, 65537, (1u << 20) - 1,
        (1u << 20) + 3, std::size_t(big_payload(16 << 20, 4 << 20)),
        std::size_t(big_payload(64 << 20, 8 << 20))}},
      {4 << 10, {0, 1, 15, 16, 17, 447, 448, 449, 511, 512, 513, 4095, 4096, 4097, 100000,
                 (1u << 20) + 5}},
  };
  for (auto mode : all_modes()) {
    for (const Case& c : cases) {
      BOOST_TEST_CONTEXT("mode " << mode_name(mode) << ", ring " << c.ring) {
        expect_job_ok(2, [&c](dist::ProcessGroup& pg) {
          const int me = pg.get_rank();
          const int peer = 1 - me;
          for (std::size_t i = 0; i < c.sizes.size(); ++i) {
            const std::size_t n = c.sizes[i];
            const std::string what = "size " + std::to_string(n);
            dist::Tensor out = dist::empty({static_cast<std::int64_t>(n)}, dist::kUInt8);
            fill_pattern(out, 1000 * i + me);
            dist::Tensor in = dist::zeros({static_cast<std::int64_t>(n)}, dist::kUInt8);
            if (me == 0) {
              pg.send(out, peer, {}, 3);
              RANK_REQUIRE_EQ(pg.recv(in, peer, {}, 3), peer);
            } else {
              RANK_REQUIRE_EQ(pg.recv(in, peer, {}, 3), peer);
              pg.send(out, peer, {}, 3);
            }
            require_pattern(in, 1000 * i + peer, what);
          }
        }, job_options(mode, c.ring));
      }
    }
  }
}

// The seed's example 3 with the free functions: an int64 [7, 8, 9] received into a float32
// tensor on a sub-group prints tensor([7., 8., 9.]); float to int truncates toward zero.
BOOST_AUTO_TEST_CASE(seed_example_3_converts_on_receive) {
  for (auto mode : all_modes()) {
    expect_job_ok(3, [](dist::ProcessGroup&) {
      const int rank = dist::get_rank();
      dist::Group sub = dist::new_group({0, 1});
      if (rank == 0) {
        dist::send(dist::tensor({7, 8, 9}), 1, sub);
        dist::send(dist::tensor({1.9f, -1.9f, 2.5f, -0.5f, 1e9f}), 1, sub, 1);
        dist::send(dist::tensor({300, -1, 255, 256}), 1, sub, 2);
        dist::send(dist::tensor({0.0, 0.5, -2.0, std::nan("")}, dist::kFloat64), 1, sub, 3);
      } else if (rank == 1) {
        dist::Tensor res = dist::zeros(3);
        RANK_REQUIRE_EQ(dist::recv(res, 0, sub), 0);
        RANK_REQUIRE_EQ(res.dtype(), dist::kFloat32);
        RANK_REQUIRE_EQ(res.to_string(), std::string("tensor([7., 8., 9.])"));

        dist::Tensor ints = dist::zeros(5, dist::kInt32);
        RANK_REQUIRE_EQ(dist::recv(ints, 0, sub, 1), 0);
        const std::int32_t* v = ints.data<std::int32_t>();
        RANK_REQUIRE_EQ(v[0], 1);
        RANK_REQUIRE_EQ(v[1], -1);
        RANK_REQUIRE_EQ(v[2], 2);
        RANK_REQUIRE_EQ(v[3], 0);
        RANK_REQUIRE_EQ(v[4], 1000000000);

        dist::Tensor bytes = dist::zeros(4, dist::kUInt8);
        RANK_REQUIRE_EQ(dist::recv(bytes, 0, sub, 2), 0);
        RANK_REQUIRE_EQ(bytes.to_string(),
                        std::string("tensor([ 44, 255, 255,   0], dtype=torch.uint8)"));

        dist::Tensor flags = dist::zeros(4, dist::kBool);
        RANK_REQUIRE_EQ(dist::recv(flags, 0, sub, 3), 0);
        RANK_REQUIRE_EQ(flags.to_string(), std::string("tensor([False,  True,  True,  True])"));
      } else {
        RANK_REQUIRE_EQ(dist::get_rank(sub), -1);
      }
    }, job_options(mode));
  }
}

// All 100 (sent dtype, receive dtype) pairs: the received values are exactly what the local
// conversion (Tensor::to, i.e. torch's copy_) gives for the same values.
BOOST_AUTO_TEST_CASE(every_dtype_pair_converts_like_copy) {
  for (auto mode : all_modes()) {
    expect_job_ok(2, [](dist::ProcessGroup& pg) {
      for (int from = 0; from < dist::kNumDTypes; ++from) {
        for (int to = 0; to < dist::kNumDTypes; ++to) {
          const int tag = from * dist::kNumDTypes + to;
          const dist::Tensor src = conversion_source(kAllDTypes[from]);
          if (pg.get_rank() == 0) {
            pg.send(src, 1, {}, tag);
          } else {
            dist::Tensor got = dist::zeros(src.numel(), kAllDTypes[to]);
            RANK_REQUIRE_EQ(pg.recv(got, 0, {}, tag), 0);
            const dist::Tensor want = src.to(kAllDTypes[to]);
            if (!got.equal(want))
              throw std::runtime_error(std::string(dist::dtype_name(kAllDTypes[from])) + " -> " +
                                       std::string(dist::dtype_name(kAllDTypes[to])) + ": got " +
                                       got.to_string() + ", expected " + want.to_string());
          }
        }
      }
    }, job_options(mode));
  }
}

// A large converted message (1 Mi int32 values into float64 through a 64 KiB ring) on the
// three routes a message can take to a receive:
//   posted    - the receive is posted before the message starts arriving;
//   complete  - the whole message waited as unexpected before the receive was posted;
//   streaming - the message had started to arrive (unexpected) when the receive was posted,
//               so the receive takes it over mid-stream.
// Each route also with the same dtype (no conversion). The streaming route exists only on the
// ring path (a single-copy offer is taken in whole), so single copy is off here; its routes
// (posted, unexpected) are tested in test_single_copy.cpp.
BOOST_AUTO_TEST_CASE(large_messages_convert_on_every_route) {
  constexpr std::int64_t kCount = 1 << 20;
  ScopedEnv ring_only("SHMDIST_SINGLE_COPY", "off");
  for (auto mode : all_modes()) {
    SharedCounters step(1);
    expect_job_ok(2, [&step](dist::ProcessGroup& pg) {
      dist::Tensor src = dist::empty({kCount}, dist::kInt32);
      std::int32_t* s = src.data<std::int32_t>();
      for (std::int64_t i = 0; i < kCount; ++i)
        s[i] = static_cast<std::int32_t>(pattern_word(7, static_cast<std::uint64_t>(i)));
      const dist::Tensor want_f64 = src.to(dist::kFloat64);
      for (const dist::DType into : {dist::kFloat64, dist::kInt32}) {
        const dist::Tensor& want = into == dist::kInt32 ? src : want_f64;
        const std::string dt(dist::dtype_name(into));
        if (pg.get_rank() == 0) {
          // posted: the receiver says when its receive is posted.
          dist::Tensor go = dist::zeros(1);
          pg.recv(go, 1, {}, 9);
          pg.send(src, 1, {}, 1);
          // complete: sent whole before the receiver posts (it waits in the barrier).
          pg.send(src, 1, {}, 2);
          pg.barrier();
          // streaming: start the message, tell the receiver (outside the library), finish it.
          dist::Work w = pg.isend(src, 1, {}, 3);
          step[0].fetch_add(1);
          w.wait();
          pg.send(dist::zeros(1), 1, {}, 4);
          pg.barrier();
        } else {
          dist::Tensor a = dist::zeros({kCount}, into);
          dist::Work posted = pg.irecv(a, 0, {}, 1);
          pg.send(dist::zeros(1), 0, {}, 9);
          posted.wait();
          RANK_REQUIRE(a.equal(want));

          pg.barrier();
          dist::Tensor b = dist::zeros({kCount}, into);
          RANK_REQUIRE_EQ(pg.recv(b, 0, {}, 2), 0);
          RANK_REQUIRE(b.equal(want));

          // Wait until the sender has started tag 3 (its first records are in the ring), then
          // make progress once with an unrelated receive, which takes those records in as an
          // unexpected, still incomplete message; then post the receive for it.
          step.wait_at_least(0, into == dist::kFloat64 ? 1 : 2);
          dist::Tensor unrelated = dist::zeros(1);
          dist::Work other = pg.irecv(unrelated, 0, {}, 4);
          RANK_REQUIRE(!other.is_completed());
          dist::Tensor c = dist::zeros({kCount}, into);
          RANK_REQUIRE_EQ(pg.recv(c, 0, {}, 3), 0);
          if (!c.equal(want)) throw std::runtime_error("streaming route into " + dt + " differs");
          other.wait();
          pg.barrier();
        }
      }
    }, job_options(mode, 64 << 10));
  }
}

BOOST_AUTO_TEST_SUITE_END()
