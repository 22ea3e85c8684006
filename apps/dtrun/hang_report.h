#pragma once

#include <string>
#include <vector>

#include "apps/dtrun/exit_code.h"
#include "apps/dtrun/hang_monitor.h"

namespace dtrun::agent {

// A hung worker's exit code in reports (GNU timeout's).
constexpr int kHangExitCode = kExitHung;

// Where one worker was when its group was declared hung. Filled by the hang
// watch on the agent's loop thread; plain data.
struct RankStack {
  int rank = 0;  // global rank
  int pid = 0;
  RankSilence silence;
  std::string stack;         // the whole captured stack; empty when none
  std::string stack_file;    // where `stack` is kept; empty when none
  std::string why_no_stack;  // set when none could be captured
  // The host of a rank of another node (shared through the store, see
  // StackAnswerJson); empty for this node's ranks.
  std::string host;
};

// One node's ranks as the JSON it answers a stacks request with (`dtrun
// --stacks`, or another node's hang) through the store:
//   {"host": H, "stacks": {"<rank>": text},
//    "ranks": {"<rank>": {"local_rank", "pid", "step", "beaten",
//                         "silent_s", "exited", "at"}}}
// where `at` is `now_unix`, the moment the silences were measured. Pure.
std::string StackAnswerJson(const std::string& host,
                            const std::vector<RankStack>& ranks,
                            double now_unix);

// The ranks of another node's answer, their silences carried forward to
// `now_unix`, each hung when silent past `timeout_s` and waiting in a
// collective when its stack says so (StackWaits). An answer that is not
// such JSON gives none. Pure.
std::vector<RankStack> RanksOfStackAnswer(const std::string& json,
                                          double now_unix, double timeout_s);

// The last Python fault-handler dump in a worker's stderr text (from its
// "Fatal Python error:" line to the end), or "" when there is none.
std::string ExtractFaulthandlerDump(const std::string& stderr_text);

// Up to `n` frame lines of a stack: a Python dump's current thread
// ("File ..., line N in f"), else the first thread of an eu-stack or gdb
// backtrace ("#0 ..."). Leading blanks trimmed.
std::vector<std::string> FirstFrames(const std::string& stack, size_t n);

// Whether a stack shows its rank waiting for other ranks: the current
// thread's innermost Python frame is in torch.distributed (a collective, a
// process-group or store wait), or one of the first native frames above the
// C runtime's is c10d's, gloo's, NCCL's or a store client's. Such a rank is
// not a hang's root cause while another rank at its step is elsewhere.
bool StackWaits(const std::string& stack);

// The report printed when a hang stops a group: the root cause first (see
// HangRootCause), marked hung or waiting, silence, step, first frames and
// the stack file of each rank. `timeout_s` is --hang-timeout in seconds,
// `attempt` the restart count, `frames` the frame lines per rank. Pure.
// REQUIRES: `ranks` is not empty.
std::string FormatHangReport(const std::vector<RankStack>& ranks,
                             double timeout_s, int attempt, size_t frames);

// One line for a failure summary: "hung: no heartbeat for 3.1 s, last step 170"
// (or "waiting: ..."), then the first frames and the stack file.
std::string HangTraceback(const RankStack& r, size_t frames);

}  // namespace dtrun::agent
