// The vector reduction kernels (lib/coll/reduce_simd.hpp) against the scalar path, bit for
// bit: every target Highway compiled that this CPU runs (the best one and the portable
// fallback at least), every dtype and op where the op is defined, 1 to 5 inputs, lengths around every
// vector width, unaligned starts, `out` apart from or equal to an input, and data full of
// NaNs (both signs, quiet and signalling, assorted payloads), infinities, subnormals, -0.0,
// values at rounding ties and random bit patterns. And a reduction fed piece by piece as a
// message streams in, against the whole one.
#define BOOST_TEST_MODULE shmdist reduction kernels
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "coll/reduce.hpp"
#include "coll/reduce_simd.hpp"
#include "coll/streaming_reduce.hpp"

namespace {

using shmdist::DType;
using shmdist::ReduceOp;
using shmdist::element_size;
namespace simd = shmdist::coll::simd;
const DType kAllDTypes[] = {DType::Bool,    DType::UInt8,    DType::Int8,    DType::Int16,
                            DType::Int32,   DType::Int64,    DType::Float16, DType::BFloat16,
                            DType::Float32, DType::Float64};
const ReduceOp kAllOps[] = {ReduceOp::SUM, ReduceOp::AVG,  ReduceOp::PRODUCT, ReduceOp::MIN,
                            ReduceOp::MAX, ReduceOp::BAND, ReduceOp::BOR,     ReduceOp::BXOR};

template <class U>
U bits_from(double v, DType d) {
  if (d == DType::Float64) {
    std::uint64_t u;
    std::memcpy(&u, &v, 8);
    return static_cast<U>(u);
  }
  const auto f = static_cast<float>(v);
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if (d == DType::Float32) return static_cast<U>(u);
  if (d == DType::BFloat16) return static_cast<U>(u >> 16);
  return static_cast<U>(shmdist::half_from_float(f).bits);
}

// One element's bytes: a special value, a random bit pattern, or an ordinary number.
void random_element(std::mt19937_64& rng, DType d, std::byte* at) {
  const std::size_t es = element_size(d);
  std::uint64_t pick = rng() % 8, u = rng();
  const bool floating = d == DType::Float16 || d == DType::BFloat16 || d == DType::Float32 ||
                        d == DType::Float64;
  if (floating && pick < 3) {
    // Specials, as bit patterns of the dtype: NaNs (quiet, signalling, payloads, signs),
    // infinities, zeros, the smallest and largest subnormals, the largest finite value.
    static const std::uint64_t h[] = {0x7e00, 0xfe00, 0x7c01, 0xfd55, 0x7fff, 0x7c00, 0xfc00,
                                      0x0000, 0x8000, 0x0001, 0x83ff, 0x7bff, 0x0400, 0x3c00};
    static const std::uint64_t b[] = {0x7fc0, 0xffc0, 0x7f81, 0xff99, 0x7fff, 0x7f80, 0xff80,
                                      0x0000, 0x8000, 0x0001, 0x807f, 0x7f7f, 0x0080, 0x3f80};
    static const std::uint64_t f[] = {0x7fc00000, 0xffc00000, 0x7f800001, 0xff812345,
                                      0x7fffffff, 0x7f800000, 0xff800000, 0x00000000,
                                      0x80000000, 0x00000001, 0x807fffff, 0x7f7fffff,
                                      0x00800000, 0x3f800000, 0x477ff000, 0x33000001,
                                      0x38800000, 0x3f808000, 0x3f818000, 0x387fe000};
    static const std::uint64_t g[] = {0x7ff8000000000000, 0xfff8000000000000, 0x7ff0000000000001,
                                      0xfff4000000000123, 0x7ff0000000000000, 0xfff0000000000000,
                                      0x0000000000000000, 0x8000000000000000, 0x0000000000000001,
                                      0x800fffffffffffff, 0x7fefffffffffffff};
    std::uint64_t v = 0;
    if (d == DType::Float16) v = h[u % std::size(h)];
    if (d == DType::BFloat16) v = b[u % std::size(b)];
    if (d == DType::Float32) v = f[u % std::size(f)];
    if (d == DType::Float64) v = g[u % std::size(g)];
    std::memcpy(at, &v, es);  // little-endian: the low bytes are the element
  } else if (!floating || pick < 5) {
    std::memcpy(at, &u, es);  // any bit pattern
    if (d == DType::Bool) *at = static_cast<std::byte>(u % 2);
  } else {
    // Ordinary numbers, some small enough to go subnormal in sums and products, some whose
    // sum falls on a rounding tie of the half types.
    std::uniform_real_distribution<double> mag(-8, 8);
    double v = std::ldexp(mag(rng), static_cast<int>(rng() % 40) - 20);
    if (pick == 7) v = std::ldexp(1.0 + static_cast<double>(rng() % 4) / 256, -14 - static_cast<int>(rng() % 12));
    const std::uint64_t bits = bits_from<std::uint64_t>(v, d);
    std::memcpy(at, &bits, es);
  }
}

std::string hex(const std::byte* p, std::size_t n) {
  std::ostringstream s;
  s << "0x" << std::hex;
  for (std::size_t i = n; i-- > 0;) s << (std::to_integer<unsigned>(p[i]) >> 4) << (std::to_integer<unsigned>(p[i]) & 15);
  return s.str();
}

// Reduces fresh random inputs with reduce_in_order (the kernels of the pinned target) and
// with the scalar path, and requires the same bytes.
void compare_once(std::mt19937_64& rng, const std::string& target, DType d, ReduceOp op,
                  int n, std::size_t count, std::size_t skew, int alias) {
  const std::size_t es = element_size(d), bytes = count * es;
  // Each input in its own buffer, starting `skew` bytes past a 64-byte boundary.
  std::vector<std::vector<std::byte>> buffers(static_cast<std::size_t>(n),
                                              std::vector<std::byte>(bytes + 128));
  std::vector<std::byte*> starts;
  for (auto& b : buffers) {
    auto* p = b.data() + (64 - reinterpret_cast<std::uintptr_t>(b.data()) % 64) % 64 + skew;
    for (std::size_t i = 0; i < count; ++i) random_element(rng, d, p + i * es);
    starts.push_back(p);
  }
  std::vector<std::byte> expected(bytes + 1), scratch(bytes + 128);
  std::vector<const std::byte*> inputs(starts.begin(), starts.end());
  shmdist::coll::reduce_in_order_scalar(op, d, inputs, expected.data(), count, n);
  // alias 0: out apart from the inputs; 1: out is the first input; 2: out is the last.
  std::byte* out = scratch.data() + skew;
  if (alias == 1) out = starts.front();
  if (alias == 2) out = starts.back();
  std::vector<std::vector<std::byte>> before;
  for (auto* p : starts) before.emplace_back(p, p + bytes);
  shmdist::coll::reduce_in_order(op, d, inputs, out, count, n);
  if (std::memcmp(out, expected.data(), bytes) == 0) return;
  for (std::size_t i = 0; i < count; ++i) {
    if (std::memcmp(out + i * es, expected.data() + i * es, es) == 0) continue;
    std::ostringstream why;
    why << "target " << target << ", " << shmdist::dtype_name(d) << " "
        << shmdist::coll::reduce_op_name(op) << ", " << n << " inputs, " << count
        << " elements, skew " << skew << ", alias " << alias << ": element " << i
        << " is " << hex(out + i * es, es) << ", the scalar path gives "
        << hex(expected.data() + i * es, es) << "; inputs";
    for (const auto& b : before) why << " " << hex(b.data() + i * es, es);
    BOOST_FAIL(why.str());
  }
}

void compare_every_target(std::uint64_t seed, const std::size_t* lengths, std::size_t n_lengths,
                          bool min_max = true) {
  std::vector<simd::Target> targets = simd::targets();
  if (targets.empty()) targets.push_back({"none (scalar only)", 0});
  std::mt19937_64 rng(seed);
  struct Unpin {  // back to the best target, also when a comparison fails
    ~Unpin() { simd::pin_target(0); }
  } unpin;
  for (const simd::Target& t : targets) {
    BOOST_TEST_MESSAGE("comparing target " << t.name);
    simd::pin_target(t.id);
    if (t.id != 0) BOOST_REQUIRE_EQUAL(simd::target_name(), t.name);
    for (const DType d : kAllDTypes) {
      for (const ReduceOp op : kAllOps) {
        if (shmdist::coll::unsupported(op, d)) continue;
        if (!min_max && (op == ReduceOp::MIN || op == ReduceOp::MAX)) continue;
        for (const int n : {1, 2, 3, 5})
          for (std::size_t l = 0; l < n_lengths; ++l)
            for (const std::size_t skew : {std::size_t{0}, element_size(d), std::size_t{1}})
              for (const int alias : {0, 1, 2})
                compare_once(rng, t.name, d, op, n, lengths[l], skew, alias);
      }
    }
  }
}


}  // namespace

