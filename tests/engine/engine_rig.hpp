// An engine on a FakeTransport, and the small vocabulary the engine tests share.
#pragma once

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <functional>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/background.hpp"
#include "engine/engine.hpp"
#include "fake_transport.hpp"

namespace shmdist::test {

using engine::MatchKey;
using Op = std::shared_ptr<detail::Operation>;

inline MatchKey user_key(int tag, std::uint32_t group = 0, std::uint32_t sig = 0) {
  return {group, sig, tag, transport::kUserChannel};
}

inline std::vector<std::byte> bytes_of(const Tensor& t) {
  std::vector<std::byte> b(t.nbytes());
  if (!b.empty()) std::memcpy(b.data(), t.data_ptr(), b.size());
  return b;
}

// Rank `rank` of a `world`-rank job whose peers the test plays through `wire`.
struct Rig {
  explicit Rig(int rank = 0, int world = 3,
               std::chrono::milliseconds timeout = std::chrono::seconds(30))
      : wire(std::make_shared<FakeWire>(rank, world)) {
    wait::SpinPolicy spin;
    spin.spin_alone = spin.spin_crowded = std::chrono::microseconds(1);
    spin.health_check = std::chrono::milliseconds(1);
    engine = std::make_shared<engine::Engine>(fake_link(wire), spin, timeout);
    for (int r = 0; r < world; ++r) all.push_back(r);
  }

  // The peer `src` sends tensor `t` with `key`; `allow` of its bytes have arrived so far.
  void arrive(int src, const Tensor& t, const MatchKey& key,
              std::uint64_t allow = ~std::uint64_t{0}) {
    transport::Envelope env;
    env.key = key;
    env.dtype = t.dtype();
    env.numel = static_cast<std::uint64_t>(t.numel());
    wire->arrive(src, env, bytes_of(t), allow);
  }

  Op irecv(const Tensor& t, int src, const MatchKey& key) {
    return engine->irecv(t, src, key, all);
  }

  // Makes progress once through an operation that never completes (an internal-channel
  // receive on a tag nobody uses, so finalize does not report it): the engine's entry points
  // only make progress for an operation.
  void progress() {
    if (!pump)
      pump = engine->irecv(zeros(1, kUInt8), pump_src(),
                           MatchKey{0, 0, 1 << 20, transport::kInternalChannel}, all);
    engine->test(*pump);
  }
  int pump_src() const { return wire->world - 1 == wire->rank ? 0 : wire->world - 1; }

  std::shared_ptr<FakeWire> wire;
  std::shared_ptr<engine::Engine> engine;
  std::vector<int> all;
  Op pump;
};

inline std::string error_text(const detail::Operation& op) {
  if (op.status != detail::Operation::Status::Failed) return "<not failed>";
  try {
    std::rethrow_exception(op.error);
  } catch (const std::exception& e) {
    return e.what();
  }
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A collective stand-in: it never finishes; `on_advance` runs on every advance().
class ScriptedTask : public engine::BackgroundTask {
 public:
  std::function<void()> on_advance;
  std::exception_ptr abandoned;
  int advances = 0;
  bool advance() override {
    ++advances;
    if (on_advance) on_advance();
    return false;
  }
  bool finished() const override { return abandoned != nullptr; }
  void abandon(std::exception_ptr error) override { abandoned = std::move(error); }
  void awaited_peers(std::vector<int>&) const override {}
  std::string describe() const override { return "scripted task"; }
};

}  // namespace shmdist::test
