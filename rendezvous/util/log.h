#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace dtrun {

// The logger of one component ("dtrun.store", "dtrun.agent", ...), writing to
// stderr. Created on first use; thread-safe.
std::shared_ptr<spdlog::logger> Logger(const std::string& name);

// Sets every dtrun logger's level from a name (trace, debug, info, warn,
// error, off). An empty `level` falls back to $DTRUN_LOG_LEVEL, then info.
// Returns false for an unknown name.
bool SetLogLevel(const std::string& level);

}  // namespace dtrun
