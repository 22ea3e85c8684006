#include "rendezvous/rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "rendezvous/log.h"
#include "rendezvous/memory_store.h"

namespace dtrun::rdzv {
namespace {

using Steady = std::chrono::steady_clock;

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool Contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

std::string JoinIds(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
  return out.empty() ? "none" : out;
}

}  // namespace

// The shared document. `raw` is the exact text read, for compare-and-set.
struct Rendezvous::State {
  int64_t version = 0;
  int round = 0;
  bool complete = false;
  std::vector<std::string> participants;  // join order; final order once complete
  std::map<std::string, int> fixed_rank;  // static backend: node -> --node-rank
  std::vector<std::string> waiting;       // want to join the next round
  std::vector<std::string> previous;      // order of the last completed round
  int64_t last_call_ms = 0;               // unix ms when the open round may close
  std::string closed;                     // "" open, "ok", or why it failed
  int failures = 0;
  int nproc = 0, max_restarts = -1;       // the job's settings (first joiner's)
  std::string raw;

  std::string Serialize() const {
    nlohmann::json j = {{"version", version},   {"round", round},
                        {"complete", complete}, {"participants", participants},
                        {"fixed_rank", fixed_rank}, {"waiting", waiting},
                        {"previous", previous}, {"last_call_ms", last_call_ms},
                        {"closed", closed},     {"failures", failures},
                        {"nproc", nproc},       {"max_restarts", max_restarts}};
    return j.dump();
  }
  static bool Parse(const std::string& text, State* s) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return false;
    try {
      s->version = j.at("version");
      s->round = j.at("round");
      s->complete = j.at("complete");
      s->participants = j.at("participants").get<std::vector<std::string>>();
      s->fixed_rank = j.at("fixed_rank").get<std::map<std::string, int>>();
      s->waiting = j.at("waiting").get<std::vector<std::string>>();
      s->previous = j.at("previous").get<std::vector<std::string>>();
      s->last_call_ms = j.at("last_call_ms");
      s->closed = j.at("closed");
      s->failures = j.at("failures");
      s->nproc = j.at("nproc");
      s->max_restarts = j.at("max_restarts");
    } catch (const nlohmann::json::exception&) {
      return false;
    }
    s->raw = text;
    return true;
  }
  // Everyone leaves; the next round opens.
  void NewRound() {
    ++round;
    complete = false;
    participants.clear();
    waiting.clear();
    last_call_ms = 0;
  }
  // Closes the open round: ranks by --node-rank (static), else nodes of the
  // previous round keep their order and newcomers follow in join order.
  void Complete() {
    std::vector<std::string> order = participants;
    if (!fixed_rank.empty()) {
      std::stable_sort(order.begin(), order.end(), [this](const auto& a, const auto& b) {
        return fixed_rank.at(a) < fixed_rank.at(b);
      });
    } else {
      std::stable_sort(order.begin(), order.end(), [this](const auto& a, const auto& b) {
        auto pa = std::find(previous.begin(), previous.end(), a);
        auto pb = std::find(previous.begin(), previous.end(), b);
        return pa < pb;
      });
    }
    participants = order;
    previous = order;
    complete = true;
  }
};

std::string MakeNodeId() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::mt19937 rng(std::random_device{}());
  return std::string(host) + "_" + std::to_string(getpid()) + "_" +
         std::to_string(rng() % 100000);
}

Rendezvous::Rendezvous(Store* store, RendezvousOptions options)
    : store_(store), opts_(std::move(options)) {}

std::string Rendezvous::Key(const std::string& suffix) const {
  return "rdzv/" + opts_.run_id + "/" + suffix;
}

Result<Rendezvous::State> Rendezvous::Read() {
  State fresh;
  auto got = store_->CompareSet(Key("state"), "", fresh.Serialize());
  if (!got.ok()) return got.status();
  State s;
  if (!State::Parse(*got, &s)) {
    return Status::Invalid("rendezvous state at key '" + Key("state") +
                           "' is not dtrun's; is another program using --rdzv-id " +
                           opts_.run_id + "?");
  }
  return s;
}

