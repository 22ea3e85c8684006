#pragma once

// Blocking socket steps with one deadline each, for the store's clients
// (store_client.cc, store_proxy.cc): every step of an operation shares the
// deadline the operation computed when it started, so a peer that answers
// slowly cannot stretch it. No state; thread-safe.

#include <netdb.h>

#include <chrono>
#include <string>

namespace dtrun::sockets {

using Deadline = std::chrono::steady_clock::time_point;

// Milliseconds from now to `deadline` for poll(2): 0 once it passed, +1 so
// that a poll that rounds down does not wake a hair early and spin, at most
// kLongestPollMs (poll takes an int; a longer wait polls again).
inline constexpr int kLongestPollMs = 1'000'000;
int MillisUntil(Deadline deadline);

// Waits for `events` on `fd`; false when the deadline passed first. EINTR
// waits on with the time left; another poll error returns true, for the
// next call on the socket to report.
bool PollFor(int fd, short events, Deadline deadline);

// How this thread waits in PollFor and SleepFor: the kernel's poll(2) and
// sleep, or, once set, hooks of an event loop that runs many clients on
// this one thread, each on a stack of its own (the rendezvous simulator,
// tests/bench/rdzv_sim_bench.cc): a wait there parks the client until its
// socket is ready and runs the others meanwhile. Null restores the
// kernel's. The hooks must outlive their use on this thread.
struct WaitHooks {
  bool (*poll)(int fd, short events, Deadline deadline) = nullptr;
  void (*sleep)(Deadline until) = nullptr;
};
void SetWaitHooks(const WaitHooks* hooks);
// Whether this thread's waits go to hooks (a client that waits some other
// way, asio's etcd connection, then waits through PollFor instead).
bool WaitHooked();
// Sleeps until `until` (this thread's hook, when set).
void SleepUntil(Deadline until);

// One non-blocking connect to one resolved address, within the deadline (a
// blocking connect() to a black-holed address would wait out the kernel's
// SYN retries, about two minutes). The socket (non-blocking, close-on-exec,
// TCP_NODELAY), or -1 with `*error` saying why.
int ConnectWithin(const addrinfo* ai, Deadline deadline, std::string* error);

}  // namespace dtrun::sockets
