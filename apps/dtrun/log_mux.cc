// Worker output plumbing: pipe bytes become whole lines, each written to its
// log file and (prefixed) to the console with one write(2). Shell code driven
// by the agent's poll loop; LineSplitter is the pure part.
#include "apps/dtrun/log_mux.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "rendezvous/util/console.h"
#include "rendezvous/util/log.h"

namespace dtrun::agent {

void LineSplitter::Feed(std::string_view data, const Emit& emit) {
  // The common case, a read holding whole lines, emits views into `data`
  // without copying; only a line split across reads goes through partial_.
  size_t start = 0;
  for (size_t nl = data.find('\n'); nl != std::string_view::npos;
       nl = data.find('\n', start)) {
    if (partial_.empty()) {
      emit(data.substr(start, nl - start));
    } else {
      partial_.append(data.substr(start, nl - start));
      emit(partial_);
      partial_.clear();
    }
    start = nl + 1;
  }
  partial_.append(data.substr(start));
}

void LineSplitter::Flush(const Emit& emit) {
  if (partial_.empty()) return;
  emit(partial_);
  partial_.clear();
}

void WriteAll(int fd, std::string_view data) { console::Write(fd, data); }

LogMux::~LogMux() { CloseAll(); }

void LogMux::Add(int fd, const StreamRoute& route) {
  streams_[fd].route = route;
  if (!route.file_error.empty())
    FileFailed(streams_[fd].route, route.file_error);
}

void LogMux::FileFailed(StreamRoute& route, const std::string& why) {
  std::string what = route.file_path + ": " + why;
  file_errors_.push_back(what);
  Logger("dtrun.agent")
      ->error(
          "cannot write the log file {}; that stream's lines from here on "
          "are not in it (the console still shows them when it is told to)",
          what);
  if (route.file_fd >= 0) close(route.file_fd);
  route.file_fd = -1;
}

std::vector<int> LogMux::fds() const {
  std::vector<int> out;
  for (const auto& kv : streams_) out.push_back(kv.first);
  return out;
}

void LogMux::Write(StreamRoute& route, std::string_view line) {
  // One write per line and destination: lines never interleave mid-line.
  // The file is per worker and per stream, so it gets no prefix; the console
  // mixes every worker and needs one.
  std::string buf;
  buf.reserve(route.prefix.size() + line.size() + 1);
  if (route.file_fd >= 0) {
    buf.append(line).push_back('\n');
    // A full disk (ENOSPC) or a dying one (EIO) must not go unsaid: the job
    // goes on, and the file ends where the writes stopped.
    std::string_view rest = buf;
    while (!rest.empty()) {
      ssize_t n = ::write(route.file_fd, rest.data(), rest.size());
      if (n > 0) {
        rest.remove_prefix(static_cast<size_t>(n));
      } else if (n < 0 && errno != EINTR) {
        FileFailed(route, std::strerror(errno));
        break;
      }
    }
    buf.clear();
  }
  if (route.console_fd >= 0 || route.filtered_fd >= 0) {
    buf.append(route.prefix).append(line).push_back('\n');
  }
  if (route.console_fd >= 0) WriteAll(route.console_fd, buf);
  if (route.filtered_fd >= 0) {
    for (const std::string& f : route.filters) {
      if (line.find(f) == std::string_view::npos) continue;
      WriteAll(route.filtered_fd, buf);  // O_APPEND: one write, one line
      break;
    }
  }
}

bool LogMux::OnReadable(int fd) {
  auto it = streams_.find(fd);
  if (it == streams_.end()) return false;
  Stream& s = it->second;
  // 64 KiB is a full default pipe, so a burst usually takes one read. Read
  // until EAGAIN: the loop polls only once per wake-up, and leaving bytes in
  // the pipe would stall a worker blocked writing to it.
  char buf[64 * 1024];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      s.splitter.Feed(std::string_view(buf, static_cast<size_t>(n)),
                      [&](std::string_view line) { Write(s.route, line); });
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    Close(fd);  // EOF or error
    return false;
  }
}

void LogMux::Close(int fd) {
  auto it = streams_.find(fd);
  if (it == streams_.end()) return;
  // A worker that died mid-line (a crash, print(end="")) still gets its last
  // words shown.
  it->second.splitter.Flush(
      [&](std::string_view line) { Write(it->second.route, line); });
  if (it->second.route.file_fd >= 0) close(it->second.route.file_fd);
  if (it->second.route.filtered_fd >= 0) close(it->second.route.filtered_fd);
  close(fd);
  streams_.erase(it);
}

void LogMux::CloseAll() {
  while (!streams_.empty()) {
    int fd = streams_.begin()->first;
    // Take what is already in the pipe: a worker's last lines (a traceback)
    // are often still buffered when its exit is noticed.
    OnReadable(fd);
    Close(fd);
  }
}

}  // namespace dtrun::agent
