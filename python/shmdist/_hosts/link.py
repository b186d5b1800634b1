"""The leaders' frames (issue 30, _Agreement): one TCP connection between every two hosts'
leaders, over which each collective's frame of fixed size goes from every leader to every
other leader, sent and read on the calling thread. docs/hosts.md, "A mismatch across hosts".

Why not gloo's all_gather among the leaders, as before: a frame is a few KiB, and gloo moves
it through its worker thread and its TCP loop thread, in two pieces with control messages
around each; on two hosts that share CPUs with their host mates (as the emulated hosts do), a
4 B all_reduce spent most of its time there (docs/hosts.md, "The leaders' frames").
"""

import fcntl
import ipaddress
import os
import socket
import struct

import torch

from .. import _C


def _interface_address(name):
    """The address of interface `name`, as gloo's device for GLOO_SOCKET_IFNAME takes one: its
    IPv4 address, else its first IPv6 address of global scope (/proc/net/if_inet6)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915,  # SIOCGIFADDR
                                 struct.pack("256s", name[:15].encode()))
            return socket.AF_INET, socket.inet_ntoa(packed[20:24])
        except OSError as e:
            why = str(e)
    unusable = 0x08 | 0x20 | 0x40  # IFA_F_DADFAILED, IFA_F_DEPRECATED, IFA_F_TENTATIVE
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:  # address, index, prefix length, scope, flags, interface
                fields = line.split()
                if (len(fields) == 6 and fields[5] == name and fields[3] == "00"
                        and not int(fields[4], 16) & unusable):
                    return socket.AF_INET6, socket.inet_ntop(socket.AF_INET6,
                                                             bytes.fromhex(fields[0]))
    except OSError:
        pass
    raise _C.InvalidArgument(
        "shm backend: GLOO_SOCKET_IFNAME names " + repr(name) + ", which has no IPv4 address "
        "(" + why + ") and no global IPv6 address here; name this host's interface to the "
        "other hosts") from None


def _address():
    """(family, address) this leader listens on: the one gloo's default device takes (the
    interface GLOO_SOCKET_IFNAME names, else the first address of the host's name, IPv4 or
    IPv6 but not link-local, that a socket can bind), else loopback."""
    names = os.environ.get("GLOO_SOCKET_IFNAME", "")
    if len(names) > 1:  # as torch reads it; the first interface named
        return _interface_address(names.split(",")[0])
    try:
        found = socket.getaddrinfo(socket.gethostname(), None, socket.AF_UNSPEC,
                                   socket.SOCK_STREAM)
    except OSError:
        found = []
    for family, kind, proto, _, where in found:
        ip = ipaddress.ip_address(where[0].split("%")[0])
        if ip.version == 6 and ip.is_link_local:
            continue  # its scope would not travel with the address to the other leaders
        try:
            with socket.socket(family, kind, proto) as s:
                s.bind((where[0], 0) + tuple(where[2:]))
            return family, where[0]
        except OSError:
            continue
    return socket.AF_INET, "127.0.0.1"


class _FrameLink:
    """A connection from this leader (host `index` of `n`) to every other host's leader, made
    once over the leaders' gloo group (each leader's address gathered; a leader connects to the
    lower hosts' leaders and accepts the higher ones'). swap() sends this leader's frame to all
    and reads theirs; post() sends it without reading (a call this rank leaves at once), and the
    peers' frames of that call are read, and dropped, before the next swap's. Every leader sends
    exactly one frame per collective and the connections keep their order, so the i-th frame
    read from a peer is its i-th collective's, as the i-th all_gather among the leaders was."""

    ADDRESS = 64  # bytes of a leader's "ip port" in the gathering

    def __init__(self, leaders, index, n, timeout, leader_names):
        self.index = index
        self.timeout = timeout
        self.names = leader_names  # "the leader of host h (global rank G)", for errors
        self.owed = 0  # frames of calls this leader left without reading the peers' frames
        self.peers = {}
        family, address = _address()
        server = socket.socket(family)
        try:
            server.bind((address, 0))
            server.listen(n)
            server.settimeout(timeout)
            host, port = server.getsockname()[:2]
            mine = torch.zeros(self.ADDRESS, dtype=torch.uint8)
            text = (host + " " + str(port)).encode()
            mine[:len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
            everyone = [torch.empty_like(mine) for _ in range(n)]
            leaders.allgather([everyone], [mine]).wait()
            for h in range(index):
                a, p = bytes(everyone[h].tolist()).rstrip(b"\0").decode().split()
                s = self._guarded(h, lambda: socket.create_connection((a, int(p)), timeout))
                s.sendall(struct.pack("<I", index))
                self._add(h, s)
            for _ in range(index + 1, n):
                s = self._guarded(None, lambda: server.accept()[0])
                s.settimeout(timeout)
                h = struct.unpack("<I", self._read(s, None, bytearray(4)))[0]
                if not index < h < n or h in self.peers:
                    raise RuntimeError("shm backend: the leaders' connections: host " + str(h) +
                                       " connected to " + self.names(index) + ", which "
                                       "expected hosts " + str(index + 1) + " to " +
                                       str(n - 1))
                self._add(h, s)
        except BaseException:
            self.close()
            raise
        finally:
            server.close()

    def _add(self, h, s):
        s.settimeout(self.timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.peers[h] = s

    def _guarded(self, h, step):
        """step(), its socket errors said as gloo's are (RuntimeError: _watched names a rank
        that died; "timed out" for a wait that expired, failures._timed_out)."""
        try:
            return step()
        except socket.timeout:
            raise RuntimeError("shm backend: the leaders' frames: timed out after " +
                               str(self.timeout) + " s waiting for " +
                               (self.names(h) if h is not None else "another host's leader") +
                               " (on " + self.names(self.index) + ")") from None
        except OSError as e:
            raise RuntimeError("shm backend: the leaders' frames: the connection to " +
                               (self.names(h) if h is not None else "another host's leader") +
                               " failed: " + str(e) + " (on " + self.names(self.index) +
                               "); unless that rank ended, check that the hosts reach each "
                               "other at the address gloo uses (GLOO_SOCKET_IFNAME names the "
                               "interface)") from None

    def _read(self, s, h, into):
        view = memoryview(into).cast("B")
        got = 0
        while got < len(view):
            n = self._guarded(h, lambda: s.recv_into(view[got:]))
            if n == 0:
                raise RuntimeError("shm backend: the leaders' frames: connection closed by " +
                                   (self.names(h) if h is not None else "another host's "
                                    "leader") + " (on " + self.names(self.index) + ")")
            got += n
        return into

    def post(self, frame):
        """Sends `frame` (a numpy uint8 array) to every other leader."""
        for h, s in self.peers.items():
            self._guarded(h, lambda: s.sendall(frame))
        self.owed += 1

    def swap(self, frame, frames):
        """Sends `frame` to every other leader and reads each one's frame of this call into
        frames[h] (frames[self.index] gets this leader's)."""
        self.post(frame)
        owed, self.owed = self.owed, 0
        for h, s in self.peers.items():
            for _ in range(owed - 1):  # the frames of the calls left before: dropped
                self._read(s, h, frames[h])
            self._read(s, h, frames[h])
        frames[self.index][:] = frame

    def close(self):
        for s in self.peers.values():
            try:
                s.close()
            except OSError:
                pass
        self.peers = {}
