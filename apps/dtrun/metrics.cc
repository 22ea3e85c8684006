// Prometheus text for a node's workers (pure) and the HTTP server that
// serves it (asio, one thread of its own).
#include "apps/dtrun/metrics.h"

#include <atomic>
#include <cmath>
#include <chrono>
#include <mutex>
#include <thread>

#include <asio.hpp>

#include "apps/dtrun/http_request.h"
#include "dtrun_version.h"
#include "rendezvous/store_server.h"

namespace dtrun::agent {
namespace {

using asio::ip::tcp;

// A label value as the exposition format wants it: backslash, quote and
// newline escaped.
std::string Label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? 'n' : c;
  }
  return out;
}

// A whole number exactly (a counter or a byte count past 10^9 too), else
// nine significant digits: a time keeps its microseconds.
std::string Number(double v) {
  char buf[32];
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(v));
  } else {
    std::snprintf(buf, sizeof(buf), "%.9g", v);
  }
  return buf;
}

// One metric family: its HELP and TYPE lines, then one sample per rank
// from `field` of each rank's record (a value under 0 means unknown and is
// left out, as Prometheus would rather have no sample than a wrong one).
std::string Family(const nlohmann::json& node, const std::string& name,
                   const std::string& help, const char* field, double scale,
                   const char* type = "gauge") {
  std::string out =
      "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  const std::string run = Label(node.value("run_id", std::string()));
  const std::string host = Label(node.value("host", std::string()));
  for (const nlohmann::json& r : node.value("ranks", nlohmann::json::array())) {
    double v = r.value(field, -1.0);
    if (v < 0) continue;
    out += name + "{run_id=\"" + run + "\",host=\"" + host + "\",rank=\"" +
           std::to_string(r.value("rank", 0)) + "\",local_rank=\"" +
           std::to_string(r.value("local_rank", 0)) + "\"} " +
           Number(v * scale) + "\n";
  }
  return out;
}

// A job-wide counter: one sample, labelled with the run alone.
std::string Counter(const std::string& name, const std::string& help,
                    const std::string& run, int64_t value) {
  return "# HELP " + name + " " + help + "\n# TYPE " + name + " counter\n" +
         name + "{run_id=\"" + Label(run) + "\"} " + std::to_string(value) +
         "\n";
}

// A job-wide histogram of `values` (Prometheus' cumulative buckets).
std::string Histogram(const std::string& name, const std::string& help,
                      const std::string& run,
                      const std::vector<double>& values) {
  static const double kBounds[] = {0.5, 1, 2, 5, 10, 30, 60, 120, 300};
  const std::string labels = "run_id=\"" + Label(run) + "\"";
  std::string out =
      "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  double sum = 0;
  for (double v : values) sum += v;
  for (double bound : kBounds) {
    size_t n = 0;
    for (double v : values) n += v <= bound;
    out += name + "_bucket{" + labels + ",le=\"" + Number(bound) + "\"} " +
           std::to_string(n) + "\n";
  }
  out += name + "_bucket{" + labels + ",le=\"+Inf\"} " +
         std::to_string(values.size()) + "\n";
  out += name + "_sum{" + labels + "} " + Number(sum) + "\n";
  out +=
      name + "_count{" + labels + "} " + std::to_string(values.size()) + "\n";
  return out;
}

// A job-wide gauge: one sample, labelled with the run alone, or none
// while the value is not known (an alert on `eta < 600` must not fire on a
// stand-in value).
std::string Gauge(const std::string& name, const std::string& help,
                  const std::string& run, double value, bool known = true) {
  std::string out =
      "# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n";
  if (!known) return out;
  return out + name + "{run_id=\"" + Label(run) + "\"} " + Number(value) + "\n";
}

// A family with one sample per store this node hosts.
std::string StoreFamily(const std::vector<StoreSample>& stores,
                        const std::string& name, const std::string& help,
                        const char* type, const std::string& run,
                        double (*value)(const StoreSample&)) {
  std::string out =
      "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  for (const StoreSample& s : stores) {
    out += name + "{run_id=\"" + Label(run) + "\",store=\"" + Label(s.role) +
           "\"} " + Number(value(s)) + "\n";
  }
  return out;
}

}  // namespace

