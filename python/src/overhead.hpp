// C++ loops for bench/torch/overhead.py (see overhead.cpp).
#pragma once

#include <string>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace shmdist::torch_backend {

// `iterations` times `pattern` ("pingpong" between group ranks 0 and 1, "send" or "recv") of
// `tensor` with group rank `peer` on `tag`, or "allreduce" (SUM of `tensor` over the group;
// `peer` and `tag` unused), in C++; returns seconds. path "c10d": through
// c10d::ProcessGroup::send/recv/allreduce and Work::wait (any backend); "shmdist": through
// shmdist's blocking send/recv/all_reduce (backend "shm" only).
double cxx_loop(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const std::string& path,
                const std::string& pattern, at::Tensor tensor, int peer, int iterations, int tag);

// Under callgrind: "zero" zeroes the counts, anything else dumps them under that name.
// Returns false (doing nothing) when not running under valgrind or built without its header.
bool callgrind(const std::string& what);

}  // namespace shmdist::torch_backend
