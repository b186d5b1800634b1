"""The process group across hosts (ProcessGroupHosts): "shm" among the members on this host,
gloo among all members and among the hosts' leaders; every operation of backend "shm", with
its documented order of reduction (docs/hosts.md).
"""

import re

import torch
import torch.distributed as dist

from .. import _C
from .agreement import _Agreement
from .failures import _refuse, _watched
from .in_order import _Call, _InOrder, _InOrderWork
from .mailbox import _INLINE, _Mailbox, _Payloads, _header, _remote_tag
from .ops import _AVG, _COMBINE, _SUM_OVER_GLOO, _broadcast_opts, _kind, _reduce_opts
from .works import _AllWork, _WatchedWork, _done


def _global_rank_text(text, global_ranks):
    """gloo's text naming group ranks ("Rank 1 failed ...", "Ranks 1, 2 failed ...", "[Rank
    0]: ...") with the group's global ranks instead."""
    def one(m):
        return str(global_ranks[int(m.group(0))]) if int(m.group(0)) < len(global_ranks) \
            else m.group(0)

    def ranks(m):
        return m.group(1) + re.sub(r"\d+", one, m.group(2))
    return re.sub(r"(\b[Rr]anks? )(\d+(?:, \d+)*)", ranks, text)


class ProcessGroupHosts(dist.ProcessGroup):
    """A torch process group whose members are on several hosts: "shm" among the members on
    this host (`local`, a group of backend "shm"), gloo among all members (`gloo`) and among
    one leader per host, the lowest rank of each (`leaders`, on leaders only).

    Reductions are hierarchical and deterministic: each host reduces its members in rank order
    (over "shm", to its leader); the leaders gather the host partials and combine them in host
    order (hosts ordered by their lowest rank), so every leader computes the same bits; then
    each leader broadcasts inside its host. With hosts [0, 1] and [2, 3], SUM is
    (x0 + x1) + (x2 + x3), bitwise equal on every rank."""

    # Bytes from which an all_reduce on the leaders' schedule moves in pieces of PIECE bytes
    # whose steps overlap (_allreduce_pipelined; docs/hosts.md says how they were chosen).
    PIPELINE = 4 << 20
    PIECE = 2 << 20

    def __init__(self, rank, size, hosts, local, gloo, leaders, global_ranks):
        super().__init__(rank, size)
        self.hosts = hosts
        self._host_of = {r: h for h, host in enumerate(hosts) for r in host}
        self._host = self._host_of[rank]
        self._local_rank = {r: i for host in hosts for i, r in enumerate(host)}
        self.local = local
        self.gloo = gloo
        self.leaders = leaders
        self.global_ranks = list(global_ranks)
        self.deaths = None  # the world's _Deaths (set by the creator)
        self._coalesced = None  # the Works posted since _start_coalescing, while coalescing
        self._mailboxes = {}  # tag -> _Mailbox, while a receive of it from any source or
        # from another host is involved
        self._payloads = _Payloads()  # the payloads of sends to other hosts, in flight
        self.timeout = None  # the group's timeout (set by the creator), bounds any-source waits
        # The global rank of each rank of this host's "shm" job (which numbers them from 0):
        # this host's members, or for a sub-group whose "shm" part is a sub-group of the
        # world's, the world's members on this host (set by the creator).
        self._host_job_globals = [self.global_ranks[r] for r in hosts[self._host]]
        self._agree = _Agreement(self)  # the hosts agree on each collective first (issue 30)
        # The collectives over the "shm" part and the leaders' group, in the order called.
        self._order = _InOrder("shmdist-hosts-collectives",
                               "global rank " + str(self.global_ranks[rank]))

    def getBackendName(self):
        return "shm"

    # How long stop() waits for a receive the mailbox left posted across hosts (an any-source
    # receive the other transport served): it returns once a message comes or the sender's
    # host leaves, which at the job's end is soon; else it stays (docs/hosts.md, its limits).
    LEFT_RECEIVE = 5.0

    def shutdown(self):
        """torch 2's destroy_process_group calls it, and so does the exit (create.py's atexit):
        the group's threads end before Python finalizes (in_order._InOrder.stop says why)."""
        self.stop_threads()

    def stop_threads(self):
        limit = self.timeout.total_seconds() if self.timeout is not None else 1800.0
        self._order.stop(limit)
        self._payloads.stop(limit)
        self._agree.close()
        for box in list(self._mailboxes.values()):
            for posted in list(box.posted.values()):
                if posted is not None and posted.thread is not None:
                    posted.thread.join(self.LEFT_RECEIVE)

    def _named_globally(self, text):
        """A text of this host's "shm" part, which numbers its ranks from 0 (a collective whose
        members disagree names "group rank 1 (global rank 1)" and "src=1" for global rank 3),
        with this group's ranks and the global ranks instead."""
        names = self._host_job_globals

        def member(m):
            j = int(m.group(2))
            if not 0 <= j < len(names) or names[j] not in self.global_ranks:
                return m.group(0)
            g = names[j]
            return "group rank " + str(self.global_ranks.index(g)) + " (global rank " + \
                str(g) + ")"

        def root(m):
            j = int(m.group(2))
            return m.group(1) + "=" + (str(names[j]) if 0 <= j < len(names) else m.group(2))
        if "disagree" not in text and "rejected its arguments" not in text:
            return text
        text = re.sub(r"group rank (\d+) \(global rank (\d+)\)", member, text)
        text = re.sub(r"\b(root|src|dst)=(\d+)", root, text)
        text = text.replace("on the world group)", "on this host's \"shm\" part of the group)")
        # The steps inside a host that the "shm" part compares are not the user's calls:
        # said as what they stand for.
        text = text.replace("all_gather(torch.uint8, " + str(_Agreement.TEXT) + " elements)",
                            "a collective whose call texts a host compares first (reduce, "
                            "reduce_scatter, all_gather, gather, scatter, all_to_all, or one "
                            "of more than " + str(_Agreement.SMALL) + " bytes)")
        return re.sub(r"called reduce\(op=(\w+), (?:(?:root|dst)=\d+, )?([\w.]+), "
                      r"(\d+) elements\)",
                      r"called all_reduce(op=\1, \2, \3 elements) (a reduce to the host's "
                      r"leader)", text)

    # torch 2's ProcessGroup keeps its name in its backends, and this group has none (it is
    # the backend): DeviceMesh, DTensor and the functional collectives find groups by name.
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        if getattr(self, "_group_name", None) is None:
            raise RuntimeError("ProcessGroup name not set")
        return self._group_name

    def __repr__(self):
        return "ProcessGroupHosts(rank=" + str(self.rank()) + ", size=" + str(self.size()) + \
            ", hosts=" + str(self.hosts) + ")"

    def _local_peer(self, peer):
        """The local group's rank of group rank `peer` if it is on this host, else None."""
        if not 0 <= peer < self.size():
            raise _C.InvalidArgument("shm backend: peer " + str(peer) + " is not a rank of "
                                     "this group of " + str(self.size()) + " ranks")
        return self._local_rank[peer] if self._host_of[peer] == self._host else None

    @staticmethod
    def _one(tensors, op):
        if len(tensors) != 1:
            raise _C.InvalidArgument("shm backend: " + op + " takes one tensor per call, got " +
                                     str(len(tensors)))
        return tensors[0]

    # point-to-point: a peer on this host over "shm", another host's over gloo

    @_watched("send")
    def send(self, tensors, dst, tag=0):
        local = self._local_peer(dst)
        if local is None:
            # To another host: the header, then the payload unless the header holds it, both
            # over gloo (_PAYLOAD_TAG says why); the Work is the header's (_Payloads says why).
            tensor = self._one(tensors, "send")
            me = self.global_ranks[self.rank()]
            ptag = _remote_tag(tag, "send", me)
            header, nbytes = _header(tensor, "send", me)
            # The payload's copy is made before the header goes (gloo sends contiguous tensors
            # only): once the header is out, the receiver waits for the payload (review 6).
            payload = tensor.detach().resolve_conj().resolve_neg().clone(
                memory_format=torch.contiguous_format) if nbytes > _INLINE else None
            work = self.gloo.send([header], dst, tag)
            if payload is not None:
                self._payloads.add(self.gloo.send([payload], dst, ptag))
            return self._posted(work if self.deaths is None else
                                _WatchedWork(work, self.deaths, "send"))
        return self._posted(self.local.send(tensors, local, tag))

    @_watched("recv")
    def recv(self, tensors, src, tag=0):
        local = self._local_peer(src)
        box = self._mailboxes.get(tag)
        if local is None or (box is not None and box.involves_local()):
            # From another host (a header, then the payload it sizes), or in the order of
            # what the mailbox holds from this host's ranks: through the tag's mailbox.
            if local is None:
                _remote_tag(tag, "recv", self.global_ranks[self.rank()])
            return self._posted(self._mailbox(tag).claim(src, self._one(tensors, "recv")))
        return self._posted(self.local.recv(tensors, local, tag))

    @_watched("recv")
    def recv_anysource(self, tensors, tag=0):
        _remote_tag(tag, "recv", self.global_ranks[self.rank()])
        return self._posted(self._mailbox(tag).claim(None, self._one(tensors, "recv")))

    def _mailbox(self, tag):
        box = self._mailboxes.get(tag)
        if box is None:
            box = self._mailboxes[tag] = _Mailbox(self, tag)
        return box

    # collectives

    def _in_order(self, what, opts, body, result):
        """The Work of the collective `what` whose communication is body() (over the "shm" part
        and the leaders' group), returning `result`. It runs in the order of this group's
        collectives (_InOrder): posted when the caller may go on before it completes (torch 2
        says so in the options: asyncOp True, as DDP's calls have), and the Work completes
        once it has run; else at once on this thread (after anything posted before it), which
        costs no hand-over between threads. Errors reach wait() (or this call) as _watched
        makes them.

        torch 1.13's options do not say, and its C++ callers (DDP's reducer and parameter
        broadcast) wait on a Work through c10d's own Work::wait, which a Work written in
        Python cannot complete there (DDP hung): on torch 1.13 every collective completes
        before it returns, as before."""
        if not getattr(opts, "asyncOp", False) and self._order.idle():
            body()
            return _done(result)
        watched = _watched(what)(lambda group: body())
        call = _Call(lambda: watched(self), result)
        self._order.post(call)
        return _InOrderWork(self._order, call)

    @_watched("barrier")
    def barrier(self, opts=None):
        def body():
            # Nobody leaves before everyone entered: a leader passes the leaders' barrier only
            # once every leader has, each after its host's members entered; members leave
            # after it.
            self._agree.in_host(lambda: self.local.barrier().wait())
            self._agree.check("barrier()")  # the leaders' exchange, then the release in each host
        return self._in_order("barrier", opts, body, [])

    @_watched("monitored_barrier")
    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        # gloo's among all members: rank 0 waits for every member within the timeout and
        # raises naming the group ranks that did not arrive (all of them with wait_all_ranks).
        # Its text names group ranks; a sub-group's are given as global ranks here.
        try:
            if timeout is None:
                self.gloo.monitored_barrier(wait_all_ranks=wait_all_ranks)
            else:
                self.gloo.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
        except RuntimeError as e:
            if self.global_ranks == list(range(self.size())):
                raise
            raise type(e)(_global_rank_text(str(e), self.global_ranks)) from e

    def _combine_hosts(self, tensor, op):
        """On a leader: the host partials gathered over the leaders' group (one member per
        host, in host order) and combined in host order, into tensor."""
        group = self.leaders
        # The choice depends only on what the leaders agreed on (op, dtype, hosts), never on a
        # leader's own tensor layout: leaders taking different gloo collectives would wait for
        # each other to the timeout (review 6). A layout gloo cannot take in place goes
        # through a contiguous copy.
        if len(self.hosts) == 2 and _kind(op) == _kind(dist.ReduceOp.SUM) and \
                tensor.dtype in _SUM_OVER_GLOO:
            if not tensor.is_contiguous() or tensor.is_conj() or tensor.is_neg():
                plain = tensor.resolve_conj().resolve_neg().contiguous()
                group.allreduce([plain]).wait()
                tensor.copy_(plain)
                return
            # Two partials: each element is one addition p0 + p1, which gives the same bits
            # as p1 + p0, so gloo's all_reduce of the two leaders computes exactly the host
            # order's sum, each element once, on one leader, sent to the other (bitwise equal
            # on both). It works in place: the all-gather below allocates and fills a buffer
            # per host and gloo copies through two more, which at 16 MiB cost more than gloo's
            # whole 4-rank all_reduce (docs/hosts.md).
            group.allreduce([tensor]).wait()
            return
        parts = [torch.empty_like(tensor) for _ in self.hosts]
        group.allgather([parts], [tensor]).wait()
        acc = parts[0]
        combine = _COMBINE[_kind(op)]
        for part in parts[1:]:
            acc = combine(acc, part)
        tensor.copy_(acc)

    def _check_op(self, opts, what, tensors=()):
        kind = _kind(opts.reduceOp)
        if kind == _AVG:
            for t in tensors:
                if not (t.is_floating_point() or t.is_complex()):
                    raise _C.InvalidArgument(
                        "shm backend: " + what + " with ReduceOp.AVG is defined on floating "
                        "tensors only, not on " + str(t.dtype) + " (global rank " +
                        str(self.global_ranks[self.rank()]) + "); use SUM and divide")
            return opts.reduceOp
        if kind not in _COMBINE:
            _refuse(what + " with reduce op " + str(getattr(opts.reduceOp, "op", opts.reduceOp)),
                    "SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR and BXOR are")
        return opts.reduceOp

    def _allreduce_small(self, tensor, op, avg, call):
        """_allreduce_one of at most _Agreement.SMALL bytes: the host partials travel with the
        check in one frame among the leaders, combined in host order (the same bits as
        _combine_hosts); on disagreement the leader's tensor gets its input back."""
        keep = tensor.clone() if self.leaders is not None else None
        self._agree.in_host(lambda: self.local.reduce([tensor], _reduce_opts(0, op)).wait())
        error = None
        if self.leaders is not None:
            error, frames = self._agree.exchange(call, tensor)
            if error is None:
                parts = self._agree.payloads(tensor)
                acc = parts[0]
                combine = _COMBINE[_kind(op)]
                for part in parts[1:]:
                    acc = combine(acc, part)
                tensor.copy_(acc)
                if avg:
                    tensor.div_(self.size())
            else:
                tensor.copy_(keep)
        self._agree.release(error, tensor)

    def _allreduce_one(self, tensor, op, call):
        # AVG: the SUM in the documented order, divided by the group's size on each leader
        # (in the tensor's dtype) before it broadcasts: every rank gets the same bits.
        avg = _kind(op) == _AVG
        if avg:
            op = dist.ReduceOp.SUM
        # Only all_reduce takes the small path: inside a host it is a "shm" reduce, which
        # reduce and reduce_scatter of the same count would match unseen; they check their
        # call texts first (check_all), so a host that mixes them raises everywhere.
        if self._agree.small(tensor) and call.startswith("all_reduce"):
            return self._allreduce_small(tensor, op, avg, call)
        self._agree.check_all(call)  # issue 30: before any message of the tensor's size
        if tensor.numel() * tensor.element_size() >= self.PIPELINE:
            return self._allreduce_pipelined(tensor, op, avg)
        self.local.reduce([tensor], _reduce_opts(0, op)).wait()
        if self.leaders is not None:
            self._combine_hosts(tensor, op)
            if avg:
                tensor.div_(self.size())
        self.local.broadcast([tensor], _broadcast_opts(0)).wait()

    def _post_combine(self, piece, op):
        """On a leader: _combine_hosts of the contiguous `piece`, posted to gloo's threads;
        returns the callable that waits for it and writes the host order's result into
        `piece` (the same bits)."""
        group = self.leaders
        if len(self.hosts) == 2 and _kind(op) == _kind(dist.ReduceOp.SUM) and \
                piece.dtype in _SUM_OVER_GLOO:
            return group.allreduce([piece]).wait  # in place, as _combine_hosts says why
        parts = [torch.empty_like(piece) for _ in self.hosts]
        work = group.allgather([parts], [piece])
        combine = _COMBINE[_kind(op)]

        def finish():
            work.wait()
            acc = parts[0]
            for part in parts[1:]:
                acc = combine(acc, part)
            piece.copy_(acc)
        return finish

    def _allreduce_pipelined(self, tensor, op, avg):
        """_allreduce_one of at least PIPELINE bytes on the leaders' schedule, in pieces of
        PIECE bytes, so that the steps overlap: each piece is reduced inside the host to the
        leader (over "shm"), and its combination across hosts is posted to the leaders' gloo
        group at once (gloo's threads run it), while the next piece is reduced; then, piece by
        piece, the leader waits for it and broadcasts it inside the host. Every element is
        computed as the leaders' schedule computes it (rank order inside each host, then host
        order: the same bits); the pieces' boundaries and count depend only on the checked
        call's size, so every rank makes the same calls in the same order."""
        plain = tensor.is_contiguous() and not tensor.is_conj() and not tensor.is_neg()
        flat = (tensor if plain else tensor.resolve_conj().resolve_neg().contiguous()).view(-1)
        n = flat.numel()
        step = max(1, self.PIECE // flat.element_size())
        pieces = [flat[i:i + step] for i in range(0, n, step)]
        finish = []
        for piece in pieces:
            self.local.reduce([piece], _reduce_opts(0, op)).wait()
            if self.leaders is not None:
                finish.append(self._post_combine(piece, op))
        for i, piece in enumerate(pieces):
            if self.leaders is not None:
                finish[i]()
                if avg:
                    piece.div_(self.size())
            self.local.broadcast([piece], _broadcast_opts(0)).wait()
        if not plain:
            tensor.copy_(flat.view(tensor.shape))

    @_watched("all_reduce")
    def allreduce(self, tensors, opts=None):
        with self._agree.arguments("all_reduce"):
            tensor = self._one(tensors, "all_reduce")
            op = self._check_op(opts if opts is not None else dist.AllreduceOptions(),
                                "all_reduce", [tensor])
        call = self._agree.call("all_reduce", tensor, op)
        return self._in_order("all_reduce", opts, lambda: self._allreduce_one(tensor, op, call),
                              [tensor])

    @_watched("all_reduce_coalesced")
    def allreduce_coalesced(self, tensors, opts=None):
        op = self._check_op(opts if opts is not None else dist.AllreduceCoalescedOptions(),
                            "all_reduce_coalesced", tensors)

        def body():
            for tensor in tensors:
                self._allreduce_one(tensor, op, self._agree.call("all_reduce_coalesced", tensor,
                                                                 op))
        return self._in_order("all_reduce_coalesced", opts, body, list(tensors))

    @_watched("reduce")
    def reduce(self, tensors, opts=None):
        with self._agree.arguments("reduce"):
            tensor = self._one(tensors, "reduce")
            op = self._check_op(opts, "reduce", [tensor])

        def body():
            result = tensor.clone()
            self._allreduce_one(result, op, self._agree.call("reduce", tensor, op,
                                                             ("dst", opts.rootRank)))
            if self.rank() == opts.rootRank:
                tensor.copy_(result)
        return self._in_order("reduce", opts, body, [tensor])

    @_watched("broadcast")
    def broadcast(self, tensors, opts=None):
        src = opts.rootRank if opts is not None else 0
        with self._agree.arguments("broadcast"):
            self._local_peer(src)
            src_host = self._host_of[src]
            call = self._agree.call("broadcast", self._one(tensors, "broadcast"),
                                    root=("src", src))

        def body():
            if self._agree.small(tensors[0]):
                self._broadcast_small(tensors[0], src, src_host, call)
                return
            self._agree.check_all(call)  # issue 30: before any message of the tensor's size
            # src's host first (its leader included), then the leaders, then the other hosts.
            if self._host == src_host:
                self.local.broadcast(tensors, _broadcast_opts(self._local_rank[src])).wait()
            if self.leaders is not None:
                self.leaders.broadcast(tensors, _broadcast_opts(src_host)).wait()
            if self._host != src_host:
                self.local.broadcast(tensors, _broadcast_opts(0)).wait()
        return self._in_order("broadcast", opts, body, list(tensors))

    def _broadcast_small(self, tensor, src, src_host, call):
        """broadcast of at most _Agreement.SMALL bytes: the data travels with the check in the
        leaders' frames; on disagreement the ranks of src's host get their input back."""
        keep = tensor.clone() if self._host == src_host and self.rank() != src else None
        error = None
        if self._host == src_host:
            self._agree.in_host(lambda: self.local.broadcast(
                [tensor], _broadcast_opts(self._local_rank[src])).wait())
        elif len(self.hosts[self._host]) > 1:
            # A host without the source compares its members' calls before its leader's
            # frame goes: a member that thinks the source is on this host (its "shm"
            # broadcast meets the others' texts) or names another root is found here, so
            # every host raises (issue 30.2 c), not this host alone after the others agreed.
            error = self._agree.host_calls(call)
        if self.leaders is not None:
            theirs, frames = self._agree.exchange(self._agree.failed(call, error),
                                                  tensor if self._host == src_host else None)
            error = error or theirs
            if error is None and self._host != src_host:
                tensor.copy_(self._agree.payload(frames[src_host], tensor))
        try:
            self._agree.release(error, tensor if self._host != src_host else None)
        except _C.InvalidArgument:
            if keep is not None:
                tensor.copy_(keep)
            raise
        return _done([tensor])

    # Operations that only move data go over gloo among all members: exact, as "shm"'s.

    @_watched("all_gather")
    def allgather(self, output_tensors, input_tensors, opts=None):
        self._order.drain()  # the check meets the hosts over the collectives' groups
        self._agree.check_all(self._agree.call("all_gather", self._one(input_tensors,
                                                                     "all_gather")))
        return self.gloo.allgather(output_tensors, input_tensors)

    @_watched("all_gather_into_tensor")
    def _allgather_base(self, output, input, opts=None):
        outputs = list(output.chunk(self.size()))
        if not outputs or any(o.shape != input.shape for o in outputs):
            self._agree.reject("all_gather_into_tensor")
            raise _C.InvalidArgument("shm backend: all_gather_into_tensor takes an output of "
                                     "world size x the input's size, got " +
                                     str(tuple(output.shape)) + " for an input of " +
                                     str(tuple(input.shape)) + " (global rank " +
                                     str(self.global_ranks[self.rank()]) + ")")
        self._order.drain()  # the check meets the hosts over the collectives' groups
        self._agree.check_all(self._agree.call("all_gather_into_tensor", input))
        staging = [torch.empty_like(input) for _ in range(self.size())]
        self.gloo.allgather([staging], [input]).wait()
        for o, s in zip(outputs, staging):
            o.copy_(s)
        return _done([output])

    def all_gather_single(self, output, input, opts=None):  # torch 2.13's all_gather_into_tensor
        return self._allgather_base(output, input, opts)

    @_watched("gather")
    def gather(self, output_tensors, input_tensors, opts=None):
        return self._rooted("gather", "dst", input_tensors, opts.rootRank, dist.GatherOptions(),
                            lambda o: self.gloo.gather(output_tensors, input_tensors, o))

    @_watched("scatter")
    def scatter(self, output_tensors, input_tensors, opts=None):
        return self._rooted("scatter", "src", output_tensors, opts.rootRank,
                            dist.ScatterOptions(),
                            lambda o: self.gloo.scatter(output_tensors, input_tensors, o))

    def _rooted(self, what, role, tensors, root, o, post):
        """gather and scatter: the check across hosts of `what` (this rank's one tensor of
        `tensors`, the root said as `role`), then gloo's call, post(o) with o's root set."""
        o.rootRank = root
        self._order.drain()  # the check meets the hosts over the collectives' groups
        self._agree.check_all(self._agree.call(what, self._one(tensors, what),
                                               root=(role, root)))
        return post(o)

    # all_to_all only moves data: over gloo among all members (its all_to_all_single; the
    # list form travels as one flat tensor of each rank's pieces).

    @_watched("all_to_all_single")
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        self._check_all_to_all("all_to_all_single", output, input, output_split_sizes,
                               input_split_sizes)
        self.gloo.alltoall_base(output, input, list(output_split_sizes),
                                list(input_split_sizes), dist.AllToAllOptions()).wait()
        return _done([output])

    def _check_all_to_all(self, what, output, input, output_split_sizes, input_split_sizes):
        """Issue 30: the ranks agree on the call (dtype), then on every pair's piece."""
        n = self.size()
        self._order.drain()
        self._agree.check_all(self._agree.call(what, input, count=input.numel()) if not (
            output_split_sizes or input_split_sizes) else what + "(" + str(input.dtype) + ")")
        if output_split_sizes or input_split_sizes:  # else the count in the call says it
            self._agree.check_splits(what, list(input_split_sizes) or [input.numel() // n] * n,
                                     list(output_split_sizes) or [output.numel() // n] * n)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=None):  # torch 2.13's name
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    @_watched("all_to_all")
    def alltoall(self, output_tensors, input_tensors, opts=None):
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            self._agree.reject("all_to_all")
            raise _C.InvalidArgument(
                "shm backend: all_to_all takes " + str(n) + " output and " + str(n) + " input "
                "tensors (one per rank), got " + str(len(output_tensors)) + " and " +
                str(len(input_tensors)))
        dtypes = {t.dtype for t in list(output_tensors) + list(input_tensors)}
        if len(dtypes) != 1:
            raise _C.InvalidArgument("shm backend: all_to_all takes tensors of one dtype, got " +
                                     str(sorted(map(str, dtypes))))
        flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
        flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype)
        self._check_all_to_all("all_to_all", flat_out, flat_in,
                               [t.numel() for t in output_tensors],
                               [t.numel() for t in input_tensors])
        self.gloo.alltoall_base(flat_out, flat_in, [t.numel() for t in output_tensors],
                                [t.numel() for t in input_tensors],
                                dist.AllToAllOptions()).wait()
        for o, piece in zip(output_tensors, flat_out.split([t.numel() for t in output_tensors])):
            o.copy_(piece.view(o.shape))
        return _done(list(output_tensors))

    # reduce_scatter: the inputs reduced as all_reduce reduces (the same documented order,
    # hence the same bits as all_reduce of the same inputs), each rank keeping its piece. It
    # moves the whole input through the hierarchy, as all_reduce does.

    def _reduce_scatter_flat(self, pieces, flat, opts, what):
        """Checks the op; returns the communication (for _in_order), which reduces `flat`
        (every rank's pieces, rank order) and copies rank r's piece to pieces[r] on this rank
        (only this rank's entry is written)."""
        op = self._check_op(opts if opts is not None else dist.ReduceScatterOptions(), what,
                            [flat])

        def body():
            self._allreduce_one(flat, op, self._agree.call(what, flat, op))
            mine = pieces[self.rank()]
            offset = sum(p.numel() for p in pieces[:self.rank()])
            mine.copy_(flat[offset:offset + mine.numel()].view(mine.shape))
        return body

    @_watched("reduce_scatter")
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        with self._agree.arguments("reduce_scatter"):
            output = self._one(output_tensors, "reduce_scatter")
            inputs = self._one(input_tensors, "reduce_scatter")
        if len(inputs) != self.size() or any(t.shape != output.shape or t.dtype != output.dtype
                                               for t in inputs):
            self._agree.reject("reduce_scatter")
            raise _C.InvalidArgument(
                "shm backend: reduce_scatter takes " + str(self.size()) + " inputs of the "
                "output's shape " + str(tuple(output.shape)) + " and dtype " +
                str(output.dtype) + ", got " + str([(tuple(t.shape), str(t.dtype))
                                                    for t in inputs]))
        flat = torch.cat([t.reshape(-1) for t in inputs])
        pieces = [output if r == self.rank() else t for r, t in enumerate(inputs)]
        return self._in_order("reduce_scatter", opts,
                              self._reduce_scatter_flat(pieces, flat, opts, "reduce_scatter"),
                              [output])

    @_watched("reduce_scatter_tensor")
    def _reduce_scatter_base(self, output, input, opts=None):
        return self._in_order("reduce_scatter_tensor", opts,
                              self._reduce_scatter_tensor_body(output, input, opts), [output])

    def _reduce_scatter_tensor_body(self, output, input, opts):
        """reduce_scatter_tensor's arguments checked; returns its communication."""
        if (input.numel() != output.numel() * self.size() or input.dtype != output.dtype):
            self._agree.reject("reduce_scatter_tensor")
            raise _C.InvalidArgument(
                "shm backend: reduce_scatter_tensor takes an input of world size (" +
                str(self.size()) + ") x the output's elements, of its dtype; got " +
                str(tuple(input.shape)) + " " + str(input.dtype) + " for an output of " +
                str(tuple(output.shape)) + " " + str(output.dtype))
        flat = input.reshape(-1).clone()
        pieces = [output] * self.size()
        return self._reduce_scatter_flat(pieces, flat, opts, "reduce_scatter_tensor")

    def reduce_scatter_single(self, output, input, opts=None):  # torch 2.13's name
        return self._reduce_scatter_base(output, input, opts)

    def allgather_coalesced(self, *args, **kwargs):
        _refuse("all_gather_coalesced")

    # torch 2.x's coalesced forms (its _coalescing_manager's "fast path", FSDP): one call of
    # the single-tensor form per tensor, in list order, each as above (same order, same bits).
    # Without these a call would reach torch's ProcessGroup, which has no backend here, and
    # say "No backend type associated with device type cpu".

    @_watched("reduce_scatter_tensor_coalesced")
    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        bodies = [self._reduce_scatter_tensor_body(output, input, opts)
                  for output, input in zip(outputs, inputs)]

        def body():
            for each in bodies:
                each()
        return self._in_order("reduce_scatter_tensor_coalesced", opts, body, list(outputs))

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_single_coalesced(outputs, inputs, opts)

    @_watched("all_gather_into_tensor_coalesced")
    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs):
            self._allgather_base(output, input, opts)
        return _done(list(outputs))

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    # torch 2.x's coalescing of point-to-point (batch_isend_irecv on a plain ProcessGroup,
    # _coalescing_manager with a device): every send and recv between the two calls is posted
    # as it comes (a send on this host over "shm", across hosts over gloo; none waits for its
    # receiver), and the Work of _end_coalescing waits for all of them, in the order they were
    # posted. Collectives in between run as they do outside (they complete before they return).

    def _start_coalescing(self, device=None):
        # A start while coalescing begins afresh, as NCCL's startCoalescing does: torch's
        # _coalescing_manager calls _end_coalescing only after a body that returned, so one
        # whose body raised leaves the group coalescing (its Works were returned to their
        # callers; nobody waits for the abandoned list).
        self._coalesced = []

    def _end_coalescing(self, device=None):
        if self._coalesced is None:
            raise _C.InvalidArgument("shm backend: _end_coalescing without _start_coalescing "
                                     "(global rank " + str(self.global_ranks[self.rank()]) +
                                     ")")
        works, self._coalesced = self._coalesced, None
        return _AllWork(works)

    def _posted(self, work):
        """A send's or recv's Work, remembered while coalescing."""
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work
