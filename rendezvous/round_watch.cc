// Push mode (round_watch.h). Reading the state and the next node's counter
// on every check costs the store one request per node twice a second:
// 8,000 a second at 4,096 nodes, most of its load. Instead each node keeps
// one more connection on which the store pushes the changes that matter.
// Pushes come in order on one TCP connection, so none is lost while the
// connection stands; a failed connection sends this node back to reading.
#include "rendezvous/round_watch.h"

#include "rendezvous/util/log.h"

namespace dtrun::rendezvous {

RoundWatch::RoundWatch(Open open, const RoundKeys& keys)
    : open_(std::move(open)), keys_(keys) {}

bool RoundWatch::Follow(int round, const std::vector<std::string>& watched) {
  if (!open_ || off_round_ == round) return false;
  if (following(round)) return true;
  // A new connection per round: the old one's registrations go with it.
  Close();
  auto opened = open_();
  if (!opened.ok()) {
    Drop(round, opened.status().message());
    return false;
  }
  watch_ = std::move(*opened);
  std::vector<std::string> keys = {keys_.Round(round, "over")};
  keys.insert(keys.end(), watched.begin(), watched.end());
  Status s = watch_->WatchKeys(keys);
  if (!s.ok()) {
    Drop(round, s.message());
    return false;
  }
  round_ = round;
  read_due_ = true;
  return true;
}

void RoundWatch::Close() {
  watch_.reset();
  round_ = -1;
}

RoundWatch::Pushed RoundWatch::Take(int round, const std::string& counter,
                                    const std::string& gone,
                                    const std::string& alive) {
  Pushed out;
  std::vector<KeyChange> changes;
  Status s = watch_->TakeChanges(&changes);
  if (!s.ok()) {
    Drop(round, s.message());
    out.read = true;
    return out;
  }
  const std::string over = keys_.Round(round, "over");
  // The round's first check reads it whatever came: the pushes only say
  // what changed after the registration.
  out.read = read_due_;
  read_due_ = false;
  for (const auto& c : changes) {
    const bool deleted = c.kind == KeyChange::Kind::kDeleted;
    if (c.key == alive) {
      out.lease.emplace_back(c.value, deleted);
    } else if (c.key == over || c.key == gone) {
      out.read = true;  // a close: read whether every bound connection closed
    } else if (c.key == counter && !deleted) {
      out.count = c.value;
    }
  }
  return out;
}

void RoundWatch::Drop(int round, const std::string& why) {
  Close();
  off_round_ = round;
  Logger("dtrun.rdzv")
      ->warn(
          "round {}: the store pushes no changes here ({}); reading the "
          "round on every check instead",
          round, why);
}

}  // namespace dtrun::rendezvous
