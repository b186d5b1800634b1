// Everything the engine needs from the layers below to reach its peers: the Transport (bytes,
// the fast path), the Waker (sleeping) and the Peers (health, hang state). Built by whoever
// picks the transports (bootstrap/: make_shm_link, or make_routing_link across hosts) and handed to
// the engine, which owns it.
#pragma once

#include <memory>

#include "transport/peers.hpp"
#include "transport/transport.hpp"
#include "transport/waker.hpp"

namespace shmdist::transport {

struct Link {
  // Shared: an implementation's transport may use its peers and waker itself (the
  // shared-memory one does, for single copy). Members are destroyed in reverse order, so
  // the transport goes first.
  std::shared_ptr<Peers> peers;
  std::shared_ptr<Waker> waker;
  std::unique_ptr<Transport> bytes;
};

}  // namespace shmdist::transport
