// spdlog's compiled part, built into our own binaries when
// DTRUN_STATIC_RUNTIME is on (CMakeLists.txt): every other file sees spdlog's
// declarations only (SPDLOG_COMPILED_LIB), so its implementation is compiled
// once, here, instead of in every file that logs. fmt is header-only
// (FMT_HEADER_ONLY), so dtrun and dtstore link no shared library of either.
//
// Including the "-inl.h" files defines spdlog's functions in this file; the
// class templates other files use are instantiated below.
#include <spdlog/common-inl.h>
#include <spdlog/details/backtracer-inl.h>
#include <spdlog/details/log_msg-inl.h>
#include <spdlog/details/log_msg_buffer-inl.h>
#include <spdlog/details/os-inl.h>
#include <spdlog/details/periodic_worker-inl.h>
#include <spdlog/details/registry-inl.h>
#include <spdlog/logger-inl.h>
#include <spdlog/pattern_formatter-inl.h>
#include <spdlog/sinks/ansicolor_sink-inl.h>
#include <spdlog/sinks/base_sink-inl.h>
#include <spdlog/sinks/sink-inl.h>
#include <spdlog/sinks/stdout_color_sinks-inl.h>
#include <spdlog/sinks/stdout_sinks-inl.h>
#include <spdlog/spdlog-inl.h>

#include <mutex>

namespace spdlog {
namespace sinks {

// rendezvous/log.cc's stderr sink.
template class stdout_sink_base<details::console_mutex>;
template class stderr_sink<details::console_mutex>;
// spdlog's default logger (made by the registry).
template class ansicolor_sink<details::console_mutex>;
template class ansicolor_stdout_sink<details::console_mutex>;
// Sinks of our own (tests' LogCapture) derive from base_sink.
template class base_sink<std::mutex>;

}  // namespace sinks
}  // namespace spdlog