BOOST_AUTO_TEST_CASE(the_best_target_and_the_portable_one_are_compared) {
  const auto targets = simd::targets();
  BOOST_TEST_MESSAGE("kernels run on " << simd::target_name());
  if (simd::target_name() == "none") {
    BOOST_TEST(targets.empty());
    BOOST_TEST(!simd::has_kernel(ReduceOp::SUM, DType::BFloat16));
    return;  // built without Highway: the scalar path is all there is
  }
  BOOST_REQUIRE(!targets.empty());
  BOOST_TEST(targets.front().name == simd::target_name());
  // The portable fallback: EMU128, or SCALAR (one lane) where Highway finds EMU128 broken.
  BOOST_TEST((targets.back().name == "EMU128" || targets.back().name == "SCALAR"));
  for (const DType d : {DType::Float16, DType::BFloat16, DType::Float32, DType::Float64})
    for (const ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::PRODUCT, ReduceOp::MIN,
                              ReduceOp::MAX})
      BOOST_TEST(simd::has_kernel(op, d));
  BOOST_TEST(!simd::has_kernel(ReduceOp::SUM, DType::Int32));
}

BOOST_AUTO_TEST_CASE(every_target_gives_the_scalar_paths_bits_for_every_dtype_and_op) {
  const std::size_t lengths[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127,
                                 129, 1000, 4099};
  compare_every_target(20261204, lengths, std::size(lengths));
}

