#include "coll/builder.hpp"

#include <string>

namespace shmdist::coll {
namespace {

// "(3, 2)", "(4,)", "()": a shape as Python (and gloo's message) writes it.
std::string shape_tuple(const std::vector<std::int64_t>& sizes) {
  std::string text = "(";
  for (std::size_t d = 0; d < sizes.size(); ++d) text += (d ? ", " : "") + std::to_string(sizes[d]);
  return text + (sizes.size() == 1 ? ",)" : ")");
}

}  // namespace

void fingerprint_call(Fingerprint& fp, const CallSetup& s, Kind kind) {
  fp.kind = std::uint8_t(kind);
  fp.seq = s.seq;
  fp.group_size = static_cast<std::uint32_t>(s.group.size());
}
void fingerprint_data(Fingerprint& fp, DType dtype, std::int64_t count) {
  fp.dtype = std::uint8_t(dtype);
  fp.count = count;
}
void fingerprint_op(Fingerprint& fp, ReduceOp op) { fp.op = std::uint8_t(static_cast<int>(op)); }

int Builder::root(int global_root, const char* role) {
  for (int j = 0; j < n(); ++j)
    if (members()[j] == global_root) return call_.fp.root = j;
  std::string list;
  for (int m : members()) list += (list.empty() ? "" : ", ") + std::to_string(m);
  fail(std::string(role) + " rank " + std::to_string(global_root) + " is not a member of the "
       "group (global ranks " + list + "); " + role + " is a global rank of a member");
  return -1;
}

bool Builder::list(const std::vector<Tensor>& l, const char* role, DType dtype,
                   const Tensor* like, const char* like_role) {
  if (static_cast<int>(l.size()) != n()) {
    fail(std::string(role) + " has " + std::to_string(l.size()) + " tensors; it needs one per "
         "group member (" + std::to_string(n()) + ")");
    return false;
  }
  for (int j = 0; j < n() && ok(); ++j) {
    const std::string entry = std::string(role) + "[" + std::to_string(j) + "]";
    if (!l[j].defined()) fail(entry + " is undefined");
    else if (l[j].dtype() != dtype)
      fail(entry + " is " + std::string(dtype_name(l[j].dtype())) + " but must be " +
           std::string(dtype_name(dtype)) + " like the other tensors of the call");
    else if (like && l[j].numel() != like->numel())
      fail(entry + " has " + std::to_string(l[j].numel()) + " elements but must have " +
           std::to_string(like->numel()));
    else if (like && l[j].sizes() != like->sizes())
      fail("on rank " + std::to_string(members()[me()]) + ", " + entry + " has shape " +
           shape_tuple(l[j].sizes()) + " but " + like_role + " has shape " +
           shape_tuple(like->sizes()) + ": invalid tensor size at index " + std::to_string(j) +
           " (expected " + shape_tuple(like->sizes()) + ", got " + shape_tuple(l[j].sizes()) +
           "); give every tensor of " + role + " the shape of " + like_role +
           " (reshape or view them; the element counts already agree)");
  }
  return ok();
}

}  // namespace shmdist::coll
