// One mutex around the console: a line written while a status line shows
// first erases it, then draws it again under the new output.
#include "rendezvous/util/console.h"

#include <errno.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace dtrun::console {
namespace {

// "\r" to the line's start, then "erase to the end of the line" (ECMA-48
// EL, which every terminal emulator in use understands).
constexpr std::string_view kErase = "\r\033[K";

struct State {
  std::mutex mu;
  int fd = -1;  // the status line's terminal; -1: none
  // Whether stdout and stderr show that terminal (usually both do).
  bool shows[3] = {false, false, false};
  std::string text;      // what the line says; empty: nothing shown
  bool drawn = false;    // the line is on the screen now
  bool at_start = true;  // the last output ended a line
};

State& Global() {
  static State* s = new State;  // never destroyed: logging at exit is safe
  return *s;
}

void RawWrite(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      // The console may be non-blocking: O_NONBLOCK belongs to the open
      // file description, which dtrun shares with whoever else holds the
      // terminal or pipe. Wait for room instead of dropping output.
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 100);
    } else if (n < 0 && errno != EINTR) {
      return;  // console or file gone: nothing sensible left to do
    }
  }
}

bool SameFile(int a, int b) {
  struct stat sa {
  }, sb{};
  return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

bool ShowsLine(const State& s, int fd) {
  return s.fd >= 0 && fd >= 0 && fd <= 2 && s.shows[fd];
}

// REQUIRES: s.mu held.
void Draw(State& s) {
  if (s.drawn) RawWrite(s.fd, kErase);
  s.drawn = false;
  if (s.text.empty() || !s.at_start) return;
  winsize ws{};
  size_t width = ioctl(s.fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1
                     ? ws.ws_col - 1  // the last column would wrap on some
                     : 79;
  std::string line = s.text.substr(0, width);
  RawWrite(s.fd, line);
  s.drawn = true;
}

}  // namespace

// TERM=dumb (Emacs' shell, some CI consoles) cannot erase a line: there the
// line would pile up, so it is not shown at all.
bool EnableStatusLine(int fd) {
  const char* term = std::getenv("TERM");
  if (!isatty(fd) || !term || !*term || std::strcmp(term, "dumb") == 0)
    return false;
  State& s = Global();
  std::lock_guard<std::mutex> lock(s.mu);
  s.fd = fd;
  for (int std_fd = 1; std_fd <= 2; ++std_fd)
    s.shows[std_fd] = SameFile(std_fd, fd);
  return true;
}

void SetStatusLine(const std::string& text) {
  State& s = Global();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.fd < 0) return;
  s.text = text;
  Draw(s);
}

void DisableStatusLine() {
  State& s = Global();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.fd < 0) return;
  s.text.clear();
  Draw(s);
  s.fd = -1;
}

// Log files cost nothing extra; stdout and stderr piped to a file or a log
// collector cost one uncontended lock on top of the write. On the terminal, the
// erase and the redraw are two more writes per line; the line is redrawn after
// each piece of output rather than on a timer, so it never lags behind what
// scrolled.
void Write(int fd, std::string_view data) {
  if (fd < 0 || fd > 2) {  // a log file: never the terminal, no lock
    RawWrite(fd, data);
    return;
  }
  State& s = Global();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!ShowsLine(s, fd)) {
    RawWrite(fd, data);
    return;
  }
  if (s.drawn) RawWrite(s.fd, kErase);
  s.drawn = false;
  RawWrite(fd, data);
  if (!data.empty()) s.at_start = data.back() == '\n';
  Draw(s);
}

}  // namespace dtrun::console
