#pragma once

// One line to a dtrun logger, for code that must not see spdlog's headers:
// lib/'s translation units include torch, and pip's torch wheels put an fmt
// of their own first on the include path, which spdlog's headers then build
// against and fail on. The line goes through Logger() (log.h) in
// rendezvous/util/log.cc, which no torch header reaches.

#include <string>

namespace dtrun {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

// Writes `text` at `level` to the logger of `component` ("dtrun.ddp").
void LogLine(const std::string& component, LogLevel level,
             const std::string& text);

}  // namespace dtrun
