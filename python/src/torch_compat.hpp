// The one place where torch 1.13 and torch 2.x differ for this backend. CMake passes
// SHMDIST_TORCH_MAJOR and SHMDIST_TORCH_MINOR from the torch it builds against.
//
// torch 1.13: a backend is a c10d::ProcessGroup; the creator returns it and torch uses it as
//   the group itself.
// torch 2.x: a backend is a c10d::Backend; torch wraps it in a c10d::ProcessGroup of its own
//   (registered for device "cpu"), which Python code and cxx_loop see.
// The virtual functions a backend overrides (send, recv, allreduce, ...) have the same
// signatures in both, as do c10d::Work, the option structs and ReduceOp's numbering.
#pragma once

#ifndef SHMDIST_TORCH_MAJOR
#error "SHMDIST_TORCH_MAJOR is set by python/CMakeLists.txt from the torch found"
#endif

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#if SHMDIST_TORCH_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

namespace shmdist::torch_backend {

#if SHMDIST_TORCH_MAJOR >= 2
using BackendBase = c10d::Backend;
inline constexpr bool kBackendIsGroup = false;
#else
using BackendBase = c10d::ProcessGroup;
inline constexpr bool kBackendIsGroup = true;
#endif

// The backend behind a torch group as Python hands it over (dist.group.WORLD, new_group's
// result): the group itself on 1.13, its CPU backend on 2.x. Null if it has none.
inline c10::intrusive_ptr<BackendBase> cpu_backend_of(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
#if SHMDIST_TORCH_MAJOR >= 2
  if (!group || !group->hasBackends()) return {};
  return group->getBackend(c10::DeviceType::CPU);
#else
  return group;
#endif
}

}  // namespace shmdist::torch_backend
