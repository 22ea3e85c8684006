#include "rendezvous/util/console.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

namespace dtrun::console {
namespace {

constexpr const char* kErase = "\r\033[K";
constexpr const char* kEnd = "<end of the child's output>";

// Runs `body` in a child whose stdout and stderr are a new terminal of
// `columns` columns (raw: bytes arrive as written) with $TERM = `term`;
// returns what the terminal received. The console's state is per process,
// so each case starts clean. The child's exit code is `body`'s.
std::string OnTerminal(const std::function<int()>& body,
                       const char* term = "xterm", int columns = 80,
                       int* exit_code = nullptr) {
  int master = posix_openpt(O_RDWR | O_NOCTTY);
  EXPECT_GE(master, 0);
  EXPECT_EQ(grantpt(master), 0);
  EXPECT_EQ(unlockpt(master), 0);
  winsize ws{};
  ws.ws_row = 24;
  ws.ws_col = static_cast<unsigned short>(columns);
  ioctl(master, TIOCSWINSZ, &ws);
  const std::string slave_name = ptsname(master);
  pid_t pid = fork();
  if (pid == 0) {
    int slave = open(slave_name.c_str(), O_RDWR);
    termios t{};
    tcgetattr(slave, &t);
    cfmakeraw(&t);
    tcsetattr(slave, TCSANOW, &t);
    dup2(slave, 1);
    dup2(slave, 2);
    close(slave);
    close(master);
    setenv("TERM", term, 1);
    const int code = body();
    // Past the console, so that the parent knows it has every byte: a
    // master's read can fail with EIO once the child is gone while the
    // kernel still holds the last of what it wrote.
    ssize_t ignored = write(1, kEnd, strlen(kEnd));
    (void)ignored;
    _exit(code);
  }
  std::string out;
  char buf[4096];
  const size_t end_size = strlen(kEnd);
  while (out.size() < end_size ||
         out.compare(out.size() - end_size, end_size, kEnd) != 0) {
    ssize_t n = read(master, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the end mark never came: the test sees why
    out.append(buf, static_cast<size_t>(n));
  }
  if (out.size() >= end_size &&
      out.compare(out.size() - end_size, end_size, kEnd) == 0)
    out.resize(out.size() - end_size);
  int status = 0;
  waitpid(pid, &status, 0);
  close(master);
  if (exit_code) *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(ConsoleTest, OutputErasesTheLineAndDrawsItAgainBelow) {
  std::string got = OnTerminal([] {
    if (!EnableStatusLine(1)) return 1;
    SetStatusLine("S1");
    Write(1, "a\n");
    Write(2, "b\n");  // stderr shows the same terminal
    SetStatusLine("S2");
    DisableStatusLine();
    Write(1, "after\n");
    return 0;
  });
  const std::string e = kErase;
  EXPECT_EQ(got, "S1" + e + "a\nS1" + e + "b\nS1" + e + "S2" + e + "after\n");
}

TEST(ConsoleTest, APartialLineIsNeverFollowedByTheStatusLine) {
  std::string got = OnTerminal([] {
    if (!EnableStatusLine(1)) return 1;
    SetStatusLine("S");
    Write(1, "part");
    SetStatusLine("T");  // not drawn: it would land inside the line
    Write(2, "ial\n");
    return 0;
  });
  EXPECT_EQ(got, "S" + std::string(kErase) + "partial\nT");
}

TEST(ConsoleTest, TheLineIsCutToTheTerminalsWidth) {
  std::string got = OnTerminal(
      [] {
        if (!EnableStatusLine(1)) return 1;
        SetStatusLine("0123456789ABCDEF");
        return 0;
      },
      "xterm", 10);
  EXPECT_EQ(got, "012345678");  // the last column is left free
}

TEST(ConsoleTest, ADumbTerminalOrAPipeGetsNoStatusLine) {
  int rc = -1;
  std::string got = OnTerminal(
      [] {
        bool on = EnableStatusLine(1);
        SetStatusLine("S");
        Write(1, "x\n");
        return on ? 1 : 0;
      },
      "dumb", 80, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(got, "x\n");
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  EXPECT_FALSE(EnableStatusLine(fds[1]));
  close(fds[0]);
  close(fds[1]);
}

}  // namespace
}  // namespace dtrun::console