std::string JobMetricsText(const JobProgress& p, const std::string& run) {
  return Gauge("dtrun_job_nodes", "Nodes whose status this node sees.", run,
               p.nodes) +
         Gauge("dtrun_job_ranks_running", "Workers running, on every node.",
               run, p.running) +
         Gauge("dtrun_job_step", "The lowest step any running rank beat.", run,
               static_cast<double>(p.step), p.step >= 0) +
         Gauge("dtrun_job_steps_planned",
               "The steps the run takes in all (no sample until the beats "
               "say).",
               run, static_cast<double>(p.total_steps), p.total_steps > 0) +
         Gauge("dtrun_job_step_seconds",
               "The slowest rank's median seconds per step (no sample until "
               "known).",
               run, p.step_time_s, p.step_time_s >= 0) +
         Gauge("dtrun_job_eta_seconds",
               "Seconds left at the current pace (no sample until known).", run,
               p.eta_s, p.eta_s >= 0) +
         Gauge("dtrun_job_slowest_rank",
               "The rank with the lowest straggler score (else the longest "
               "step time; no sample when none).",
               run, p.slowest_rank, p.slowest_rank >= 0);
}

// The counts are read on the store's own loop (a posted task), so the
// agent never touches the store's state from its thread.
StoreSample SampleStore(const std::string& role,
                        rendezvous::StoreServer* server) {
  rendezvous::StoreServer::Counts c = server->GetCounts();
  return StoreSample{role, c.connections, c.keys, c.requests};
}

std::string StoreMetricsText(const std::vector<StoreSample>& stores,
                             int64_t round, const std::string& run) {
  std::string out = Gauge("dtrun_rendezvous_round",
                          "The rendezvous round this node is in (no sample "
                          "without a rendezvous).",
                          run, static_cast<double>(round), round >= 0);
  if (stores.empty()) return out;
  return out +
         StoreFamily(stores, "dtrun_store_connections",
                     "Connections open to a store this node hosts.", "gauge",
                     run,
                     [](const StoreSample& s) {
                       return static_cast<double>(s.connections);
                     }) +
         StoreFamily(
             stores, "dtrun_store_keys", "Keys in a store this node hosts.",
             "gauge", run,
             [](const StoreSample& s) { return static_cast<double>(s.keys); }) +
         StoreFamily(stores, "dtrun_store_requests_total",
                     "Requests a store this node hosts answered.", "counter",
                     run, [](const StoreSample& s) {
                       return static_cast<double>(s.requests);
                     });
}

std::string ProxyMetricsText(const ProxySample& p, const std::string& run) {
  return Gauge("dtrun_store_proxy_workers",
               "Worker connections this node's store proxy carries to the "
               "workers' store on one connection.",
               run, static_cast<double>(p.workers)) +
         Counter("dtrun_store_proxy_frames_total",
                 "Frames this node's store proxy sent to the workers' store.",
                 run, static_cast<int64_t>(p.frames)) +
         Counter("dtrun_store_proxy_writes_total",
                 "Writes that carried them (fewer than frames: batched).", run,
                 static_cast<int64_t>(p.writes)) +
         Gauge("dtrun_store_proxy_up",
               "1 while this node's store proxy holds its connection to the "
               "workers' store.",
               run, p.lost ? 0.0 : 1.0);
}

// The names follow Prometheus' conventions: base units (seconds, bytes,
// ratios), _total for counters.
std::string MetricsText(const nlohmann::json& node, const JobCounts& counts) {
  nlohmann::json with_up = node;
  for (nlohmann::json& r : with_up["ranks"])
    r["up"] = r.value("state", std::string()) == "running" ? 1.0 : 0.0;
  const std::string run = node.value("run_id", std::string());
  return Family(with_up, "dtrun_worker_up", "1 while the worker process runs.",
                "up", 1) +
         Family(node, "dtrun_worker_step",
                "The step of the worker's last beat.", "step", 1) +
         Family(node, "dtrun_worker_beat_age_seconds",
                "Seconds since the worker's last beat.", "beat_age_s", 1) +
         Family(node, "dtrun_worker_step_seconds",
                "Median seconds per step, between the agent's samples.",
                "step_time_median_s", 1) +
         Family(node, "dtrun_worker_compute_seconds",
                "Typical seconds per step outside collectives (from beats).",
                "compute_typical_s", 1) +
         Family(node, "dtrun_worker_straggler_score",
                "Fastest rank's compute over this rank's; under 0.75: a "
                "straggler.",
                "straggler_score", 1) +
         Family(node, "dtrun_worker_resident_bytes",
                "Resident memory of the worker process.", "rss_mb", 1 << 20) +
         Family(node, "dtrun_worker_cpu_seconds_total",
                "User and system CPU seconds of the worker process.",
                "cpu_seconds", 1, "counter") +
         "# HELP dtrun_build_info The dtrun serving these metrics.\n"
         "# TYPE dtrun_build_info gauge\n"
         "dtrun_build_info{version=\"" DTRUN_VERSION "\",revision=\"" +
         Label(DTRUN_GIT_COMMIT) + "\"} 1\n" +
         Counter("dtrun_restarts_total", "Attempts after the first.", run,
                 counts.restarts) +
         Counter("dtrun_hangs_total", "Attempts stopped as hung.", run,
                 counts.hangs) +
         Counter("dtrun_stragglers_total", "Stragglers named.", run,
                 counts.stragglers) +
         Counter("dtrun_oom_kills_total",
                 "Workers the kernel's OOM killer killed.", run,
                 counts.oom_kills) +
         Histogram("dtrun_recovery_seconds",
                   "Seconds from a worker's failure to the next step every "
                   "new worker completed.",
                   run, counts.recovery_seconds);
}

