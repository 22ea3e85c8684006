#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/round_state.h"
#include "rendezvous/store.h"
#include "rendezvous/util/status.h"

namespace dtrun::rendezvous {

// Push mode: one more connection per node on which the store pushes the
// changes that matter to a running round (its `over` key and the watched
// node's liveness keys), so a quiet round costs the store only the
// heartbeats (rendezvous/README.md, "The rendezvous protocol": push load).
// A watch that cannot open or fails sends its round back to reading, said
// once. Not thread-safe: the agent's thread owns it.
class RoundWatch {
 public:
  using Open = std::function<Result<std::unique_ptr<KeyWatch>>()>;
  // Without `open` every round is read.
  RoundWatch(Open open, const RoundKeys& keys);

  // Whether `round` is followed through pushes. The first call for a
  // round opens a new connection and registers `over` and `watched` (the
  // watched node's liveness keys) before the round is first read, so no
  // change falls between that read and the first push.
  bool Follow(int round, const std::vector<std::string>& watched);
  // Whether `round` is followed now.
  bool following(int round) const { return watch_ && round_ == round; }
  // The last round's pushes are of no use any more: its connection goes.
  void Close();

  // What the store pushed since the last Take.
  struct Pushed {
    bool read = false;  // the round must be read (`over` or a close
                        // changed, its first check, or the watch failed)
    std::string count;  // the watched node's latest counter, "" if none
    // The watched node's lease key as pushed: (value, deleted).
    std::vector<std::pair<std::string, bool>> lease;
  };
  // `counter`, `gone` and `alive` are the watched node's keys in `round`.
  Pushed Take(int round, const std::string& counter, const std::string& gone,
              const std::string& alive);

 private:
  void Drop(int round, const std::string& why);

  Open open_;
  const RoundKeys& keys_;
  std::unique_ptr<KeyWatch> watch_;
  int round_ = -1;      // the round the connection registered for
  int off_round_ = -1;  // a round whose watch failed: read instead
  bool read_due_ = false;
};

}  // namespace dtrun::rendezvous
