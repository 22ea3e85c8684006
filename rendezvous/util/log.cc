// spdlog underneath: one logger per component, all to stderr through the
// console, so log lines and the progress line never interleave.
#include "rendezvous/util/log.h"

#include <cstdlib>
#include <mutex>

#include <spdlog/sinks/base_sink.h>

#include "rendezvous/util/console.h"
#include "rendezvous/util/log_line.h"

namespace dtrun {
namespace {

// Loggers are made lazily by whichever thread logs first; g_mu makes the
// get-or-create and the level read one step. DTRUN_LOG_LEVEL is read on
// first use, not at startup, so tests that set it before logging work.
std::mutex g_mu;
spdlog::level::level_enum g_level = spdlog::level::info;
bool g_level_set = false;

// stderr through the console, so that log lines and a status line on the
// terminal never mix (console.h).
class ConsoleSink : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    console::Write(2, std::string_view(line.data(), line.size()));
  }
  void flush_() override {}  // Write leaves nothing buffered
};

}  // namespace

std::shared_ptr<spdlog::logger> Logger(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (auto existing = spdlog::get(name)) return existing;
  if (!g_level_set) {
    const char* env = std::getenv("DTRUN_LOG_LEVEL");
    if (env && *env) {
      // from_str answers "off" for names it does not know: keep info then.
      auto level = spdlog::level::from_str(env);
      if (level != spdlog::level::off || std::string(env) == "off")
        g_level = level;
    }
    g_level_set = true;
  }
  auto logger =
      std::make_shared<spdlog::logger>(name, std::make_shared<ConsoleSink>());
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] [%n] %v");
  logger->set_level(g_level);
  // Flush every line: the launcher may be killed, and its last lines are
  // the ones that say why.
  logger->flush_on(spdlog::level::trace);
  spdlog::register_logger(logger);
  return logger;
}

bool SetLogLevel(const std::string& level) {
  std::string name = level;
  if (name.empty()) {
    const char* env = std::getenv("DTRUN_LOG_LEVEL");
    name = env && *env ? env : "info";
  }
  auto parsed = spdlog::level::from_str(name);
  if (parsed == spdlog::level::off && name != "off") return false;
  std::lock_guard<std::mutex> lock(g_mu);
  g_level = parsed;
  g_level_set = true;
  spdlog::apply_all(
      [parsed](std::shared_ptr<spdlog::logger> l) { l->set_level(parsed); });
  return true;
}

void LogLine(const std::string& component, LogLevel level,
             const std::string& text) {
  auto logger = Logger(component);
  switch (level) {
    case LogLevel::kDebug:
      logger->debug("{}", text);
      break;
    case LogLevel::kInfo:
      logger->info("{}", text);
      break;
    case LogLevel::kWarn:
      logger->warn("{}", text);
      break;
    case LogLevel::kError:
      logger->error("{}", text);
      break;
  }
}

}  // namespace dtrun
