#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "apps/dtrun/endpoint.h"
#include "apps/dtrun/python_choice.h"
#include "apps/dtrun/rdzv_config.h"
#include "rendezvous/util/status.h"

namespace dtrun::agent {

// --rdzv-backend: fixed ranks over node 0's store, or c10d's elastic rounds.
// kEtcd: rendezvous on an etcd cluster (`etcd` and `etcd-v2` both name it).
enum class RdzvBackend { kStatic, kC10d, kEtcd };
// "static", "c10d" or "etcd-v2", as torchrun spells them (events, messages).
const char* RdzvBackendName(RdzvBackend backend);
// The backend named `name`; Invalid naming the flag and the choices.
Result<RdzvBackend> ParseRdzvBackend(const std::string& name);

// --store-proxy: whether a node's workers reach the workers' store through
// this node's proxy; kAuto for jobs of more than kProxyAutoWorkers.
enum class StoreProxyMode { kAuto, kOn, kOff };
// The mode named `name` ("auto", "on", "off"); Invalid naming the flag and
// the choices.
Result<StoreProxyMode> ParseStoreProxyMode(const std::string& name);

// --restart: what a worker's failure restarts. kGroup: every worker of the
// group (torchrun's way); kInPlace: the failed worker alone, the others
// re-forming their process group around its replacement when they can
// (rendezvous/in_place.h), else the group.
enum class RestartMode { kGroup, kInPlace };
// The mode named `name` ("group", "in-place"); Invalid naming the flag and
// the choices.
Result<RestartMode> ParseRestartMode(const std::string& name);

// Which of a worker's streams go to files (redirect) or to files and the
// console (tee). Bit 1 = stdout, bit 2 = stderr, as torchrun's 0..3.
struct StreamSpec {
  int all = 0;                  // applies to local ranks not in per_rank
  std::map<int, int> per_rank;  // "lr:v,lr:v" form
  int For(int local_rank) const {
    auto it = per_rank.find(local_rank);
    return it == per_rank.end() ? all : it->second;
  }
};

// --store-proxy=auto proxies the workers' store for jobs of more workers
// than this: beyond it a burst of connections outgrows a listen queue of
// Linux's default 4,096 soon (tests/bench/README.md, "The workers' store"),
// and below it every worker sees rank 0's MASTER_ADDR, as under torchrun.
constexpr int kProxyAutoWorkers = 2048;

// An interactive session restarts its workers as often as they fail. A
// count, not infinity: torchrun's TORCHELASTIC_MAX_RESTARTS carries it.
inline constexpr int kRestartsWithoutLimit = 1'000'000;

// Everything dtrun was asked to do, after parsing and defaults. Plain data;
// Validate() checks it and fills derived fields.
struct LaunchConfig {
  // Workers.
  int nproc_per_node = 1;               // --nproc-per-node; int, cpu, gpu, auto
  std::vector<std::string> entrypoint;  // program (or script/module) + args
  bool module = false;                  // -m: run `python -m entrypoint[0]`
  bool no_python = false;               // --no-python: exec entrypoint directly
  bool run_path = false;                // --run-path: run the file with python
  // --python, else DefaultPython's choice (python_choice.h), and why.
  std::string python = "python3";
  PythonOrigin python_origin = PythonOrigin::kPath;
  // --standby-import: modules a standby imports before it forks workers
  // (standby.h); Validate() splits it into standby_modules.
  std::string standby_import;
  std::vector<std::string> standby_modules;
  // --standby: a standby of the worker program itself (a native program on
  // dtrun's lib, lib/standby_worker.h); Python: torch,torch.distributed.
  bool standby = false;
  std::string role = "default";  // --role -> ROLE_NAME
  bool interactive = false;      // --interactive: Python workers + a console
  bool no_console = false;  // --no-console: host the session, print its address
  std::string gpu_ids;  // --gpu-ids 0,2 (interactive): GPU of each local rank
  // --virtual-local-rank: LOCAL_RANK=0 and one GPU in CUDA_VISIBLE_DEVICES.
  bool virtual_local_rank = false;
  std::string start_method = "spawn";  // --start-method; checked, unused
  // --numa-binding: "", "node", "socket", "exclusive" or "core-complex".
  std::string numa_binding;

  // Nodes and rendezvous.
  int min_nodes = 1, max_nodes = 1;       // --nnodes N or MIN:MAX
  int node_rank = 0;                      // --node-rank
  bool node_rank_given = false;           // by the flag, PET_NODE_RANK or SLURM
  std::string master_addr = "127.0.0.1";  // --master-addr
  std::optional<uint16_t> master_port;    // --master-port; none = free port
  bool standalone = false;                // --standalone
  // Set by Validate(): c10d at HOST:0 on one node, the store on a free port
  // of HOST (master_addr), as with --standalone but keeping --rdzv-id.
  bool free_port_store = false;
  RdzvBackend rdzv_backend = RdzvBackend::kStatic;  // --rdzv-backend
  Endpoint rdzv_endpoint;  // --rdzv-endpoint host[:port], parsed
  // etcd: --rdzv-endpoint's members, "host:port" each (port 2379 unless
  // given); http:// or https:// before them set rdzv_conf.protocol.
  std::vector<std::string> etcd_endpoints;
  std::string rdzv_id = "none";  // --rdzv-id
  RdzvConfig rdzv_conf;          // --rdzv-conf k=v,k=v, typed
  std::string local_addr;        // --local-addr
  // --store-proxy: "on": on a node that is not group rank 0, the workers
  // reach the workers' store through this node's proxy (store_proxy.h), so
  // that store holds one connection per node; "off": each worker connects
  // to it; "auto" (default): on for jobs of more than kProxyAutoWorkers.
  StoreProxyMode store_proxy = StoreProxyMode::kAuto;

