#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>

#include <spdlog/sinks/base_sink.h>

#include "rendezvous/util/log.h"

namespace dtrun::testing {

// spdlog sink that keeps every formatted line; Text() may be called from any
// thread while others log.
class LogCapture : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::string Text() {
    std::lock_guard<std::mutex> lock(mutex_);
    return text_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    text_.append(formatted.data(), formatted.size());
  }
  void flush_() override {}

 private:
  std::string text_;
};

// Captures what one component logs while it lives (a test fixture's
// member): attached to Logger(name) when made, detached when destroyed.
class ScopedLogCapture {
 public:
  explicit ScopedLogCapture(const std::string& name)
      : logger_(Logger(name)), sink_(std::make_shared<LogCapture>()) {
    logger_->sinks().push_back(sink_);
  }
  ~ScopedLogCapture() {
    auto& sinks = logger_->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  ScopedLogCapture(const ScopedLogCapture&) = delete;
  ScopedLogCapture& operator=(const ScopedLogCapture&) = delete;

  std::string Text() { return sink_->Text(); }

 private:
  std::shared_ptr<spdlog::logger> logger_;
  std::shared_ptr<LogCapture> sink_;
};

}  // namespace dtrun::testing
