// Fingerprints: encoding, descriptions and the verdict every member computes alike.

#include "coll/fingerprint.hpp"

#include <cstring>

#include <shmdist/distributed.hpp>

#include "coll/reduce.hpp"

namespace shmdist::coll {
namespace {

bool has_op(Kind k) {
  return k == Kind::AllReduce || k == Kind::Reduce || k == Kind::ReduceScatter ||
         k == Kind::ReduceScatterTensor;
}
bool has_root(Kind k) {
  return k == Kind::Broadcast || k == Kind::Reduce || k == Kind::Gather || k == Kind::Scatter;
}
const char* root_name(Kind k) { return k == Kind::Broadcast || k == Kind::Scatter ? "src" : "dst"; }

std::string rank_text(int group_rank, const std::vector<int>& members) {
  std::string s = "group rank " + std::to_string(group_rank);
  if (group_rank >= 0 && group_rank < static_cast<int>(members.size()))
    s += " (global rank " + std::to_string(members[group_rank]) + ")";
  return s;
}

bool same_call(const Fingerprint& a, const Fingerprint& b) {
  return a.magic == b.magic && a.kind == b.kind && a.op == b.op && a.dtype == b.dtype &&
         a.root == b.root && a.group_size == b.group_size && a.seq == b.seq && a.count == b.count;
}

}  // namespace

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::Broadcast: return "broadcast";
    case Kind::AllReduce: return "all_reduce";
    case Kind::Reduce: return "reduce";
    case Kind::AllGather: return "all_gather";
    case Kind::AllGatherIntoTensor: return "all_gather_into_tensor";
    case Kind::Gather: return "gather";
    case Kind::Scatter: return "scatter";
    case Kind::ReduceScatter: return "reduce_scatter";
    case Kind::ReduceScatterTensor: return "reduce_scatter_tensor";
    case Kind::AllToAll: return "all_to_all";
    case Kind::AllToAllSingle: return "all_to_all_single";
    case Kind::MonitoredBarrier: return "monitored_barrier";
    case Kind::Barrier: return "barrier";
  }
  return "an unknown collective";
}

void encode(const CallDescription& call, int n, std::byte* wire) {
  std::memcpy(wire, &call.fp, sizeof(Fingerprint));
  std::byte* counts = wire + sizeof(Fingerprint);
  std::memset(counts, 0, 16 * std::size_t(n));
  for (int j = 0; j < n && j < static_cast<int>(call.send_counts.size()); ++j)
    std::memcpy(counts + 8 * j, &call.send_counts[j], 8);
  for (int j = 0; j < n && j < static_cast<int>(call.recv_counts.size()); ++j)
    std::memcpy(counts + 8 * (n + j), &call.recv_counts[j], 8);
}

CallDescription decode(const std::byte* wire, int n) {
  CallDescription call;
  std::memcpy(&call.fp, wire, sizeof(Fingerprint));
  if (has_splits(static_cast<Kind>(call.fp.kind))) {
    call.send_counts.resize(n);
    call.recv_counts.resize(n);
    const std::byte* counts = wire + sizeof(Fingerprint);
    for (int j = 0; j < n; ++j) {
      std::memcpy(&call.send_counts[j], counts + 8 * j, 8);
      std::memcpy(&call.recv_counts[j], counts + 8 * (n + j), 8);
    }
  }
  return call;
}

std::string describe_call(const CallDescription& call, const std::vector<int>& members) {
  const Fingerprint& fp = call.fp;
  if (fp.magic != kFingerprintMagic) return "something that is not a shmdist collective";
  const auto kind = static_cast<Kind>(fp.kind);
  std::string s = std::string(kind_name(kind)) + "(";
  if (fp.rejected) return s + "invalid arguments)";
  if (has_op(kind)) s += std::string("op=") + reduce_op_name(static_cast<ReduceOp>(fp.op)) + ", ";
  if (has_root(kind)) {
    s += std::string(root_name(kind)) + "=";
    s += fp.root >= 0 && fp.root < static_cast<int>(members.size())
             ? std::to_string(members[fp.root])
             : std::to_string(fp.root);
    s += ", ";
  }
  if (kind != Kind::MonitoredBarrier && kind != Kind::Barrier) {  // they carry no data
    s += std::string(dtype_name(static_cast<DType>(fp.dtype)));
    if (!has_splits(kind)) s += ", " + std::to_string(fp.count) + " elements";
  }
  if (!s.empty() && s.back() == ' ') s.resize(s.size() - 2);
  return s + ")";
}

std::optional<std::string> verdict(std::span<const CallDescription> calls, int me,
                                   const std::vector<int>& members, const std::string& what) {
  const int n = static_cast<int>(calls.size());
  const std::string tail =
      ". Every member must call the same collectives in the same order, with the same op, "
      "dtype, element counts and root; this call did nothing on any member";
  for (int r = 0; r < n; ++r) {
    if (!calls[r].fp.rejected) continue;
    if (r == me) return std::nullopt;  // this member throws its own error
    return what + ": " + rank_text(r, members) + " rejected its arguments (its own "
           "InvalidArgument says why), so no member took part; fix the call there";
  }
  for (int r = 1; r < n; ++r) {
    if (same_call(calls[r].fp, calls[0].fp)) continue;
    return what + ": the members' calls disagree: " + rank_text(r, members) + " called " +
           describe_call(calls[r], members) + " but " + rank_text(0, members) + " called " +
           describe_call(calls[0], members) + tail;
  }
  if (n > 0 && has_splits(static_cast<Kind>(calls[0].fp.kind))) {
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        const std::int64_t sends = calls[i].send_counts[j];
        const std::int64_t expects = calls[j].recv_counts[i];
        if (sends == expects) continue;
        return what + ": the members' splits disagree: " + rank_text(i, members) +
               " sends " + std::to_string(sends) + " elements to " + rank_text(j, members) +
               ", which expects " + std::to_string(expects) + " from it" + tail;
      }
  }
  return std::nullopt;
}

}  // namespace shmdist::coll