Result<Rendezvous::State> Rendezvous::Update(const std::function<bool(State&)>& mutate) {
  auto current = Read();
  if (!current.ok()) return current;
  State cur = *current;
  for (;;) {
    State next = cur;
    if (!mutate(next)) return cur;
    ++next.version;
    std::string text = next.Serialize();
    auto got = store_->CompareSet(Key("state"), cur.raw, text);
    if (!got.ok()) return got.status();
    if (*got == text) {
      next.raw = text;
      return next;
    }
    if (!State::Parse(*got, &cur)) return Status::Invalid("rendezvous state is corrupt");
  }
}

Status Rendezvous::Heartbeat(bool force) {
  auto now = Steady::now();
  if (!force && now - last_beat_ < opts_.keep_alive_interval) return Status::Ok();
  last_beat_ = now;
  return store_->Add(Key("hb/" + opts_.node_id), 1).status();
}

bool Rendezvous::JoinStep(State& s, int64_t now_ms) {
  const std::string& me = opts_.node_id;
  if (s.complete) {
    if (Contains(s.participants, me) || Contains(s.waiting, me)) return false;
    s.waiting.push_back(me);  // the running nodes will open a round for us
    return true;
  }
  int size = static_cast<int>(s.participants.size());
  if (!Contains(s.participants, me)) {
    if (size >= opts_.max_nodes) return false;
    s.participants.push_back(me);
    if (opts_.node_rank >= 0) s.fixed_rank[me] = opts_.node_rank;
    ++size;
    if (size >= opts_.min_nodes && s.last_call_ms == 0) {
      s.last_call_ms = now_ms + opts_.last_call_timeout.count();
    }
    if (size == opts_.max_nodes) s.Complete();
    return true;
  }
  if (size >= opts_.min_nodes && now_ms >= s.last_call_ms) {
    s.Complete();
    return true;
  }
  return false;
}

Result<Assignment> Rendezvous::Join(const std::function<bool()>& interrupted) {
  auto started = Steady::now();
  auto deadline = started + opts_.join_timeout;
  seen_.clear();
  const std::string& me = opts_.node_id;
  for (;;) {
    if (interrupted && interrupted()) return Status::Canceled("rendezvous interrupted");
    auto state = Update([&](State& s) {
      if (!s.closed.empty()) return false;
      if (s.nproc == 0) {
        s.nproc = opts_.nproc_per_node;
        s.max_restarts = opts_.max_restarts;
      } else if (s.nproc != opts_.nproc_per_node || s.max_restarts != opts_.max_restarts) {
        s.closed = "node " + me + " has --nproc-per-node=" + std::to_string(opts_.nproc_per_node) +
                   " --max-restarts=" + std::to_string(opts_.max_restarts) +
                   " but the job runs with --nproc-per-node=" + std::to_string(s.nproc) +
                   " --max-restarts=" + std::to_string(s.max_restarts) +
                   "; every node must pass the same values";
        return true;
      }
      for (const auto& [node, rank] : s.fixed_rank) {
        if (rank == opts_.node_rank && node != me && Contains(s.participants, node)) {
          s.closed = "two nodes claim --node-rank=" + std::to_string(rank) + " (" + node +
                     " and " + me + "); give each node its own rank";
          return true;
        }
      }
      return JoinStep(s, UnixMillis());
    });
    if (!state.ok()) return state.status();
    const State& s = *state;
    last_participants_ = s.participants;
    if (!s.closed.empty()) {
      closed_reason_ = s.closed;
      if (s.closed == "ok") {
        return Status::Unavailable("rendezvous '" + opts_.run_id +
                                   "' belongs to a job that already finished; use a new --rdzv-id");
      }
      return Status::Invalid(s.closed);
    }
    if (s.complete && Contains(s.participants, me)) {
      Assignment a;
      a.round = s.round;
      a.failures = s.failures;
      a.nodes = s.participants;
      a.group_world_size = static_cast<int>(s.participants.size());
      a.group_rank = static_cast<int>(
          std::find(s.participants.begin(), s.participants.end(), me) - s.participants.begin());
      a.world_size = a.group_world_size * opts_.nproc_per_node;
      a.base_rank = a.group_rank * opts_.nproc_per_node;
      Heartbeat(true);
      return a;
    }
    Heartbeat(false);
    if (Steady::now() >= deadline) {
      return Status::Timeout(
          "rendezvous '" + opts_.run_id + "' round " + std::to_string(s.round) +
          " timed out after " + DescribeSeconds(Steady::now() - started) + ": " +
          std::to_string(s.participants.size()) + " of min " + std::to_string(opts_.min_nodes) +
          " nodes joined (" + JoinIds(s.participants) +
          "); check --nnodes, that every node uses the same --rdzv-id, and that all reach the "
          "endpoint");
    }
    std::this_thread::sleep_for(opts_.poll_interval);
  }
}

