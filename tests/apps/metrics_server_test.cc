// The metrics and health server over real loopback sockets: exact paths,
// HEAD, refused methods and malformed requests, the idle timeout, the
// connection cap, and the health port's answers by phase and loop pass.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "apps/dtrun/metrics.h"

namespace dtrun::agent {
namespace {

using namespace std::chrono_literals;

int Connect(uint16_t port, const char* host = "127.0.0.1") {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(port);
  ::inet_pton(AF_INET, host, &at.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&at), sizeof(at)) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{15, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// Everything the server sends until it closes ("" when nothing).
std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  ::close(fd);
  return out;
}

std::string Ask(uint16_t port, const std::string& request) {
  int fd = Connect(port);
  if (fd < 0) return "";
  (void)!::write(fd, request.data(), request.size());
  return ReadAll(fd);
}

std::string Status(const std::string& reply) {
  return reply.substr(0, reply.find("\r\n"));
}

TEST(MetricsServerTest, ExactPathsHeadAndRefusals) {
  auto s = MetricsServer::Start("", 0, false);
  ASSERT_TRUE(s.ok()) << s.status().message();
  (*s)->Update("dtrun_x 1\n");
  const uint16_t port = (*s)->port();
  std::string get = Ask(port, "GET /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(Status(get), "HTTP/1.0 200 OK");
  EXPECT_NE(get.find("\r\n\r\ndtrun_x 1\n"), std::string::npos);
  std::string head = Ask(port, "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(Status(head), "HTTP/1.0 200 OK");
  EXPECT_NE(head.find("Content-Length: 10"), std::string::npos);
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n");  // no body
  EXPECT_EQ(Status(Ask(port, "GET /metrics?x=1 HTTP/1.1\r\n\r\n")),
            "HTTP/1.0 200 OK");
  EXPECT_EQ(Status(Ask(port, "GET /metricsX HTTP/1.1\r\n\r\n")),
            "HTTP/1.0 404 Not Found");
  EXPECT_EQ(Status(Ask(port, "POST /metrics HTTP/1.1\r\n\r\n")),
            "HTTP/1.0 405 Method Not Allowed");
  EXPECT_EQ(Status(Ask(port, "hello\r\n\r\n")), "HTTP/1.0 400 Bad Request");
  EXPECT_EQ(Status(Ask(port, std::string(9000, 'G'))),
            "HTTP/1.0 400 Bad Request");
}

// Connections that send nothing are closed after the idle timeout, and past
// the cap new ones are closed at once; a scrape still works meanwhile once
// the idle ones are gone.
TEST(MetricsServerTest, IdleConnectionsAndTheCap) {
  auto s = MetricsServer::Start("127.0.0.1", 0, false);
  ASSERT_TRUE(s.ok());
  const uint16_t port = (*s)->port();
  std::vector<int> idle;
  for (int i = 0; i < 64; ++i) idle.push_back(Connect(port));
  std::this_thread::sleep_for(1s);  // all accepted, on a loaded machine too
  int over = Connect(port);
  ASSERT_GE(over, 0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(ReadAll(over), "");  // closed at once, past the cap
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(ReadAll(idle[0]), "");  // closed by the idle timeout
  for (size_t i = 1; i < idle.size(); ++i) ::close(idle[i]);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(Status(Ask(port, "GET /metrics HTTP/1.1\r\n\r\n")),
            "HTTP/1.0 200 OK");
}

TEST(MetricsServerTest, HealthByPhaseAndLoopPasses) {
  auto s = MetricsServer::Start("", 0, true);
  ASSERT_TRUE(s.ok());
  MetricsServer& h = **s;
  const uint16_t port = h.port();
  auto ask = [port](const char* path) {
    return Status(Ask(port, std::string("GET ") + path + " HTTP/1.1\r\n\r\n"));
  };
  // Before the workers start: alive, not ready.
  EXPECT_EQ(ask("/healthz"), "HTTP/1.0 200 OK");
  EXPECT_EQ(ask("/readyz"), "HTTP/1.0 503 Service Unavailable");
  EXPECT_EQ(ask("/"), "HTTP/1.0 200 OK");
  // A limit long enough for a loaded machine's round trip, short enough
  // to wait out.
  h.SetPhase(HealthPhase::kRunning, 2s);
  h.SetHealthy(true);
  EXPECT_EQ(ask("/readyz"), "HTTP/1.0 200 OK");
  h.SetHealthy(false);  // no progress: not ready, but alive
  EXPECT_EQ(ask("/readyz"), "HTTP/1.0 503 Service Unavailable");
  EXPECT_EQ(ask("/"), "HTTP/1.0 503 Service Unavailable");
  EXPECT_EQ(ask("/healthz"), "HTTP/1.0 200 OK");
  h.SetHealthy(true);
  std::this_thread::sleep_for(2500ms);  // the loop stops passing: wedged
  std::string reply = Ask(port, "GET /healthz HTTP/1.1\r\n\r\n");
  EXPECT_EQ(Status(reply), "HTTP/1.0 503 Service Unavailable");
  EXPECT_NE(reply.find("agent loop silent for"), std::string::npos) << reply;
  h.SetHealthy(true);
  EXPECT_EQ(ask("/healthz"), "HTTP/1.0 200 OK");
  h.SetPhase(HealthPhase::kStopping);  // the exit barrier: alive, not ready
  EXPECT_EQ(ask("/healthz"), "HTTP/1.0 200 OK");
  EXPECT_EQ(ask("/readyz"), "HTTP/1.0 503 Service Unavailable");
}

TEST(MetricsServerTest, ABusyPortIsNamed) {
  auto first = MetricsServer::Start("127.0.0.1", 0, false);
  ASSERT_TRUE(first.ok());
  auto second = MetricsServer::Start("127.0.0.1", (*first)->port(), false);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("127.0.0.1:" +
                                           std::to_string((*first)->port())),
            std::string::npos);
}

}  // namespace
}  // namespace dtrun::agent
