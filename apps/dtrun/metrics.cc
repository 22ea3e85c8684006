// Prometheus text for a node's workers (pure) and the HTTP server that
// serves it (asio, one thread of its own).
#include "apps/dtrun/metrics.h"

#include <mutex>
#include <thread>

#include <asio.hpp>

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

// Nine significant digits: a step count stays exact, a time keeps its
// microseconds.
std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

// One metric family: its HELP and TYPE lines, then one sample per rank
// from `field` of each rank's record (a value under 0 means unknown and is
// left out, as Prometheus would rather have no sample than a wrong one).
std::string Family(const nlohmann::json& node, const std::string& name,
                   const std::string& help, const char* field, double scale) {
  std::string out =
      "# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n";
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

// A job-wide gauge: one sample, labelled with the run alone.
std::string Gauge(const std::string& name, const std::string& help,
                  const std::string& run, double value) {
  return "# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n" +
         name + "{run_id=\"" + Label(run) + "\"} " + Number(value) + "\n";
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
               static_cast<double>(p.step)) +
         Gauge("dtrun_job_steps_planned",
               "The steps the run takes in all, when its beats say; else 0.",
               run, static_cast<double>(p.total_steps)) +
         Gauge("dtrun_job_step_seconds",
               "The slowest rank's median seconds per step; -1 when unknown.",
               run, p.step_time_s) +
         Gauge("dtrun_job_eta_seconds",
               "Seconds left at the current pace; -1 when unknown.", run,
               p.eta_s) +
         Gauge("dtrun_job_slowest_rank",
               "The rank with the lowest straggler score (else the longest "
               "step time); -1 when none.",
               run, p.slowest_rank);
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
                          "The rendezvous round this node is in; -1 without "
                          "a rendezvous.",
                          run, static_cast<double>(round));
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
         Family(node, "dtrun_worker_cpu_ratio",
                "CPU time per second of the worker process.", "cpu_pct", 0.01) +
         Counter("dtrun_restarts_total", "Attempts after the first.", run,
                 counts.restarts) +
         Counter("dtrun_hangs_total", "Attempts stopped as hung.", run,
                 counts.hangs) +
         Counter("dtrun_stragglers_total", "Stragglers named.", run,
                 counts.stragglers);
}

struct MetricsServer::Impl {
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::thread thread;
  bool health = false;
  std::mutex mu;
  std::string text;     // guarded by mu
  bool healthy = true;  // guarded by mu

  void Accept();
  void Answer(std::shared_ptr<tcp::socket> socket,
              std::shared_ptr<std::string> request);
  std::string Reply(const std::string& request);
};

// One connection: read up to the end of the request line and headers (a
// request that does not end within 8 KiB is answered as it is), reply, close.
void MetricsServer::Impl::Answer(std::shared_ptr<tcp::socket> socket,
                                 std::shared_ptr<std::string> request) {
  auto buf = std::make_shared<std::array<char, 1024>>();
  socket->async_read_some(asio::buffer(*buf), [this, socket, request, buf](
                                                  asio::error_code ec,
                                                  size_t n) {
    if (ec) return;
    request->append(buf->data(), n);
    if (request->find("\r\n\r\n") == std::string::npos &&
        request->size() < 8192) {
      Answer(socket, request);
      return;
    }
    auto reply = std::make_shared<std::string>(Reply(*request));
    asio::async_write(*socket, asio::buffer(*reply),
                      [socket, reply](asio::error_code, size_t) {
                        asio::error_code ignored;
                        socket->shutdown(tcp::socket::shutdown_both, ignored);
                      });
  });
}

// HTTP/1.0 with a length and Connection: close: every client (Prometheus,
// curl, a browser) reads it, and no connection stays open between scrapes.
std::string MetricsServer::Impl::Reply(const std::string& request) {
  auto response = [](const char* status, const std::string& type,
                     const std::string& body) {
    return std::string("HTTP/1.0 ") + status + "\r\nContent-Type: " + type +
           "\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\nConnection: close\r\n\r\n" + body;
  };
  std::lock_guard<std::mutex> lock(mu);
  if (health) {
    return healthy ? response("200 OK", "text/plain", "ok\n")
                   : response("503 Service Unavailable", "text/plain",
                              "no progress\n");
  }
  if (request.rfind("GET /metrics", 0) == 0) {
    return response("200 OK", "text/plain; version=0.0.4; charset=utf-8", text);
  }
  return response("404 Not Found", "text/plain", "dtrun serves /metrics\n");
}

// Accepts forever; a failed accept is skipped, not fatal (the next client
// gets its turn).
void MetricsServer::Impl::Accept() {
  acceptor.async_accept([this](asio::error_code ec, tcp::socket s) {
    if (!acceptor.is_open()) return;
    if (!ec) {
      Answer(std::make_shared<tcp::socket>(std::move(s)),
             std::make_shared<std::string>());
    }
    Accept();
  });
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& host, uint16_t port, bool health) {
  auto impl = std::make_unique<Impl>();
  impl->health = health;
  asio::error_code ec;
  tcp::endpoint at(asio::ip::make_address(host, ec), port);
  if (!ec) impl->acceptor.open(at.protocol(), ec);
  if (!ec) impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(at, ec);
  if (!ec) impl->acceptor.listen(64, ec);
  if (ec) {
    return Status::Unavailable("cannot serve metrics on " + host + ":" +
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

void MetricsServer::SetHealthy(bool healthy) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->healthy = healthy;
}

}  // namespace dtrun::agent
