#pragma once

// Small filesystem and host helpers shared by the launcher, the rendezvous
// and the training library, so each exists once. Thread-safe: no state.

#include <functional>
#include <string>
#include <string_view>

#include "rendezvous/util/status.h"

namespace dtrun::os {

// Creates `path` and its missing parents (mkdir -p). Status::Io names the
// folder that could not be made and why.
Status MakeDirs(const std::string& path);

// Creates a new private folder "<$TMPDIR or /tmp>/<prefix>XXXXXX" and
// returns its path; Status::Io says to set TMPDIR when it cannot.
Result<std::string> MakeTempDir(const std::string& prefix);

// Removes `path` and everything under it (rm -rf); symlinks are not followed.
// A missing path is not an error.
void RemoveTree(const std::string& path);

// The whole file; Status::Io names the file when it cannot be read.
Result<std::string> ReadFile(const std::string& path);
// The whole file, or "" when it is missing or unreadable.
std::string ReadFileOrEmpty(const std::string& path);
// The last `lines` lines of the file, each ending in '\n'; "" when unreadable.
std::string ReadTail(const std::string& path, size_t lines);
// Replaces the file's content; Status::Io names the file on failure.
Status WriteFile(const std::string& path, std::string_view text);

// Writes `path` so that a crash leaves the old file or the whole new one:
// `fill` writes the content to "<path>.tmp.<pid>" (through `fd`; `tmp`
// names it for errors), which is fsynced and renamed over `path`, then the
// folder is synced. On failure the temporary file is removed and `path` is
// untouched. The pid in the name keeps writers of one folder apart.
Status WriteDurably(
    const std::string& path,
    const std::function<Status(int fd, const std::string& tmp)>& fill);
// fsyncs folder `dir` ("" is the current one), so the names renamed into it
// survive a crash. Best effort: the files are whole either way.
void SyncFolder(const std::string& dir);

// This machine's host name (gethostname), "" if it has none.
std::string HostName();
// This process's own binary (/proc/self/exe, links resolved); "" if unknown.
std::string SelfExecutable();
// The first executable `name` in $PATH (or /usr/bin:/bin), "" if none.
std::string FindInPath(const std::string& name);
// The state letter of /proc/<pid>/stat (R, S, D, Z, T, ...); 0 when gone.
char ProcessState(int pid);
// /proc/<pid>/wchan: the kernel function a sleeping process waits in; ""
// when unknown.
std::string ProcessWaitChannel(int pid);
// Whether `path` is an executable ELF file: a native program, not a script.
bool IsNativeExecutable(const std::string& path);
// `digits` random lowercase hex digits (not for secrets).
std::string RandomHex(int digits);
// Wall-clock seconds since the epoch (for reports, not for timeouts).
double UnixNow();
// Raises this process's soft limit of open files to the hard limit. A store
// holds a connection or two per node, past Debian's soft limit of 1024 at a
// few hundred nodes, while the hard limit is far higher and raising up to it
// needs no privilege. Failure is harmless: the old limit stays.
void RaiseFileLimit();

}  // namespace dtrun::os