  // Failures and signals.
  int max_restarts = 0;                           // --max-restarts
  RestartMode restart = RestartMode::kGroup;      // --restart
  double monitor_interval_s = 0.1;                // accepted; unused
  std::chrono::milliseconds term_timeout{30000};  // --term-timeout, s
  std::chrono::milliseconds hang_timeout{0};      // --hang-timeout, s; 0: off
  // --hang-first-beat, s; 0: the default.
  std::chrono::milliseconds hang_first_beat{0};
  // --metrics-port: Prometheus metrics on this port (0: a free one); -1 off.
  int metrics_port = -1;
  // $TORCHELASTIC_HEALTH_CHECK_PORT: liveness on this port; -1 off.
  int health_check_port = -1;
  // --max-restarts-without-progress: after this many restarts in a row
  // that beat no step past the highest one before, stop (exit 93); 0: off.
  int max_restarts_without_progress = 0;
  // $TORCHELASTIC_ENABLE_FILE_TIMER=1: serve torch's watchdog.
  bool file_timer = false;
  // $TORCHELASTIC_TIMER_FILE; empty: one in the run folder.
  std::string timer_file;
  // dtrun's own $TORCHELASTIC_ERROR_FILE: the root cause's record goes there.
  std::string error_file;
  // --signals-to-handle (else $TORCHELASTIC_SIGNALS_TO_HANDLE): the text as
  // given, and the signal numbers. Stop signals in it stop the job; others
  // are forwarded to every worker and the job goes on.
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  std::vector<int> handled_signals;
  // $TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT, s; 0: off.
  std::chrono::milliseconds uninterruptible_timeout{0};

  // Output.
  std::string log_dir;                  // --log-dir; empty = a temporary folder
  StreamSpec redirects;                 // -r/--redirects
  StreamSpec tee;                       // -t/--tee
  std::vector<int> local_ranks_filter;  // --local-ranks-filter; empty = all
  std::string log_level;                // --log-level
  // --log-line-prefix-template, else $TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE:
  // the prefix of tee'd console lines; empty: "[${role_name}${local_rank}]:".
  std::string log_line_prefix_template;
  // --label-ranks: every console line of a worker starts with "[rankN]:"
  // (global rank), tee'd or not; dtrun's own view, off by default.
  bool label_ranks = false;
  // A progress line at the bottom of the terminal when stdout is one
  // (--no-progress: never).
  bool progress = true;
  // --duplicate-stdout-filters / --duplicate-stderr-filters: console lines
  // holding any of these also go to <attempt>/<lr>/filtered_std{out,err}.log.
  std::vector<std::string> duplicate_stdout_filters, duplicate_stderr_filters;
  // --event-log-handler: "null", "console" (stderr) or "file:PATH" (JSON
  // lines in torch's event schema).
  std::string event_log_handler = "null";
  // --metrics-textfile: the run's outcome, for node_exporter's textfile
  // collector (outcome_metrics.h); empty: none.
  std::string metrics_textfile;

  // dtrun's environment as it started, read once by ParseCommandLine. The
  // workers inherit it (under torchrun's variables); an interactive session
  // adds its package path and the values dtrun.worker reads.
  std::map<std::string, std::string> environment;

  // The resolved command each worker runs (argv), set by Validate().
  std::vector<std::string> worker_argv;
  // Set by Validate(): worker_argv runs the --python interpreter.
  bool python_worker = false;
  // Set by Validate() for Python workers: PythonNote's text for the start
  // line, empty when they run python3 from PATH.
  std::string python_note;

  bool multi_node() const { return max_nodes > 1; }
  // Whether the job goes through rendezvous rounds (several nodes, or the
  // c10d backend), rather than one node with its own store.
  bool uses_rendezvous() const {
    return !standalone && !free_port_store &&
           (multi_node() || rdzv_backend != RdzvBackend::kStatic);
  }
};

// Checks the config, resolves the entrypoint into worker_argv (looking the
// program up in $PATH), and returns Status::Invalid naming the flag at fault.
// With --interactive, also fills the entrypoint, streams and restarts the
// session needs. Call once, after parsing; starts nothing.
Status Validate(LaunchConfig* config);

// "0".."3" or "0:1,2:3" (local rank : bits) -> spec. False on bad syntax.
bool ParseStreamSpec(const std::string& text, StreamSpec* spec);
// "N" or "MIN:MAX".
bool ParseNnodes(const std::string& text, int* min_nodes, int* max_nodes);
// "SIGTERM,SIGUSR1" (also "TERM", "15") -> signal numbers; error names the
// word at fault. Pure.
Result<std::vector<int>> ParseSignalList(const std::string& text);
// torchrun's comma list: "a,b" -> {a, b}; ",," is a literal comma. Pure.
std::vector<std::string> ParseCommaList(const std::string& text);

}  // namespace dtrun::agent
