#pragma once

// The beat line, the one layout workers and dtrun share for progress: a
// worker rewrites its beat file (run_layout.h's BeatFile, named to it in
// $DTRUN_HEARTBEAT_FILE) at offset 0 after each step with
//   "<step>[ <compute seconds>[ <total steps>]]\n"   or   "done\n"
// (rendezvous/heartbeat.h writes it for C++; apps/dtrun/README.md shows
// Python's). The file's mtime is when the beat happened. A
// shorter line written over a longer one leaves the old tail after its
// newline, so only the first line counts.
//
// One reader per group (BeatReader) reads each new beat once and hands it
// to everything that wants it: the hang watch, the straggler scores, the
// recovery report and the status.

#include <cstdint>
#include <string>
#include <vector>

namespace dtrun::agent {

// A last beat of "done": the worker is past its loop (tearing down, which
// may be slow) and is not watched any more.
constexpr int64_t kBeatDone = -2;

struct BeatLine {
  int64_t step = -1;        // kBeatDone for "done"; -1 when none
  double compute_s = -1;    // seconds outside collectives; -1 when not given
  int64_t total_steps = 0;  // the run's steps in all; 0 when not given
};

// Lenient about leading blanks, strict about numbers: a negative or
// non-numeric field is "not given", never a wrong value. Pure.
BeatLine ParseBeatLine(const std::string& text);

// One beat as read from the file.
struct Beat {
  BeatLine line;
  int64_t mtime_ns = 0;  // when it was written, unix nanoseconds
  bool seen() const { return mtime_ns != 0; }
  double unix_s() const { return static_cast<double>(mtime_ns) * 1e-9; }
};

// Every worker's beat file of one attempt, read only when its mtime changed
// (a stat per worker per look): a beat is read once however often a
// caller looks.
class BeatReader {
 public:
  void Reset(const std::string& attempt_dir, int nproc);
  // The local ranks whose beat changed since the last look; their new
  // beats are then last(lr). An empty file (just opened, or mid-rewrite)
  // is no beat.
  std::vector<int> ReadNew();
  const Beat& last(int local_rank) const;
  int size() const { return static_cast<int>(last_.size()); }
  // The highest step any rank beat, a "done" beat past every step
  // (INT64_MAX); -1 before any.
  int64_t HighestStep() const;

 private:
  std::string attempt_dir_;
  std::vector<Beat> last_;
};

}  // namespace dtrun::agent
