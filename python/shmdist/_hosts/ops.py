"""Reduction operations across hosts: a ReduceOp's kind and name, how the leaders combine two
host partials, which sums gloo may do for them, and the options torch's calls take.
"""

import torch
import torch.distributed as dist


def _kind(op):
    """A ReduceOp's kind as an int (torch 1.13's dist.ReduceOp.SUM is a ReduceOp, torch 2's a
    ReduceOp.RedOpType; both have the same number)."""
    return int(getattr(op, "op", op))


_AVG = _kind(dist.ReduceOp.AVG)

# How the leaders combine two host partials, by the ReduceOp's kind.
_COMBINE = {
    _kind(dist.ReduceOp.SUM): torch.add,
    _kind(dist.ReduceOp.PRODUCT): torch.mul,
    _kind(dist.ReduceOp.MIN): torch.minimum,
    _kind(dist.ReduceOp.MAX): torch.maximum,
    _kind(dist.ReduceOp.BAND): torch.bitwise_and,
    _kind(dist.ReduceOp.BOR): torch.bitwise_or,
    _kind(dist.ReduceOp.BXOR): torch.bitwise_xor,
}

# The dtypes whose SUM of two host partials goes through the leaders' gloo all_reduce
# (ProcessGroupHosts._combine_hosts): gloo sums them in their own type, as torch.add does.
_SUM_OVER_GLOO = (torch.float32, torch.float64, torch.int32, torch.int64)


_OP_NAMES = {_kind(getattr(dist.ReduceOp, n)): n for n in
             ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")}


def _reduce_opts(root, op):
    o = dist.ReduceOptions()
    o.rootRank = root
    o.reduceOp = op
    return o


def _broadcast_opts(root):
    o = dist.BroadcastOptions()
    o.rootRank = root
    return o
