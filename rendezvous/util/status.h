#pragma once

#include <optional>
#include <string>
#include <utility>

namespace dtrun {

// Outcome of an operation that can fail for expected reasons (timeouts,
// closed peers, malformed input). Cheap to copy; ok() carries no message.
class Status {
 public:
  enum class Code { kOk, kTimeout, kUnavailable, kInvalid, kIo, kCanceled };

  Status() = default;
  static Status Ok() { return Status(); }
  static Status Timeout(std::string msg) {
    return {Code::kTimeout, std::move(msg)};
  }
  // The peer could not be reached or went away.
  static Status Unavailable(std::string msg) {
    return {Code::kUnavailable, std::move(msg)};
  }
  // Malformed input from a user or the network.
  static Status Invalid(std::string msg) {
    return {Code::kInvalid, std::move(msg)};
  }
  static Status Io(std::string msg) { return {Code::kIo, std::move(msg)}; }
  static Status Canceled(std::string msg) {
    return {Code::kCanceled, std::move(msg)};
  }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

 private:
  Status(Code code, std::string msg) : code_(code), message_(std::move(msg)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

// A value or the Status explaining why there is none.
template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  // REQUIRES: ok().
  T& value() { return *value_; }
  const T& value() const { return *value_; }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }
  T* operator->() { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace dtrun
