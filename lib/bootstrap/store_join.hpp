// Joining a job through a key-value store that a runtime brings (torch's c10d::Store, for
// the torch.distributed backend; pg/runtime_hooks.hpp builds the group on it).
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "bootstrap/world.hpp"

namespace shmdist::detail {

// A key-value store shared by the ranks of one job (torch's c10d::Store): `set` publishes a
// value, `get` blocks until the key exists (and throws after the store's own timeout).
struct KeyValueStore {
  std::function<void(const std::string& key, const std::string& value)> set;
  std::function<std::string(const std::string& key)> get;
};

// Joins rank `rank` of a job of `world` ranks (pg/runtime_hooks.hpp, join_through_store,
// says how). Throws InvalidArgument for a bad rank, world or timeout.
JoinedWorld join_world_through_store(int rank, int world, std::chrono::milliseconds timeout,
                                     const KeyValueStore& store);

}  // namespace shmdist::detail