// torch.set_flush_denormal(True) sets MXCSR's flush-to-zero and denormals-are-zero bits. The
// scalar path's and the kernels' float arithmetic then flush alike (the same instructions),
// and the conversions must not flush at all (the scalar path's are integer code, the
// kernels' F16C ones ignore MXCSR). MIN/MAX are left out: whether they flush a subnormal
// depends on whether the compiler picked minps/maxps (which do) or a compare and select
// (which does not), in the scalar path as in any C++ code, so there is no one answer.
BOOST_AUTO_TEST_CASE(with_denormals_flushed_too) {
#if defined(__x86_64__) || defined(__i386__)
  struct FlushDenormals {
    unsigned saved = _mm_getcsr();
    FlushDenormals() { _mm_setcsr(saved | 0x8040u); }  // FTZ (bit 15) and DAZ (bit 6)
    ~FlushDenormals() { _mm_setcsr(saved); }
    FlushDenormals(const FlushDenormals&) = delete;
    FlushDenormals& operator=(const FlushDenormals&) = delete;
  } flush;
  const std::size_t lengths[] = {1, 7, 16, 17, 33, 65, 1000};
  compare_every_target(7, lengths, std::size(lengths), /*min_max=*/false);
#else
  BOOST_TEST_MESSAGE("flush-to-zero is only exercised on x86 here");
#endif
}

// A reduction fed as a message streams in (coll/streaming_reduce.hpp) gives reduce_in_order's
// bits for the whole inputs, in either order: every dtype and op, the message handed over in
// random pieces, small (1 to 37 bytes, so elements split between pieces) or large (up to 8
// KiB, the vector kernels' size), and bytes past the message's elements ignored rather than
// written out of bounds (ASan's build checks that).
BOOST_AUTO_TEST_CASE(a_streamed_reduction_gives_the_whole_reductions_bits) {
  std::mt19937_64 rng(20261206);
  for (const DType d : kAllDTypes) {
    for (const ReduceOp op : kAllOps) {
      if (shmdist::coll::unsupported(op, d)) continue;
      for (const bool theirs_first : {true, false}) {
        BOOST_TEST_CONTEXT(shmdist::dtype_name(d) << ' ' << shmdist::coll::reduce_op_name(op)
                                                 << (theirs_first ? " theirs first" : " mine first")) {
          const std::size_t count = 1 + rng() % 6000, es = element_size(d);
          std::vector<std::byte> theirs((count + 2) * es), mine(count * es);
          for (std::size_t i = 0; i < count + 2; ++i) random_element(rng, d, theirs.data() + i * es);
          for (std::size_t i = 0; i < count; ++i) random_element(rng, d, mine.data() + i * es);
          std::vector<std::byte> expected(count * es);
          const std::byte* inputs[2] = {theirs.data(), mine.data()};
          if (!theirs_first) std::swap(inputs[0], inputs[1]);
          shmdist::coll::reduce_in_order(op, d, inputs, expected.data(), count, 3);

          shmdist::Tensor out = shmdist::empty({static_cast<std::int64_t>(count)}, d);
          auto* out_bytes = static_cast<std::byte*>(out.data_ptr());
          std::memcpy(out_bytes, mine.data(), mine.size());
          shmdist::coll::StreamingReduce stream(out, out_bytes, count, d, op, 3, theirs_first);
          for (std::size_t at = 0; at < theirs.size();) {
            const std::size_t most = rng() % 2 ? 37 : 8192;
            const std::size_t piece = std::min<std::size_t>(1 + rng() % most, theirs.size() - at);
            stream.consume(at, {theirs.data() + at, piece});
            at += piece;
          }
          BOOST_TEST(std::memcmp(out_bytes, expected.data(), expected.size()) == 0);
        }
      }
    }
  }
}