namespace {

// What one server holds at once, and how long a connection may take to
// send its request: a scraper that opens connections and sends nothing
// neither grows dtrun's memory nor holds the server.
constexpr size_t kMaxConnections = 64;
constexpr auto kIdleTimeout = std::chrono::seconds(10);

// HTTP/1.0 with a length and Connection: close: every client (Prometheus,
// curl, a kubelet's probe) reads it, and no connection stays open between
// scrapes. HEAD gets the same head without the body.
std::string Response(const std::string& status, const std::string& type,
                     const std::string& body, bool head_only,
                     const std::string& extra = "") {
  return "HTTP/1.0 " + status + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + extra +
         "Connection: close\r\n\r\n" + (head_only ? "" : body);
}

}  // namespace

struct MetricsServer::Impl {
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::thread thread;
  bool health = false;
  std::atomic<size_t> connections{0};
  std::mutex mu;
  std::string text;                            // guarded by mu
  bool progressing = true;                     // guarded by mu
  HealthPhase phase = HealthPhase::kStarting;  // guarded by mu
  std::chrono::steady_clock::time_point last_pass =
      std::chrono::steady_clock::now();           // guarded by mu
  std::chrono::milliseconds pass_timeout{30000};  // guarded by mu

  void Accept();
  void Answer(std::shared_ptr<tcp::socket> socket,
              std::shared_ptr<std::string> request,
              std::shared_ptr<asio::steady_timer> idle);
  std::string Reply(const HttpRequest& request);
  std::string HealthReply(const std::string& path, bool head_only);
};

// One connection: read up to the end of the head (at most kMaxRequestHead
// bytes, within kIdleTimeout), reply, close.
void MetricsServer::Impl::Answer(std::shared_ptr<tcp::socket> socket,
                                 std::shared_ptr<std::string> request,
                                 std::shared_ptr<asio::steady_timer> idle) {
  auto buf = std::make_shared<std::array<char, 1024>>();
  socket->async_read_some(asio::buffer(*buf), [this, socket, request, idle,
                                               buf](asio::error_code ec,
                                                    size_t n) {
    if (ec) return;
    request->append(buf->data(), n);
    HttpRequest parsed = ParseHttpRequest(*request);
    if (parsed.state == HttpRequest::State::kIncomplete) {
      Answer(socket, request, idle);
      return;
    }
    idle->cancel();
    auto reply = std::make_shared<std::string>(Reply(parsed));
    asio::async_write(*socket, asio::buffer(*reply),
                      [socket, reply](asio::error_code, size_t) {
                        asio::error_code ignored;
                        socket->shutdown(tcp::socket::shutdown_both, ignored);
                      });
  });
}

std::string MetricsServer::Impl::Reply(const HttpRequest& request) {
  if (request.state == HttpRequest::State::kMalformed) {
    return Response("400 Bad Request", "text/plain",
                    "dtrun: not an HTTP request line\n", false);
  }
  const bool head = request.method == "HEAD";
  if (!head && request.method != "GET") {
    return Response("405 Method Not Allowed", "text/plain",
                    "dtrun answers GET and HEAD\n", false,
                    "Allow: GET, HEAD\r\n");
  }
  if (health) return HealthReply(request.path, head);
  if (request.path == "/metrics") {
    std::lock_guard<std::mutex> lock(mu);
    return Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", text,
                    head);
  }
  return Response("404 Not Found", "text/plain", "dtrun serves /metrics\n",
                  head);
}

