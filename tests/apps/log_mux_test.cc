#include "apps/dtrun/log_mux.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <vector>

namespace dtrun::agent {
namespace {

std::vector<std::string> Feed(LineSplitter& s, const std::string& data) {
  std::vector<std::string> lines;
  s.Feed(data, [&](std::string_view l) { lines.emplace_back(l); });
  return lines;
}

TEST(LineSplitterTest, KeepsPartialLinesUntilTheyEnd) {
  LineSplitter s;
  EXPECT_TRUE(Feed(s, "hel").empty());
  EXPECT_EQ(Feed(s, "lo\nwor"), std::vector<std::string>{"hello"});
  EXPECT_EQ(Feed(s, "ld\n\nx\n"), (std::vector<std::string>{"world", "", "x"}));
  EXPECT_EQ(s.pending(), 0u);
}

TEST(LineSplitterTest, FlushEmitsTheUnfinishedLastLine) {
  LineSplitter s;
  Feed(s, "no newline");
  std::vector<std::string> lines;
  s.Flush([&](std::string_view l) { lines.emplace_back(l); });
  EXPECT_EQ(lines, std::vector<std::string>{"no newline"});
}

std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  return out;
}

// Two workers writing fragments into their pipes: the console gets whole,
// prefixed lines; the log file gets the lines without prefix.
TEST(LogMuxTest, PrefixesWholeLinesFromPipes) {
  int console[2], file[2], a[2], b[2];
  ASSERT_EQ(pipe(console), 0);
  ASSERT_EQ(pipe(file), 0);
  ASSERT_EQ(pipe2(a, O_NONBLOCK), 0);
  ASSERT_EQ(pipe2(b, O_NONBLOCK), 0);
  {
    LogMux mux;
    mux.Add(a[0], {console[1], "[rank0]:", file[1], {}, -1});
    mux.Add(b[0], {console[1], "[rank1]:", -1, {}, -1});
    ASSERT_EQ(write(a[1], "al", 2), 2);
    ASSERT_EQ(write(b[1], "b1\nb", 4), 4);
    mux.OnReadable(a[0]);
    mux.OnReadable(b[0]);
    ASSERT_EQ(write(a[1], "pha\n", 4), 4);
    mux.OnReadable(a[0]);
    close(a[1]);
    close(b[1]);
    EXPECT_FALSE(mux.OnReadable(b[0]));  // EOF flushes "b"
    mux.CloseAll();
  }
  close(console[1]);
  EXPECT_EQ(ReadAll(console[0]), "[rank1]:b1\n[rank0]:alpha\n[rank1]:b\n");
  EXPECT_EQ(ReadAll(file[0]), "alpha\n");
  close(console[0]);
  close(file[0]);
}

// --duplicate-stdout-filters: a line holding any filter word also goes,
// prefixed as on the console, to the filtered file; the rest do not.
TEST(LogMuxTest, FilteredLinesAlsoGoToTheirFile) {
  int console[2], filtered[2], a[2];
  ASSERT_EQ(pipe(console), 0);
  ASSERT_EQ(pipe(filtered), 0);
  ASSERT_EQ(pipe2(a, O_NONBLOCK), 0);
  {
    LogMux mux;
    mux.Add(a[0], {console[1], "", -1, {"loss", "a,b"}, filtered[1]});
    const char text[] = "step 1 loss 0.5\nnoise\nx a,b y\n";
    ASSERT_EQ(write(a[1], text, sizeof(text) - 1),
              static_cast<ssize_t>(sizeof(text) - 1));
    close(a[1]);
    mux.OnReadable(a[0]);
    mux.CloseAll();
  }
  close(console[1]);
  EXPECT_EQ(ReadAll(console[0]), "step 1 loss 0.5\nnoise\nx a,b y\n");
  EXPECT_EQ(ReadAll(filtered[0]), "step 1 loss 0.5\nx a,b y\n");
  close(console[0]);
  close(filtered[0]);
}

// A log file on a full disk (/dev/full: every write is ENOSPC): said once,
// the console keeps every line.
TEST(LogMuxTest, AFileThatCannotBeWrittenIsSaidOnceAndTheConsoleGoesOn) {
  int console[2], a[2];
  ASSERT_EQ(pipe(console), 0);
  ASSERT_EQ(pipe2(a, O_NONBLOCK), 0);
  int full = open("/dev/full", O_WRONLY | O_CLOEXEC);
  ASSERT_GE(full, 0);
  std::vector<std::string> errors;
  {
    LogMux mux;
    StreamRoute route{console[1], "", full, {}, -1};
    route.file_path = "/logs/0/stdout.log";
    mux.Add(a[0], route);
    ASSERT_EQ(write(a[1], "one\ntwo\n", 8), 8);
    mux.OnReadable(a[0]);
    ASSERT_EQ(write(a[1], "three\n", 6), 6);
    close(a[1]);
    mux.OnReadable(a[0]);
    mux.CloseAll();
    errors = mux.file_errors();
  }
  close(console[1]);
  EXPECT_EQ(ReadAll(console[0]), "one\ntwo\nthree\n");
  close(console[0]);
  EXPECT_EQ(errors, std::vector<std::string>{
                        "/logs/0/stdout.log: No space left on device"});
}

}  // namespace
}  // namespace dtrun::agent
