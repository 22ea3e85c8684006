// Output routes: torchrun's console and log files, and dtrun's labelled
// and filtered views of them.
#include "apps/dtrun/output_route.h"

#include <algorithm>

#include "apps/dtrun/run_layout.h"
#include "rendezvous/util/os_util.h"

namespace dtrun::agent {

std::string ExpandLinePrefix(const std::string& text,
                             const LinePrefixValues& v) {
  // string.Template.safe_substitute, as torchrun expands it: ${name} only,
  // unknown names left as they are. ${pid} is the worker's, filled in when
  // it has one (PosixWorkerGroup::Spawn).
  std::string out = text;
  auto replace = [&out](const std::string& key, const std::string& value) {
    for (size_t at = out.find(key); at != std::string::npos;
         at = out.find(key, at + value.size())) {
      out.replace(at, key.size(), value);
    }
  };
  replace("${role_name}", v.role);
  replace("${rank}", std::to_string(v.rank));
  replace("${local_rank}", std::to_string(v.local_rank));
  replace("${hostname}", v.hostname);
  return out;
}

OutputRoute RouteOf(const LaunchConfig& config, const StreamPlace& p) {
  OutputRoute route;
  const int bit = p.stream_bit;
  bool redirected = config.redirects.For(p.local_rank) & bit;
  // Watching for hangs or timers, stderr is kept too: a Python worker's
  // stack lands there.
  bool user_teed = config.tee.For(p.local_rank) & bit;
  bool teed = user_teed || (bit == 2 && p.keeps_stderr);
  const auto& filter = config.local_ranks_filter;
  bool shown = filter.empty() || std::find(filter.begin(), filter.end(),
                                           p.local_rank) != filter.end();
  if (!redirected && shown) route.console_fd = bit == 1 ? 1 : 2;
  // torchrun's console: a worker's own bytes, unprefixed, unless the stream
  // is tee'd (then "[default0]:" or the template); --label-ranks is dtrun's
  // labelled view of every line.
  if (config.label_ranks) {
    route.prefix = "[rank" + std::to_string(p.rank) + "]:";
  } else if (user_teed) {
    const std::string& t = config.log_line_prefix_template;
    route.prefix = ExpandLinePrefix(
        t.empty() ? "[${role_name}${local_rank}]:" : t,
        LinePrefixValues{config.role, p.rank, p.local_rank, os::HostName()});
  }
  if (redirected || teed)
    route.file = layout::OutputLog(p.attempt_dir, p.local_rank, bit);
  const auto& filters = bit == 1 ? config.duplicate_stdout_filters
                                 : config.duplicate_stderr_filters;
  if (!filters.empty()) {
    route.filters = filters;
    route.filtered_file = layout::FilteredLog(p.attempt_dir, bit);
  }
  return route;
}

}  // namespace dtrun::agent
