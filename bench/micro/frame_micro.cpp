// The frame code every message passes through: encoding the header on send, checking the
// record and decoding the header (untrusted input) on receive.
#include <benchmark/benchmark.h>

#include "ring_fixture.hpp"

namespace {

using namespace shmdist::ring;
using namespace shmdist::transport;

void BM_EncodeHeader(benchmark::State& state) {
  Envelope env;
  env.key.tag = 3;
  env.dtype = shmdist::DType::Float32;
  env.numel = 1024;
  env.nbytes = 4096;
  for (auto _ : state) {
    benchmark::DoNotOptimize(env);
    MessageHeader h = encode_header(env);
    benchmark::DoNotOptimize(h);
  }
}
BENCHMARK(BM_EncodeHeader);

void BM_DecodeHeader(benchmark::State& state) {
  const MessageHeader raw = micro::header_for(8);
  const std::uint64_t record_length = sizeof(MessageHeader) + 8;
  for (auto _ : state) {
    benchmark::DoNotOptimize(raw);
    Envelope env = decode_header(raw, record_length, 1);
    benchmark::DoNotOptimize(env);
  }
}
BENCHMARK(BM_DecodeHeader);

void BM_CheckRecordStart(benchmark::State& state) {
  const auto kind = static_cast<std::uint16_t>(RecordKind::Start);
  std::uint64_t length = 40;
  for (auto _ : state) {
    benchmark::DoNotOptimize(length);
    check_record(kind, length, std::uint64_t{1} << 20, false, 0, 1);
  }
}
BENCHMARK(BM_CheckRecordStart);

void BM_CheckRecordContinuation(benchmark::State& state) {
  const auto kind = static_cast<std::uint16_t>(RecordKind::Continuation);
  std::uint64_t length = 65536;
  for (auto _ : state) {
    benchmark::DoNotOptimize(length);
    check_record(kind, length, std::uint64_t{1} << 20, true, std::uint64_t{1} << 22, 1);
  }
}
BENCHMARK(BM_CheckRecordContinuation);

}  // namespace
