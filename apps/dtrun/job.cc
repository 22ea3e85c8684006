// What both jobs share with the interactive console: the crash record it
// reads from the store. The jobs themselves live in single_node_job.cc and
// elastic_job.cc; this file holds only the store side of that contract.
#include "apps/dtrun/job.h"

#include <nlohmann/json.hpp>

#include "apps/dtrun/interactive_protocol.h"

#include "rendezvous/store_client.h"

namespace dtrun::agent {

Status PublishCrash(rendezvous::Store* store, const std::string& prefix,
                    const WorkerCrash& crash, int64_t count) {
  // JSON rather than several keys: the console reads one consistent record
  // with a single GET, even while the next crash is being published.
  nlohmann::json j = {{"attempt", crash.attempt},
                      {"rank", crash.rank},
                      {"how", crash.how},
                      {"host", crash.host},
                      {"addr", crash.addr},
                      {"stderr_file", crash.stderr_file},
                      {"stderr_tail", crash.stderr_tail}};
  // The record before the count: a console that sees the count finds it.
  // The count is SET, not ADDed: the job keeps it and publishes both again
  // after clearing the store for a new attempt, which must not count twice.
  Status s = store->Set(prefix + interactive_protocol::kCrash, j.dump());
  if (s.ok())
    s = store->Set(prefix + interactive_protocol::kCrashCount,
                   std::to_string(count));
  return s;
}

}  // namespace dtrun::agent
