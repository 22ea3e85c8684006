#include "apps/dtrun/hang_report.h"

#include <cstdio>
#include <sstream>

namespace dtrun::agent {
namespace {

std::string Trim(const std::string& line) {
  size_t a = line.find_first_not_of(" \t");
  size_t b = line.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : line.substr(a, b - a + 1);
}

bool IsFrame(const std::string& trimmed) {
  return trimmed.rfind("File \"", 0) == 0 ||
         (trimmed.size() > 1 && trimmed[0] == '#' && trimmed[1] >= '0' && trimmed[1] <= '9');
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f s", s);
  return buf;
}

std::string State(const RankSilence& s) {
  if (s.exited) return "exited before the hang was declared";
  std::string out = s.hung ? "hung" : "waiting";
  out += s.beaten ? ": no heartbeat for " : ": no heartbeat yet, after ";
  out += Seconds(s.silent_s);
  if (s.step >= 0) out += ", last step " + std::to_string(s.step);
  return out;
}

}  // namespace

std::string ExtractFaulthandlerDump(const std::string& text) {
  size_t at = text.rfind("Fatal Python error:");
  return at == std::string::npos ? "" : text.substr(at);
}

std::vector<std::string> FirstFrames(const std::string& stack, size_t n) {
  size_t from = stack.find("Current thread");
  std::istringstream in(from == std::string::npos ? stack : stack.substr(from));
  std::vector<std::string> out;
  std::string line;
  bool seen = false;
  while (out.size() < n && std::getline(in, line)) {
    std::string t = Trim(line);
    if (IsFrame(t)) {
      out.push_back(t);
      seen = true;
    } else if (seen && !t.empty() && t[0] != '.') {
      break;  // the first thread ended
    }
  }
  return out;
}

std::string HangTraceback(const RankStack& r, size_t frames) {
  std::string out = State(r.silence);
  for (const std::string& f : FirstFrames(r.stack, frames)) out += "\n  " + f;
  if (!r.stack_file.empty()) out += "\nwhole stack: " + r.stack_file;
  if (!r.why_no_stack.empty()) out += "\nno stack: " + r.why_no_stack;
  return out;
}

std::string FormatHangReport(const std::vector<RankStack>& ranks, double timeout_s, int attempt,
                             size_t frames) {
  std::vector<RankSilence> silences;
  for (const RankStack& r : ranks) silences.push_back(r.silence);
  size_t root = HangRootCause(silences);
  const std::string rule(60, '='), thin(60, '-');
  std::ostringstream o;
  o << rule << "\nHANG on attempt " << attempt << ": no heartbeat within --hang-timeout="
    << Seconds(timeout_s) << "\n" << thin << "\n";
  auto block = [&](const RankStack& r, const char* label) {
    o << label << "rank " << r.rank << " (local_rank: " << r.silence.local_rank
      << ", pid: " << r.pid << ")\n  ";
    std::string text = HangTraceback(r, frames);
    for (char c : text) o << c << (c == '\n' ? "  " : "");
    o << "\n";
  };
  block(ranks[root], "Root cause (stopped first / lowest step): ");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i != root) block(ranks[i], "");
  }
  o << rule << "\n";
  return o.str();
}

}  // namespace dtrun::agent
