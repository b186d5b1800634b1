// shmdist-reduce-micro: the reduction kernels alone, per byte, float32 against bfloat16 and
// float16: the scalar path (coll::reduce_in_order_scalar) and every vector target this CPU
// runs (coll/reduce_simd.hpp), SUM of two inputs into a third buffer, as a two-member
// all_reduce does on the lane. Times are the thread's CPU time (time descheduled on a busy
// machine does not count); rounds interleave every configuration and the figure is the median
// over rounds. Only the ratios within one run mean much.
//
//   shmdist-reduce-micro [--rounds N] [--op sum|avg|product|min|max]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <shmdist/shmdist.hpp>

#include "coll/reduce.hpp"
#include "coll/reduce_simd.hpp"

namespace {

using shmdist::DType;
using shmdist::ReduceOp;
namespace simd = shmdist::coll::simd;

// This thread's CPU time: on a machine shared with other work, time spent descheduled does
// not count (what other work does to the caches still does).
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Path {
  std::string name;
  std::int64_t target;  // -1: the scalar path
};

double seconds_per_call(const Path& p, ReduceOp op, DType d, std::vector<std::byte>& a,
                        std::vector<std::byte>& b, std::vector<std::byte>& out) {
  const std::size_t count = a.size() / shmdist::element_size(d);
  const std::byte* inputs[] = {a.data(), b.data()};
  // Enough calls for about 64 MiB of input per measurement.
  const int calls = static_cast<int>(std::max<std::size_t>(1, (64u << 20) / a.size()));
  if (p.target >= 0) simd::pin_target(p.target);
  auto run = [&] {
    if (p.target < 0)
      shmdist::coll::reduce_in_order_scalar(op, d, inputs, out.data(), count, 2);
    else
      shmdist::coll::reduce_in_order(op, d, inputs, out.data(), count, 2);
  };
  run();  // warm the caches and the dispatch
  const double t0 = thread_seconds();
  for (int i = 0; i < calls; ++i) run();
  const double t1 = thread_seconds();
  if (p.target >= 0) simd::pin_target(0);
  return (t1 - t0) / calls;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7;
  ReduceOp op = ReduceOp::SUM;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--op" && i + 1 < argc) {
      const std::map<std::string, ReduceOp> ops{{"sum", ReduceOp::SUM}, {"avg", ReduceOp::AVG},
                                                {"product", ReduceOp::PRODUCT},
                                                {"min", ReduceOp::MIN}, {"max", ReduceOp::MAX}};
      const auto it = ops.find(argv[++i]);
      if (it == ops.end()) {
        std::fprintf(stderr, "shmdist-reduce-micro: --op takes sum, avg, product, min or max\n");
        return 2;
      }
      op = it->second;
    } else {
      std::fprintf(stderr, "usage: shmdist-reduce-micro [--rounds N] [--op sum|avg|product|min|max]\n");
      return 2;
    }
  }
  std::vector<Path> paths{{"scalar", -1}};
  for (const simd::Target& t : simd::targets()) paths.push_back({t.name, t.id});
  const DType dtypes[] = {DType::Float32, DType::BFloat16, DType::Float16};
  const std::size_t sizes[] = {256u << 10, 1u << 20, 16u << 20};

  std::mt19937 rng(1);
  std::uniform_real_distribution<float> value(-1, 1);
  // Results per (size, path, dtype): seconds per call, over rounds.
  std::map<std::tuple<std::size_t, std::size_t, int>, std::vector<double>> times;
  for (const std::size_t bytes : sizes) {
    std::vector<std::byte> a(bytes), b(bytes), out(bytes);
    for (const DType d : dtypes) {
      // Ordinary values of each dtype (no NaN, no subnormals).
      const std::size_t count = bytes / shmdist::element_size(d);
      for (std::size_t i = 0; i < count; ++i) {
        const float x = value(rng), y = value(rng);
        if (d == DType::Float32) {
          std::memcpy(a.data() + 4 * i, &x, 4);
          std::memcpy(b.data() + 4 * i, &y, 4);
        } else {
          const std::uint16_t hx = d == DType::BFloat16 ? shmdist::bfloat16_from_float(x).bits
                                                        : shmdist::half_from_float(x).bits;
          const std::uint16_t hy = d == DType::BFloat16 ? shmdist::bfloat16_from_float(y).bits
                                                        : shmdist::half_from_float(y).bits;
          std::memcpy(a.data() + 2 * i, &hx, 2);
          std::memcpy(b.data() + 2 * i, &hy, 2);
        }
      }
      for (int r = 0; r < rounds; ++r)
        for (std::size_t p = 0; p < paths.size(); ++p)
          times[{bytes, p, static_cast<int>(d)}].push_back(
              seconds_per_call(paths[p], op, d, a, b, out));
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("# shmdist-reduce-micro: %s of 2 inputs into a third buffer; kernels run on %s;"
              " thread CPU time, median of %d rounds\n", shmdist::coll::reduce_op_name(op),
              simd::target_name().c_str(), rounds);
  std::printf("# GB/s = bytes of one input per second (10^9 B); x f32 = time per byte over "
              "float32's on the same path\n");
  std::printf("%-10s %-8s %12s %12s %12s %9s %9s\n", "size", "path", "f32 GB/s", "bf16 GB/s",
              "f16 GB/s", "bf16 x f32", "f16 x f32");
  for (const std::size_t bytes : sizes) {
    for (std::size_t p = 0; p < paths.size(); ++p) {
      const double f32 = median(times[{bytes, p, static_cast<int>(DType::Float32)}]);
      const double bf16 = median(times[{bytes, p, static_cast<int>(DType::BFloat16)}]);
      const double f16 = median(times[{bytes, p, static_cast<int>(DType::Float16)}]);
      const std::string size = bytes >= (1u << 20) ? std::to_string(bytes >> 20) + " MiB"
                                                   : std::to_string(bytes >> 10) + " KiB";
      std::printf("%-10s %-8s %12.2f %12.2f %12.2f %9.2f %9.2f\n", size.c_str(),
                  paths[p].name.c_str(), bytes / f32 / 1e9, bytes / bf16 / 1e9,
                  bytes / f16 / 1e9, bf16 / f32, f16 / f32);
    }
  }
  return 0;
}
