#pragma once

#include <map>
#include <string>

#include "rendezvous/util/status.h"

namespace dtrun::train {

// The distributed environment a launcher (dtrun or torchrun) gives a worker.
struct DistEnv {
  int rank = 0;              // RANK
  int world_size = 1;        // WORLD_SIZE
  int local_rank = 0;        // LOCAL_RANK (default 0)
  int local_world_size = 1;  // LOCAL_WORLD_SIZE (default 1)
  std::string master_addr;   // MASTER_ADDR
  int master_port = 0;       // MASTER_PORT
  int restart_count = 0;     // TORCHELASTIC_RESTART_COUNT (default 0)
  std::string run_id;        // TORCHELASTIC_RUN_ID (default "none")
};

// Reads the worker environment. Pure: takes the variables as a map. Missing
// or malformed variables give Status::Invalid naming them and saying to run
// under dtrun/torchrun.
Result<DistEnv> ReadDistEnv(const std::map<std::string, std::string>& env);

// torchrun's worker error file (its @record format): `{"message":
// {"message": "<type>: <message>", "extraInfo": {"py_callstack": "",
// "timestamp": "<unix seconds>"}}}`, written to `path`, so that the
// launcher's failure summary (dtrun's or torchrun's) shows why the worker
// failed. A worker passes $TORCHELASTIC_ERROR_FILE; empty: nothing written.
// Returns whether it was written.
bool WriteWorkerErrorFile(const std::string& path, const std::string& type,
                          const std::string& message);

}  // namespace dtrun::train
