#pragma once

// The standby protocol: how dtrun (apps/dtrun/standby.cc) asks a standby
// for a worker. Two standbys answer it: a native program's own main
// (lib/standby_worker.cc) and Python's (apps/dtrun/python/dtrun_standby/
// dtrun_standby.py, which spells these same names;
// tests/apps/standby_protocol_test.py runs `standby_protocol_dump`, this
// header's values as JSON, and checks that the two agree).
//
// The standby holds one end of a SOCK_SEQPACKET socket pair at kSocketFd;
// each message is one packet of JSON:
//   standby -> dtrun  {kReady: true, kSeconds: S} once it can fork, or
//                     {kReady: false, kWhy: "..."} and it exits
//   dtrun -> standby  {kArgv: [...], kEnv: ["K=V", ...], kCpus: [...],
//                     kParent: PID}, the worker's stdout and stderr attached
//                     as kDescriptors descriptors (SCM_RIGHTS)
//   standby -> dtrun  {kPid: N} once the worker runs, or {kError: "..."}
// dtrun closing its end tells the standby to exit.

#include <cstddef>

namespace dtrun::standby_protocol {

// Where the standby finds its end of the socket.
inline constexpr int kSocketFd = 3;
// The largest packet either side sends (a request carries the worker's
// whole environment).
inline constexpr size_t kMaxPacket = 1 << 20;
// A request's attached descriptors: the worker's stdout and stderr.
inline constexpr int kDescriptors = 2;

// The variable that makes a native program serve as its own standby: the
// socket's descriptor.
inline constexpr char kFdVariable[] = "DTRUN_STANDBY_FD";
// Python's standby: the worker's script (or module) and "1" for -m, so the
// standby's path begins where the worker's will.
inline constexpr char kScriptVariable[] = "DTRUN_STANDBY_SCRIPT";
inline constexpr char kModuleVariable[] = "DTRUN_STANDBY_MODULE";

// The standby's first packet.
inline constexpr char kReady[] = "ready";
inline constexpr char kSeconds[] = "seconds";  // its start, skipped per worker
inline constexpr char kWhy[] = "why";

// A request.
inline constexpr char kArgv[] = "argv";
inline constexpr char kEnv[] = "env";
inline constexpr char kCpus[] = "cpus";      // empty or absent: any CPU
inline constexpr char kParent[] = "parent";  // dtrun's pid: the worker's parent

// The answer to a request.
inline constexpr char kPid[] = "pid";
inline constexpr char kError[] = "error";

}  // namespace dtrun::standby_protocol
