// The round's rules as pure functions of the store's replies and the time.
// The protocol itself (which node writes which key when) is described at
// the top of rendezvous.cc; this file decides, rendezvous.cc talks.

#include "rendezvous/round_state.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <set>
#include <sstream>
#include <tuple>

#include "rendezvous/store_keys.h"

#include <nlohmann/json.hpp>

#include "rendezvous/store_state.h"
#include "rendezvous/util/check.h"

namespace dtrun::rendezvous {
namespace {

int64_t ToInt(const std::string& text, int64_t fallback) {
  int64_t v = 0;
  return ParseCounter(text, &v) ? v : fallback;
}

constexpr struct {
  EndReason reason;
  const char* name;
} kEndReasonNames[] = {
    {EndReason::kNone, "none"},
    {EndReason::kSucceeded, "succeeded"},
    {EndReason::kWorkersFailed, "workers_failed"},
    {EndReason::kConfigMismatch, "config_mismatch"},
    {EndReason::kDuplicateNodeRank, "duplicate_node_rank"},
    {EndReason::kForeignState, "foreign_state"},
    {EndReason::kNoProgress, "no_progress"},
};

// A closed record from a dtrun that wrote no "end": the reason is read from
// the message, whose wording those versions never changed.
EndReason EndReasonOfMessage(const std::string& closed) {
  if (closed.empty()) return EndReason::kNone;
  if (closed == "ok") return EndReason::kSucceeded;
  if (closed.rfind("workers failed", 0) == 0) return EndReason::kWorkersFailed;
  if (closed.rfind("two nodes claim", 0) == 0)
    return EndReason::kDuplicateNodeRank;
  return EndReason::kConfigMismatch;
}

// Whether the c10d nodes' --node-rank preferences decide the order: every
// node gave one, and no two the same.
bool PreferencesDecide(const std::vector<std::string>& prefs) {
  std::set<int64_t> seen;
  for (const std::string& p : prefs) {
    int64_t rank = ToInt(p, -1);
    if (rank < 0 || !seen.insert(rank).second) return false;
  }
  return !prefs.empty();
}

}  // namespace

const char* EndReasonName(EndReason reason) {
  for (const auto& entry : kEndReasonNames) {
    if (entry.reason == reason) return entry.name;
  }
  DTRUN_CHECK(false) << "EndReason " << static_cast<int>(reason)
                     << " has no name";
  return "";
}

bool ParseEndReason(const std::string& name, EndReason* reason) {
  for (const auto& entry : kEndReasonNames) {
    if (name == entry.name) {
      *reason = entry.reason;
      return true;
    }
  }
  return false;
}

void StateDoc::Close(EndReason reason, std::string why) {
  DTRUN_CHECK(reason != EndReason::kNone && !why.empty())
      << "closing with no reason";
  end = reason;
  closed = std::move(why);
}

std::string StateDoc::Serialize() const {
  nlohmann::json j{{"round", round},
                   {"failures", failures},
                   {"closed", closed},
                   {"end", EndReasonName(end)}};
  if (expect > 0) j["expect"] = expect;
  return j.dump();
}

bool StateDoc::Parse(const std::string& text, StateDoc* d) {
  if (text.empty()) {  // nobody wrote one yet: round 0, open
    *d = StateDoc();
    return true;
  }
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  try {
    d->round = j.at("round");
    d->failures = j.at("failures");
    d->closed = j.at("closed");
  } catch (const nlohmann::json::exception&) {
    return false;
  }
  // "end" is missing in records of older versions and may name a reason
  // this version does not know: the message then decides.
  auto end = j.find("end");
  bool named =
      end != j.end() && end->is_string() && ParseEndReason(*end, &d->end);
  if (d->closed.empty()) {
    d->end = EndReason::kNone;
  } else if (!named || d->end == EndReason::kNone) {
    d->end = EndReasonOfMessage(d->closed);
  }
  // "expect" is missing in records of older versions: not known.
  auto expect = j.find("expect");
  d->expect =
      expect != j.end() && expect->is_number_integer() ? expect->get<int>() : 0;
  d->raw = text;
  return true;
}

std::string RoundKeys::Job(const std::string& suffix) const {
  return keys::JobPrefix(run_id_) + suffix;
}

std::string RoundKeys::Round(int round, const std::string& suffix) const {
  return keys::RoundKey(run_id_, round, suffix);
}

std::string RoundKeys::Round(int round, const std::string& name,
                             int64_t index) const {
  return Round(round, name + "/" + std::to_string(index));
}

namespace {

// "<id>@<ms> <id>@<ms> ..." -> (id, ms), oldest first.
std::vector<std::pair<std::string, int64_t>> ParseRunIds(
    const std::string& list) {
  std::vector<std::pair<std::string, int64_t>> out;
  std::istringstream in(list);
  std::string word;
  while (in >> word) {
    size_t at = word.rfind('@');
    if (at == std::string::npos || at == 0) continue;
    out.emplace_back(word.substr(0, at),
                     std::strtoll(word.c_str() + at + 1, nullptr, 10));
  }
  return out;
}

}  // namespace

std::string RunIdsWith(const std::string& list, const std::string& run_id,
                       int64_t now_ms, size_t keep) {
  auto ids = ParseRunIds(list);
  ids.erase(std::remove_if(ids.begin(), ids.end(),
                           [&](const auto& e) { return e.first == run_id; }),
            ids.end());
  ids.emplace_back(run_id, now_ms);
  if (ids.size() > keep) ids.erase(ids.begin(), ids.end() - keep);
  std::string out;
  for (const auto& [id, ms] : ids)
    out += (out.empty() ? "" : " ") + id + "@" + std::to_string(ms);
  return out;
}

std::string RunIdsWithout(const std::string& list, const std::string& run_id) {
  std::string out;
  for (const auto& [id, ms] : ParseRunIds(list)) {
    if (id != run_id)
      out += (out.empty() ? "" : " ") + id + "@" + std::to_string(ms);
  }
  return out;
}

std::vector<std::pair<std::string, int64_t>> OtherRunIds(
    const std::string& list, const std::string& run_id, int64_t since_ms) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& e : ParseRunIds(list)) {
    if (e.first != run_id && e.second >= since_ms) out.push_back(e);
  }
  return out;
}