// /healthz: the agent is alive (its loop passed within the timeout while
// the workers run; before and after, the process answering is enough).
// /readyz: the workers run and make progress. Any other path is torch's
// one health path: alive and making progress.
std::string MetricsServer::Impl::HealthReply(const std::string& path,
                                             bool head_only) {
  std::lock_guard<std::mutex> lock(mu);
  const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - last_pass);
  const bool running = phase == HealthPhase::kRunning;
  std::string why;
  if (running && silent > pass_timeout) {
    why = "agent loop silent for " + std::to_string(silent.count() / 1000) +
          " s (limit " + std::to_string(pass_timeout.count() / 1000) + " s)";
  }
  if (why.empty() && path != "/healthz") {
    if (phase == HealthPhase::kStarting)
      why = path == "/readyz" ? "not ready: the workers have not started" : "";
    else if (phase == HealthPhase::kStopping)
      why = path == "/readyz" ? "not ready: the job is ending" : "";
    else if (!progressing)
      why = "no progress";
  }
  if (!why.empty()) {
    return Response("503 Service Unavailable", "text/plain", why + "\n",
                    head_only);
  }
  return Response("200 OK", "text/plain", "ok\n", head_only);
}

// Accepts forever; a failed accept is skipped, not fatal (the next client
// gets its turn). Past kMaxConnections a new connection is closed at once.
void MetricsServer::Impl::Accept() {
  acceptor.async_accept([this](asio::error_code ec, tcp::socket s) {
    if (!acceptor.is_open()) return;
    if (!ec && connections.load() < kMaxConnections) {
      ++connections;
      auto socket = std::shared_ptr<tcp::socket>(new tcp::socket(std::move(s)),
                                                 [this](tcp::socket* t) {
                                                   delete t;
                                                   --connections;
                                                 });
      auto idle = std::make_shared<asio::steady_timer>(io, kIdleTimeout);
      idle->async_wait([socket](asio::error_code e) {
        asio::error_code ignored;
        if (!e) socket->close(ignored);
      });
      Answer(socket, std::make_shared<std::string>(), idle);
    }
    Accept();
  });
}

namespace {

// `host` as given, or, for "", IPv6's any address taking IPv4 too, else
// IPv4's where the host has no IPv6 (as dtstore binds).
asio::error_code Listen(tcp::acceptor& acceptor, const std::string& host,
                        uint16_t port) {
  asio::error_code ec;
  for (const char* any : {"::", "0.0.0.0"}) {
    const std::string at_host = host.empty() ? any : host;
    ec.clear();
    acceptor.close(ec);
    ec.clear();
    tcp::endpoint at(asio::ip::make_address(at_host, ec), port);
    if (!ec) acceptor.open(at.protocol(), ec);
    if (!ec && at.address().is_v6())
      acceptor.set_option(asio::ip::v6_only(false), ec);
    if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind(at, ec);
    if (!ec) acceptor.listen(64, ec);
    if (!ec || !host.empty()) return ec;
  }
  return ec;
}

}  // namespace

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& host, uint16_t port, bool health) {
  auto impl = std::make_unique<Impl>();
  impl->health = health;
  asio::error_code ec = Listen(impl->acceptor, host, port);
  if (ec) {
    return Status::Unavailable("cannot serve " +
                               std::string(health ? "health" : "metrics") +
                               " on " + (host.empty() ? "*" : host) + ":" +
                               std::to_string(port) + ": " + ec.message());
  }
  impl->Accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->io.run(); });
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

// Stopped from its own thread, so nothing runs in asio while it closes.
MetricsServer::~MetricsServer() {
  asio::post(impl_->io, [this] {
    asio::error_code ignored;
    impl_->acceptor.close(ignored);
    impl_->io.stop();
  });
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint16_t MetricsServer::port() const {
  return impl_->acceptor.local_endpoint().port();
}

void MetricsServer::Update(std::string text) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->text = std::move(text);
}

void MetricsServer::SetHealthy(bool progressing) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->progressing = progressing;
  impl_->last_pass = std::chrono::steady_clock::now();
}

void MetricsServer::SetPhase(HealthPhase phase,
                             std::chrono::milliseconds pass_timeout) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->phase = phase;
  impl_->pass_timeout = pass_timeout;
  impl_->last_pass = std::chrono::steady_clock::now();
}

}  // namespace dtrun::agent
