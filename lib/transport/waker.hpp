// How this rank sleeps while it waits for peers, and how its own threads wake each other: the
// waiter half of the doorbell protocol (wait/doorbell.hpp) behind an interface, because a
// network transport cannot ring a doorbell (the routing transport caps each sleep at its
// remote poll interval instead). Kept apart from the Transport (transport.hpp, bytes only).
// The engine calls it only on slow paths (a wait that found nothing), never per message.
#pragma once

#include <chrono>
#include <cstdint>

namespace shmdist::transport {

class Waker {
 public:
  virtual ~Waker() = default;
  // Ranks of the job that are not asleep right now (they compete for the CPUs).
  virtual int awake_ranks() const = 0;
  // Sleeping: arm, re-check (Transport::poll with full_scan), then sleep or disarm.
  virtual std::uint32_t arm() = 0;
  virtual void sleep(std::uint32_t token, std::chrono::nanoseconds timeout) = 0;
  virtual void disarm() = 0;
  // Wakes this rank's own threads asleep in sleep() (threads of one rank: a change one made
  // that another waits for). Called, like arm(), by one thread at a time (the engine's lock).
  virtual void wake_sleepers() {}
};

}  // namespace shmdist::transport
