#include "apps/dtrun/http_request.h"

namespace dtrun::agent {
namespace {

bool IsToken(std::string_view s) {
  if (s.empty() || s.size() > 16) return false;
  for (char c : s) {
    if (c < 'A' || c > 'Z') return false;
  }
  return true;
}

}  // namespace

// The head ends at the first blank line ("\r\n\r\n", or "\n\n" from a
// lenient client); the request line is the head's first line.
HttpRequest ParseHttpRequest(std::string_view bytes) {
  HttpRequest r;
  size_t end = bytes.find("\r\n\r\n");
  if (end == std::string_view::npos) end = bytes.find("\n\n");
  if (end == std::string_view::npos || end > kMaxRequestHead) {
    if (bytes.size() > kMaxRequestHead)
      r.state = HttpRequest::State::kMalformed;
    return r;
  }
  std::string_view line = bytes.substr(0, bytes.find('\n'));
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  r.state = HttpRequest::State::kMalformed;
  const size_t a = line.find(' ');
  const size_t b = a == std::string_view::npos ? a : line.find(' ', a + 1);
  if (b == std::string_view::npos) return r;
  std::string_view method = line.substr(0, a);
  std::string_view target = line.substr(a + 1, b - a - 1);
  std::string_view version = line.substr(b + 1);
  if (!IsToken(method) || target.empty() || target[0] != '/' ||
      version.substr(0, 5) != "HTTP/" || version.size() != 8) {
    return r;
  }
  r.method = std::string(method);
  r.path = std::string(target.substr(0, target.find('?')));
  r.state = HttpRequest::State::kComplete;
  return r;
}

}  // namespace dtrun::agent
