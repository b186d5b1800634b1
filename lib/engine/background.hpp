// Work the engine drives whenever its rank makes progress: multi-step operations built on
// point-to-point (the collectives of lib/coll/) register a BackgroundTask, so that an async
// collective keeps moving while its rank blocks in another call (a later blocking recv, a
// Work::wait on something else, destroy_process_group). The engine knows only this
// interface; the tasks live in the layer above.
#pragma once

#include <exception>
#include <string>
#include <vector>

namespace shmdist::engine {

// A call a wait is for that knows whom it still waits for (a collective): the waiter asks it
// in its peer checks and error texts (WaitFocus::subject), never per message.
class WaitSubject {
 public:
  virtual ~WaitSubject() = default;
  // Global ranks the call still waits for (PeerFailure checks, Timeout texts).
  virtual void awaited_peers(std::vector<int>& out) const = 0;
  // What the call is, for error texts: "all_reduce (call #3 on the world group)".
  virtual std::string describe() const = 0;
};

class BackgroundTask : public WaitSubject {
 public:
  // Moves the task forward as far as it can without blocking; returns whether anything moved.
  // Called from the engine's progress loop: it may start point-to-point operations (isend,
  // irecv) and touch shared memory, but must neither block nor call back into progress.
  // It never throws: failures are recorded in the task's own completion.
  virtual bool advance() = 0;
  virtual bool finished() const = 0;
  // The engine is going away with the task unfinished: fail its completion with `error`.
  virtual void abandon(std::exception_ptr error) = 0;
  // awaited_peers() and describe() (WaitSubject): whom the task still waits for, what it is.
};

}  // namespace shmdist::engine
