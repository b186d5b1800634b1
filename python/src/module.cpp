// shmdist._C: the creator function torch.distributed calls for backend "shm" (registered by
// shmdist/torch.py), and shmdist's exceptions as Python exceptions (subclasses of
// RuntimeError, which is what torch's code and its users catch).

#include <mutex>

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>

#include <shmdist/errors.hpp>
#include <shmdist/version.hpp>

#include "null_group.hpp"
#include "overhead.hpp"
#include <shmdist/embedding.hpp>
#include "backend.hpp"
#include "tensor_bridge.hpp"

namespace py = pybind11;

namespace shmdist::torch_backend {
namespace {

// The job of this process's torch world on "shm", which new_group sub-groups map onto.
// Read and written with the GIL released (creating a group, torch's store-based barrier):
// g_world_job_mutex orders those accesses, so a reader sees a whole weak_ptr.
std::weak_ptr<Job> g_world_job;
std::mutex g_world_job_mutex;

std::shared_ptr<Job> world_job() {
  std::lock_guard lock(g_world_job_mutex);
  return g_world_job.lock();
}

// Group ids for sub-groups: torch names groups "1", "2", ... in creation order, the same on
// every rank (non-members count too), so the name gives an id all members agree on, counted
// from where shmdist leaves ids to runtimes.
constexpr std::uint32_t kIdBase = embedding::kFirstRuntimeGroupId;  // bit 29
constexpr std::uint32_t kIdMask = kIdBase - 1;

std::uint32_t group_id_from_name(const std::string& name) {
  const bool numeric = !name.empty() && name.size() < 10 &&
                       name.find_first_not_of("0123456789") == std::string::npos;
  std::uint32_t n = 0;
  if (numeric) {
    n = static_cast<std::uint32_t>(std::stoul(name));
  } else {
    std::uint32_t h = 2166136261u;  // FNV-1a: names chosen by the user
    for (unsigned char c : name) h = (h ^ c) * 16777619u;
    n = h;
  }
  return kIdBase | (n & kIdMask);
}

embedding::KeyValueStore key_value_store(const c10::intrusive_ptr<c10d::Store>& store) {
  embedding::KeyValueStore kv;
  kv.set = [store](const std::string& key, const std::string& value) {
    store->set(key, std::vector<std::uint8_t>(value.begin(), value.end()));
  };
  kv.get = [store](const std::string& key) {
    const std::vector<std::uint8_t> bytes = store->get(key);
    return std::string(bytes.begin(), bytes.end());
  };
  return kv;
}

std::vector<int> iota(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}

// A torch group that is a whole shmdist job: the default group, or a sub-group created
// while the default group is not on "shm" (it then gets a segment of its own). `rank_names`:
// for one host's ranks of a group across hosts (shmdist/_hosts/), the global rank of each,
// which the job's errors name (empty: the ranks are named as numbered); `machine_ranks`: for
// such a host, the group's ranks on this machine (embedding::join_through_store).
c10::intrusive_ptr<BackendBase> create_job(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank, int size,
                                                  std::chrono::milliseconds timeout,
                                                  bool is_world,
                                                  const std::vector<int>& rank_names,
                                                  int machine_ranks) {
  auto job = std::make_shared<Job>(
      embedding::join_through_store(rank, size, timeout, key_value_store(store), rank_names,
                                    machine_ranks));
  std::vector<int> members = iota(size);
  if (is_world) {
    std::lock_guard lock(g_world_job_mutex);
    g_world_job = job;
  }
  return c10::make_intrusive<ProcessGroupShm>(job, store, rank, std::move(members), Group{},
                                              timeout, /*owns_job=*/true);
}

c10::intrusive_ptr<BackendBase> create_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, const std::string& group_name,
    const std::vector<std::int64_t>& global_ranks_in_group, const std::vector<int>& rank_names,
    int machine_ranks) {
  if (global_ranks_in_group.empty())
    return create_job(store, rank, size, timeout, true, rank_names, machine_ranks);
  TORCH_CHECK(static_cast<int>(global_ranks_in_group.size()) == size && rank >= 0 && rank < size,
              "shm backend: group rank ", rank, " of ", size, " ranks but ",
              global_ranks_in_group.size(), " global ranks were given");
  std::shared_ptr<Job> world = world_job();
  if (!world || !world->pg.is_initialized())
    return create_job(store, rank, size, timeout, false, rank_names, machine_ranks);
  std::vector<int> members(global_ranks_in_group.begin(), global_ranks_in_group.end());
  std::lock_guard lock(world->mutex);  // not while the job is being destroyed
  TORCH_CHECK(world->pg.get_rank() == members[static_cast<std::size_t>(rank)],
              "shm backend: this process is global rank ", world->pg.get_rank(),
              " but torch made it rank ", rank, " of a group of global ranks that puts global "
              "rank ", members[static_cast<std::size_t>(rank)], " there");
  const std::uint32_t id = group_id_from_name(group_name);
  Group group = embedding::group_with_id(world->pg, members, id);
  return c10::make_intrusive<ProcessGroupShm>(world, store, rank, std::move(members),
                                              std::move(group), timeout,
                                              /*owns_job=*/false);
}

// torch's store-based barrier (shmdist/torch.py) calls this at every poll of the store: a
// rank of the world job that ended abnormally raises PeerFailure naming it. While the job is
// being destroyed (its mutex held) destroy checks the peers itself; then (and when there is
// no world job on "shm") there is nothing to do here.
// Returns whether this process has a world job on "shm" (false: nothing to watch).
bool check_world_peers(const std::string& waiting_for) {
  std::shared_ptr<Job> world = world_job();
  if (!world) return false;
  std::unique_lock lock(world->mutex, std::try_to_lock);
  if (!lock.owns_lock()) return true;  // a call on the job is under way and checks itself
  if (!world->pg.is_initialized()) return false;
  embedding::check_peers(world->pg, waiting_for);
  return true;
}

// This process's global rank, as torch.distributed says (for refusals made here).
int global_rank_from_python() {
  return py::cast<int>(py::module_::import("torch.distributed").attr("get_rank")());
}

// A reduction as Python passes it. dist.ReduceOp.SUM and its like are ReduceOp.RedOpType
// values, which pybind would turn into a ReduceOp through a temporary Python object (about
// 0.35 us a call, measured on torch 2.13): read directly, without conversion; a ReduceOp
// object is taken as it is.
c10d::ReduceOp reduce_op_of(const py::handle& op) {
  py::detail::make_caster<c10d::ReduceOp::RedOpType> type;
  if (type.load(op, /*convert=*/false))
    return c10d::ReduceOp(py::detail::cast_op<c10d::ReduceOp::RedOpType>(type));
  try {
    return op.cast<c10d::ReduceOp>();
  } catch (const py::cast_error&) {
    throw InvalidArgument(c10::str(
        "shmdist.torch.inference_all_reduce on rank ", global_rank_from_python(),
        ": expected a torch.distributed.ReduceOp (dist.ReduceOp.SUM, ...), found ",
        py::cast<std::string>(py::repr(op))));
  }
}

// shmdist.torch.inference_all_reduce (shmdist/torch.py resolves group=None to the default
// group): the group's ProcessGroupShm, then its all_reduce_in_place with the GIL released.
// Everything but the wait runs with the GIL held; the refusals of the group itself too
// (they ask Python for this process's global rank).
void inference_all_reduce(const py::object& group, const at::Tensor& tensor,
                          const py::handle& op_object) {
  const c10d::ReduceOp op = reduce_op_of(op_object);
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  try {
    pg = group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
  } catch (const py::cast_error&) {
    const py::object dist = py::module_::import("torch.distributed");
    // A rank outside the group: nothing to do, as dist.all_reduce does.
    if (group.is(dist.attr("GroupMember").attr("NON_GROUP_MEMBER"))) return;
    throw InvalidArgument(c10::str(
        "shmdist.torch.inference_all_reduce on rank ", global_rank_from_python(),
        ": expected a torch.distributed process group of backend 'shm' (or None: the "
        "default group), found ", py::cast<std::string>(py::repr(group))));
  }
  c10::intrusive_ptr<BackendBase> backend;
  try {
    backend = cpu_backend_of(pg);
  } catch (const c10::Error&) {  // torch 2.x: a group with no CPU backend
  }
  auto* shm = dynamic_cast<ProcessGroupShm*>(backend.get());
  if (shm == nullptr) {
    throw InvalidArgument(c10::str(
        "shmdist.torch.inference_all_reduce on rank ", global_rank_from_python(),
        ": expected a group of backend 'shm' on one host, found a group of backend '",
        pg->getBackendName(), "'", backend ? "" : " with no CPU backend",
        "; use dist.all_reduce on it (also for 'shm' groups across hosts, and under "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL, which wraps every backend)"));
  }
  py::gil_scoped_release release;  // while the collective waits for the other members
  shm->all_reduce_in_place(tensor, op);
}

}  // namespace
}  // namespace shmdist::torch_backend

