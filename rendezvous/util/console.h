#pragma once

// The terminal dtrun shares with its workers' output: every write to the
// console (workers' lines, dtrun's own log, reports) goes through Write, so
// that a status line kept at the bottom of the terminal is erased before
// and drawn again after, and never mixes with what scrolls above it.
// Thread-safe: the log can be written from any thread.

#include <string>
#include <string_view>

namespace dtrun::console {

// Keeps a status line on `fd` from now on, when it is a terminal whose
// $TERM can erase a line; returns whether it will. Nothing is drawn until
// SetStatusLine.
bool EnableStatusLine(int fd);

// Replaces the status line's text and draws it, cut to the terminal's
// width (a wrapped line could not be erased). Empty: erased. A no-op
// unless enabled.
void SetStatusLine(const std::string& text);

// Erases the status line for good (the job ended).
void DisableStatusLine();

// Writes all of `data` to `fd`, waiting for room on a non-blocking one and
// retrying interrupted writes. When `fd` is a terminal showing the status
// line, the line is erased first and drawn again once `data` ends a line.
void Write(int fd, std::string_view data);

}  // namespace dtrun::console