std::string NodeRecord(int64_t hint, const std::string& node_id) {
  return std::to_string(hint) + " " + node_id;
}

std::string JoinRecord::Text() const {
  return std::to_string(hint) + " " + std::to_string(preferred) + " " +
         std::to_string(nproc) + " " + std::to_string(max_restarts) + " " +
         node_id;
}

bool JoinRecord::Parse(const std::string& text, JoinRecord* r) {
  std::istringstream in(text);
  in >> r->hint >> r->preferred >> r->nproc >> r->max_restarts >> r->node_id;
  return !in.fail() && !r->node_id.empty();
}

std::string JoinRecord::Settings() const {
  return "--nproc-per-node=" + std::to_string(nproc) +
         " --max-restarts=" + std::to_string(max_restarts);
}

// A reconnect closes one connection and binds the next: gone only when
// the closes have caught up with the binds (the first one implied).
bool GoneOf(const std::string& closes, const std::string& rebinds) {
  const int64_t c = ToInt(closes, 0), b = ToInt(rebinds, 0);
  return c > 0 && c >= 1 + b;
}

void SplitRecord(const std::string& text, int64_t* number, std::string* rest) {
  auto space = text.find(' ');
  *number = ToInt(text.substr(0, space), -1);
  *rest = space == std::string::npos ? "" : text.substr(space + 1);
}

// Every node computes nothing here but the closer: one sort of the joiners
// by (hint, slot), whose result it writes for all. Each node then reads
// only its own rank record, so the order needs no agreement beyond the
// store's replies the closer read.
RankTable OrderRanks(const std::vector<std::string>& node_records,
                     const std::vector<std::string>& preferences) {
  const int count = static_cast<int>(node_records.size());
  RankTable table;
  table.by_preference = PreferencesDecide(preferences);
  std::vector<std::tuple<int64_t, int, std::string>> order;  // hint, slot, id
  for (int slot = 1; slot <= count; ++slot) {
    int64_t hint = 0;
    std::string id;
    SplitRecord(node_records[slot - 1], &hint, &id);
    if (table.by_preference) hint = ToInt(preferences[slot - 1], -1);
    order.emplace_back(hint < 0 ? INT64_MAX : hint, slot, id);
  }
  // Hint, then slot: the slot breaks ties and orders newcomers (hint -1
  // sorts last as INT64_MAX).
  std::sort(order.begin(), order.end());
  table.by_slot.resize(count);
  for (int g = 0; g < count; ++g) {
    RankEntry& entry = table.by_slot[std::get<1>(order[g]) - 1];
    entry.rank = g;
    if (count > 1) {
      entry.next_node = std::get<2>(order[(g + 1) % count]);
      entry.next_slot = std::get<1>(order[(g + 1) % count]);
    }
  }
  return table;
}

