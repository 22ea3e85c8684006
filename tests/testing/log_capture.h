#pragma once

#include <mutex>
#include <string>

#include <spdlog/sinks/base_sink.h>

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

}  // namespace dtrun::testing