PYBIND11_MODULE(_C, m) {
  using namespace shmdist;
  m.doc() = "shmdist's torch.distributed backend 'shm' (import shmdist.torch to register it)";
  py::module_::import("torch.distributed");  // c10d's Python types, which ours derive from

  // The base first: pybind11 tries the newest translator first, so the subclasses win.
  auto& error = py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<InvalidArgument>(m, "InvalidArgument", error.ptr());
  py::register_exception<Timeout>(m, "Timeout", error.ptr());
  py::register_exception<PeerFailure>(m, "PeerFailure", error.ptr());
  py::register_exception<SetupError>(m, "SetupError", error.ptr());
  py::register_exception<NotInitialized>(m, "NotInitialized", error.ptr());

  py::class_<torch_backend::ProcessGroupShm, torch_backend::BackendBase,
             c10::intrusive_ptr<torch_backend::ProcessGroupShm>>(m, "ProcessGroupShm")
      .def_property_readonly("global_ranks", &torch_backend::ProcessGroupShm::members,
                             "global ranks of the members, in group-rank order");

  m.def("_create_process_group", &torch_backend::create_process_group, py::arg("store"),
        py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("group_name"),
        py::arg("global_ranks_in_group"), py::arg("rank_names") = std::vector<int>{},
        py::arg("machine_ranks") = 0, py::call_guard<py::gil_scoped_release>(),
        "the creator of backend 'shm' (torch.distributed calls it through shmdist.torch); "
        "rank_names: for one host's job of a group across hosts, the global rank of each of "
        "its ranks, which its error texts name; machine_ranks: for such a job, the group's "
        "ranks on this machine, whose CPUs it counts its share of");
  // How many CPUs a group's job counts as its ranks' (embedding::job_cpus).
  m.def("_job_cpus",
        [](const torch_backend::ProcessGroupShm& group) {
          std::lock_guard lock(group.job()->mutex);  // not while the job is being destroyed
          return embedding::job_cpus(group.job()->pg);
        },
        py::arg("group"));
  // What every operation checks first (for tests: without CUDA, a CUDA tensor cannot even be
  // made, and torch's dispatcher routes other devices' tensors elsewhere).
  m.def("_check_tensor", &torch_backend::check_tensor, py::arg("tensor"), py::arg("op"));
  // For bench/torch/overhead.py: send/recv loops in C++ (the GIL released throughout), and
  // callgrind's counters.
  m.def("_cxx_loop", &torch_backend::cxx_loop, py::arg("group"), py::arg("path"),
        py::arg("pattern"), py::arg("tensor"), py::arg("peer"), py::arg("iterations"),
        py::arg("tag") = 0, py::call_guard<py::gil_scoped_release>());
  // shmdist.torch.inference_all_reduce's C++ part (the GIL released while it waits).
  m.def("_inference_all_reduce", &torch_backend::inference_all_reduce, py::arg("group"),
        py::arg("tensor"), py::arg("op"));
  m.def("_callgrind", &torch_backend::callgrind, py::arg("what"));
  m.def("_check_world_peers", &torch_backend::check_world_peers, py::arg("waiting_for"),
        py::call_guard<py::gil_scoped_release>(),
        "raises PeerFailure if a rank of the world job on 'shm' ended abnormally; returns "
        "whether this process has a world job on 'shm'");
  // The floor for bench/torch/overhead.py: the creator of a backend that moves nothing (its
  // send, recv and barrier return completed Work), registered there as "shmdist_null".
  py::class_<torch_backend::ProcessGroupNull, torch_backend::BackendBase,
             c10::intrusive_ptr<torch_backend::ProcessGroupNull>>(m, "_ProcessGroupNull");
  m.def("_create_null_process_group", &torch_backend::create_null_process_group,
        py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"));
  m.attr("__version__") = kVersionString;
  // The torch this extension was compiled against: shmdist/torch.py refuses another one.
  m.attr("_torch_built_against") = SHMDIST_TORCH_BUILT_AGAINST;
}
