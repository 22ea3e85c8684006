// Socket steps within a deadline (socket_util.h).
#include "rendezvous/util/socket_util.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace dtrun::sockets {

int MillisUntil(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return 0;
  return left.count() >= kLongestPollMs ? kLongestPollMs
                                        : static_cast<int>(left.count()) + 1;
}

namespace {
thread_local const WaitHooks* t_hooks = nullptr;
}  // namespace

void SetWaitHooks(const WaitHooks* hooks) { t_hooks = hooks; }

bool WaitHooked() { return t_hooks != nullptr; }

void SleepUntil(Deadline until) {
  if (t_hooks && t_hooks->sleep) return t_hooks->sleep(until);
  std::this_thread::sleep_until(until);
}

bool PollFor(int fd, short events, Deadline deadline) {
  if (t_hooks && t_hooks->poll) return t_hooks->poll(fd, events, deadline);
  for (;;) {
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, MillisUntil(deadline));
    if (r > 0) return true;
    if (r == 0 && std::chrono::steady_clock::now() >= deadline) return false;
    if (r < 0 && errno != EINTR) return true;  // let the next call report it
  }
}

int ConnectWithin(const addrinfo* ai, Deadline deadline, std::string* error) {
  int fd =
      ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
               ai->ai_protocol);
  if (fd < 0) {
    *error = std::strerror(errno);
    return -1;
  }
  int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    if (!PollFor(fd, POLLOUT, deadline)) {
      *error = "connect timed out";
      ::close(fd);
      return -1;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    rc = err == 0 ? 0 : -1;
    errno = err;
  }
  if (rc != 0) {
    *error = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  // A request without a reply (SET, APPEND, MULTI_SET, a proxied frame) is
  // followed by more unacknowledged data: Nagle would hold it until the
  // peer's delayed ACK (up to 40 ms on Linux).
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace dtrun::sockets
