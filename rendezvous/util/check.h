#pragma once

// DTRUN_CHECK(cond) << context: aborts with the file, line, condition and
// context when an invariant of the program is broken (ninja's Fatal, gloo's
// GLOO_ENFORCE). Never for input from the network or the user: those are
// Status values with a message that says what to do.

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace dtrun::internal {

// Collects the context of one failed check and aborts when destroyed, at
// the end of the DTRUN_CHECK statement.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition) {
    out_ << file << ":" << line << ": check failed: " << condition << ": ";
  }
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  ~CheckFailure() {
    out_ << "\n";
    std::fputs(out_.str().c_str(), stderr);
    std::fflush(stderr);
    std::abort();
  }
  template <typename T>
  CheckFailure& operator<<(const T& value) {
    out_ << value;
    return *this;
  }

 private:
  std::ostringstream out_;
};

}  // namespace dtrun::internal

// The `while` keeps the macro one statement and evaluates `cond` once; the
// stream is only built when the check fails.
#define DTRUN_CHECK(cond) \
  while (!(cond)) ::dtrun::internal::CheckFailure(__FILE__, __LINE__, #cond)
