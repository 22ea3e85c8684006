#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dtrun::agent {

// Splits a byte stream into whole lines. Pure; one per stream.
class LineSplitter {
 public:
  using Emit = std::function<void(std::string_view line)>;  // without '\n'
  // Emits every line completed by `data`; keeps the unfinished rest.
  void Feed(std::string_view data, const Emit& emit);
  // Emits the unfinished rest, if any, as a last line.
  void Flush(const Emit& emit);
  size_t pending() const { return partial_.size(); }

 private:
  std::string partial_;
};

// Where one worker stream's lines go.
struct StreamRoute {
  int console_fd = -1;  // 1 or 2 to show on the console; -1 to not
  std::string prefix;   // e.g. "[rank3]:", prepended on the console only
  int file_fd = -1;     // a log file, or -1
  // Lines holding any of `filters` are also written to `filtered_fd`.
  std::vector<std::string> filters;
  int filtered_fd = -1;
  std::string file_path{};   // the log file's path, for a message if it fails
  std::string file_error{};  // why it could not be opened; "" when it was
};

// Reads worker pipes and forwards whole lines, so lines of different
// workers never interleave mid-line. Owns the pipe read ends and the file
// descriptors of its routes. Not thread-safe; the agent's loop calls it.
class LogMux {
 public:
  ~LogMux();
  // Takes ownership of `fd` (non-blocking read end) and `route.file_fd`.
  void Add(int fd, const StreamRoute& route);
  // Reads what `fd` has, without blocking; returns false at EOF or error,
  // after flushing its partial line and closing it (and its file).
  bool OnReadable(int fd);
  // Drains what is already in each pipe, flushes partial lines and closes
  // every stream. Does not wait for writers still running.
  void CloseAll();
  std::vector<int> fds() const;
  // Each log file that could not be opened or written ("PATH: why"), once;
  // its lines went on to the console only (when shown there).
  const std::vector<std::string>& file_errors() const { return file_errors_; }

 private:
  struct Stream {
    StreamRoute route;
    LineSplitter splitter;
  };
  void Write(StreamRoute& route, std::string_view line);
  void Close(int fd);
  // A log file gone bad: said once, and no more written to it.
  void FileFailed(StreamRoute& route, const std::string& why);

  std::map<int, Stream> streams_;
  std::vector<std::string> file_errors_;
};

// Writes all of `data` to `fd`, retrying on EINTR/partial writes and polling
// (100 ms at a time) while a non-blocking `fd` is full. Blocks until written;
// gives up silently on any other error, since the destination is gone.
// Console writes keep clear of dtrun's status line (rendezvous/util/
// console.h).
void WriteAll(int fd, std::string_view data);

}  // namespace dtrun::agent