std::string RankRecord(const RankEntry& entry) {
  return std::to_string(entry.rank) + " " + entry.next_node + " " +
         std::to_string(entry.next_slot);
}

int64_t RankPackOf(int64_t slot) { return (slot - 1) / kRanksPerKey; }

std::vector<std::string> PackRankRecords(const RankTable& table) {
  std::vector<std::string> packs;
  for (size_t i = 0; i < table.by_slot.size(); ++i) {
    if (i % kRanksPerKey == 0) packs.emplace_back();
    packs.back() += RankRecord(table.by_slot[i]) + "\n";
  }
  return packs;
}

std::string RecordInPack(const std::string& pack, int64_t slot) {
  size_t at = 0;
  for (int64_t line = (slot - 1) % kRanksPerKey; line > 0; --line) {
    at = pack.find('\n', at);
    if (at == std::string::npos) return "";
    ++at;
  }
  const size_t end = pack.find('\n', at);
  return end == std::string::npos ? "" : pack.substr(at, end - at);
}

// A joiner's view once `final` is read: the closer's count says whether its
// slot made it in (slots past the count queue for the next round), and its
// rank record where. World size and base rank follow from the node count,
// since every node runs the same number of workers (the config check).
Placement PlaceInRound(const StateDoc& doc, int64_t slot,
                       const std::string& final_value,
                       const std::string& rank_record, int nproc_per_node,
                       Assignment* a) {
  // "-": the job closed before the round did.
  if (final_value.empty() || final_value == "-") return Placement::kOpen;
  int64_t count = ToInt(final_value, 0);
  if (slot > count) return Placement::kLeftOut;
  int64_t rank = 0;
  std::string next;
  SplitRecord(rank_record, &rank, &next);
  // "<next node> <its slot>"; a record without the slot names the node only.
  const size_t space = next.rfind(' ');
  a->next_node = next.substr(0, space);
  a->next_slot =
      space == std::string::npos ? 0 : ToInt(next.substr(space + 1), 0);
  a->round = doc.round;
  a->failures = doc.failures;
  a->group_world_size = static_cast<int>(count);
  a->group_rank = static_cast<int>(rank);
  a->world_size = a->group_world_size * nproc_per_node;
  a->base_rank = a->group_rank * nproc_per_node;
  return Placement::kAssigned;
}

// The node in the last slot closes at once; any other only after the
// shared deadline, and only once: after its try, the closing key decides
// whether it or another node closed the round.
bool LastCall::MayClose(int64_t now_unix_ms) const {
  if (close_tried) return false;
  return slot == max_nodes || (expect > 0 && slot >= expect) ||
         (deadline_ms > 0 && now_unix_ms >= deadline_ms);
}

std::chrono::milliseconds LastCall::WaitStep(
    std::chrono::milliseconds poll, int64_t now_unix_ms, bool in_round,
    std::chrono::milliseconds left) const {
  using std::chrono::milliseconds;
  milliseconds step = poll;
  if (deadline_ms > 0 && in_round && !close_tried) {
    step = std::min(
        step, milliseconds(std::max<int64_t>(1, deadline_ms - now_unix_ms)));
  }
  return std::max(std::min(step, left), milliseconds(1));
}

std::optional<std::chrono::steady_clock::duration> HeartbeatWatch::Observe(
    int round, const std::string& count, TimePoint now,
    std::chrono::steady_clock::duration limit) {
  if (round_ != round || count_ != count) {
    round_ = round;
    count_ = count;
    since_ = now;
    return std::nullopt;
  }
  if (now - since_ > limit) return now - since_;
  return std::nullopt;
}

bool BeatTimer::Due(TimePoint now, std::chrono::steady_clock::duration interval,
                    bool force) {
  if (!force && now - last_ < interval) return false;
  last_ = now;
  return true;
}

}  // namespace dtrun::rendezvous
