// The one step of the run folder's layout that touches the disk.
#include "apps/dtrun/run_layout.h"

#include "rendezvous/util/os_util.h"

namespace dtrun::agent::layout {

Result<std::string> MakeRunDir(const std::string& log_dir,
                               const std::string& name) {
  if (log_dir.empty()) {
    auto dir = os::MakeTempDir("dtrun-" + name + "-");
    if (!dir.ok())
      return Status::Io(dir.status().message() + " (or give --log-dir)");
    return dir;
  }
  const std::string dir = log_dir + "/" + name;
  Status s = os::MakeDirs(dir);
  if (!s.ok()) return Status::Io("--log-dir: " + s.message());
  return dir;
}

}  // namespace dtrun::agent::layout