std::string Rendezvous::DescribeParticipants() const { return JoinIds(last_participants_); }

Result<RoundEvent> Rendezvous::Check(const Assignment& current) {
  Status beat = Heartbeat(false);
  if (!beat.ok()) return beat;
  auto state = Read();
  if (!state.ok()) return state.status();
  const State& s = *state;
  if (s.closed == "ok") return RoundEvent::kAllDone;
  if (!s.closed.empty()) {
    closed_reason_ = s.closed;
    return RoundEvent::kClosed;
  }
  if (s.round != current.round) return RoundEvent::kRestart;
  auto bump = [&](const std::string& why) -> Result<RoundEvent> {
    auto updated = Update([&](State& st) {
      if (st.round != current.round || !st.closed.empty()) return false;
      st.NewRound();
      return true;
    });
    if (!updated.ok()) return updated.status();
    Logger("dtrun.rdzv")->warn("starting round {}: {}", current.round + 1, why);
    return RoundEvent::kRestart;
  };
  if (!s.waiting.empty() && static_cast<int>(current.nodes.size()) < opts_.max_nodes) {
    return bump(std::to_string(s.waiting.size()) + " node(s) waiting to join (" +
                JoinIds(s.waiting) + ")");
  }
  auto done = store_->Add(Key("round/" + std::to_string(current.round) + "/done"), 0);
  if (!done.ok()) return done.status();
  if (*done >= static_cast<int64_t>(current.nodes.size())) {
    auto closed = Update([](State& st) {
      if (!st.closed.empty()) return false;
      st.closed = "ok";
      return true;
    });
    if (!closed.ok()) return closed.status();
    return RoundEvent::kAllDone;
  }
  auto now = Steady::now();
  auto limit = opts_.keep_alive_interval * opts_.keep_alive_max_attempt;
  for (const auto& node : current.nodes) {
    if (node == opts_.node_id) continue;
    auto count = store_->Add(Key("hb/" + node), 0);
    if (!count.ok()) return count.status();
    auto it = seen_.find(node);
    if (it == seen_.end() || it->second.first != *count) {
      seen_[node] = {*count, now};
    } else if (now - it->second.second > limit) {
      return bump("node " + node + " sent no heartbeat for " +
                  DescribeSeconds(now - it->second.second) + "; declared dead");
    }
  }
  return RoundEvent::kNone;
}

Result<int> Rendezvous::ReportFailure(const Assignment& current, const std::string& why) {
  auto state = Update([&](State& s) {
    if (s.round != current.round || !s.closed.empty()) return false;
    ++s.failures;
    if (s.failures > s.max_restarts) {
      s.closed = "workers failed on node " + opts_.node_id + " (" + why + ") after " +
                 std::to_string(s.max_restarts) + " restart(s)";
    } else {
      s.NewRound();
    }
    return true;
  });
  if (!state.ok()) return state.status();
  closed_reason_ = state->closed;
  return state->failures;
}

Status Rendezvous::AckEnd(const Assignment& current) {
  return store_->Add(Key("round/" + std::to_string(current.round) + "/ended"), 1).status();
}

bool Rendezvous::AllEnded(const Assignment& current) {
  auto n = store_->Add(Key("round/" + std::to_string(current.round) + "/ended"), 0);
  return n.ok() && *n >= static_cast<int64_t>(current.nodes.size());
}

Status Rendezvous::MarkDone(const Assignment& current) {
  return store_->Add(Key("round/" + std::to_string(current.round) + "/done"), 1).status();
}

}  // namespace dtrun::rdzv
