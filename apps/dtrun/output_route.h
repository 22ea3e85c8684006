#pragma once

// Where each stream of each worker goes (--redirects, --tee,
// --local-ranks-filter, --log-line-prefix-template, --label-ranks,
// --duplicate-*-filters): a pure function of the launch config and the
// worker's place.

#include <string>

#include "apps/dtrun/launch_config.h"
#include "apps/dtrun/worker_group.h"

namespace dtrun::agent {

// What a --log-line-prefix-template may name.
struct LinePrefixValues {
  std::string role;
  int rank = 0;  // global
  int local_rank = 0;
  std::string hostname;
};
// The template with ${role_name}, ${rank}, ${local_rank} and ${hostname}
// filled in; ${pid} and unknown names are left for later. Pure.
std::string ExpandLinePrefix(const std::string& text,
                             const LinePrefixValues& values);

// One stream of one worker.
struct StreamPlace {
  int local_rank = 0;
  int rank = 0;               // global
  int stream_bit = 1;         // 1: stdout, 2: stderr
  std::string attempt_dir;    // run_layout.h's AttemptDir
  bool keeps_stderr = false;  // a hang or timer watch wants its stacks
};
// The console (unless redirected or filtered out), a file under the
// attempt's folder (redirected or tee'd), a prefix for console lines, and
// the filtered copy.
OutputRoute RouteOf(const LaunchConfig& config, const StreamPlace& place);

}  // namespace dtrun::agent
