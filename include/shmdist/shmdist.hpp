// shmdist: torch.distributed-style point-to-point messaging between processes on one host,
// over shared memory. This header brings in the whole public API.
#pragma once

#include <shmdist/distributed.hpp>
#include <shmdist/errors.hpp>
#include <shmdist/launch.hpp>
#include <shmdist/process_group.hpp>
#include <shmdist/tensor.hpp>
#include <shmdist/version.hpp>
