#include "apps/dtrun/run_report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

namespace dtrun::agent {
namespace {

constexpr double kWidth = 900, kHeight = 320, kLeft = 60, kBottom = 40;
constexpr const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c",
                                   "#9467bd", "#8c564b", "#e377c2",
                                   "#7f7f7f", "#bcbd22", "#17becf"};

// Coordinates to a tenth of a pixel: exact enough, and a long run's page
// stays small.
std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

// Text for HTML and SVG: the five characters that would be markup.
std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// The plot's frame: time from the first sample or event to the last, step
// time from 0 to the highest.
struct Frame {
  double t0 = 0, t1 = 1, ymax = 1;
  double X(double t) const {
    return kLeft + (t - t0) / std::max(t1 - t0, 1e-9) * (kWidth - kLeft - 10);
  }
  double Y(double s) const {
    return kHeight - kBottom - s / ymax * (kHeight - kBottom - 10);
  }
};

Frame FrameOf(const std::vector<ReportSample>& samples,
              const std::vector<ReportEvent>& events) {
  Frame f;
  bool first = true;
  auto take = [&](double t) {
    f.t0 = first ? t : std::min(f.t0, t);
    f.t1 = first ? t : std::max(f.t1, t);
    first = false;
  };
  for (const ReportSample& s : samples) {
    take(s.t);
    f.ymax = std::max(f.ymax, s.step_time_s * 1000 * 1.1);
  }
  for (const ReportEvent& e : events) take(e.t);
  if (f.t1 <= f.t0) f.t1 = f.t0 + 1;
  return f;
}

// One polyline per rank; a straggler's is thicker.
std::string Lines(const std::vector<ReportSample>& samples, const Frame& f,
                  const std::set<int>& stragglers) {
  std::map<int, std::string> points;
  for (const ReportSample& s : samples) {
    if (s.step_time_s < 0) continue;
    points[s.rank] +=
        Num(f.X(s.t)) + "," + Num(f.Y(s.step_time_s * 1000)) + " ";
  }
  std::string out;
  for (const auto& [rank, p] : points) {
    const char* color = kColors[rank % (sizeof(kColors) / sizeof(*kColors))];
    out += "<polyline fill=\"none\" stroke=\"" + std::string(color) +
           "\" stroke-width=\"" + (stragglers.count(rank) ? "4" : "1.5") +
           "\" points=\"" + p + "\"><title>rank " + std::to_string(rank) +
           "</title></polyline>\n";
  }
  return out;
}

// A dashed vertical line per event, labelled.
std::string Marks(const std::vector<ReportEvent>& events, const Frame& f) {
  std::string out;
  for (const ReportEvent& e : events) {
    const char* color = e.kind == "hang"        ? "#d62728"
                        : e.kind == "straggler" ? "#ff00aa"
                                                : "#555555";
    std::string x = Num(f.X(e.t));
    out += "<line x1=\"" + x + "\" x2=\"" + x + "\" y1=\"10\" y2=\"" +
           Num(kHeight - kBottom) + "\" stroke=\"" + color +
           "\" stroke-dasharray=\"4 3\"><title>" + Escape(e.text) +
           "</title></line>\n<text x=\"" + x +
           "\" y=\"20\" font-size=\"10\" fill=\"" + color + "\">" +
           Escape(e.kind) + "</text>\n";
  }
  return out;
}

// The two axes, labelled with their ranges only: a run's step times span
// orders of magnitude between jobs, so fixed ticks would say little.
std::string Axes(const Frame& f) {
  return "<line x1=\"" + Num(kLeft) + "\" y1=\"" + Num(kHeight - kBottom) +
         "\" x2=\"" + Num(kWidth - 10) + "\" y2=\"" + Num(kHeight - kBottom) +
         "\" stroke=\"black\"/>\n<line x1=\"" + Num(kLeft) +
         "\" y1=\"10\" x2=\"" + Num(kLeft) + "\" y2=\"" +
         Num(kHeight - kBottom) +
         "\" stroke=\"black\"/>\n<text x=\"5\" y=\"20\" font-size=\"11\">" +
         Num(f.ymax) + " ms</text>\n<text x=\"" + Num(kLeft) + "\" y=\"" +
         Num(kHeight - 15) + "\" font-size=\"11\">0 s</text>\n<text x=\"" +
         Num(kWidth - 80) + "\" y=\"" + Num(kHeight - 15) +
         "\" font-size=\"11\">" + Num(f.t1 - f.t0) + " s</text>\n";
}

}  // namespace

// The SVG is inline in the HTML, so the page is one file; the list under
// it repeats the events in words, for a reader and for grep.
std::string RunReportHtml(const std::string& run_id,
                          const std::vector<ReportSample>& samples,
                          const std::vector<ReportEvent>& events) {
  std::set<int> stragglers;
  for (const ReportEvent& e : events) {
    if (e.kind == "straggler" && e.rank >= 0) stragglers.insert(e.rank);
  }
  Frame f = FrameOf(samples, events);
  std::string html =
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>dtrun " +
      Escape(run_id) + "</title></head><body>\n<h1>dtrun run " +
      Escape(run_id) + "</h1>\n<p>Step time of each rank over the run " +
      "(from dtrun's status, once a second); attempts, hangs and stragglers "
      "marked.</p>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
      Num(kWidth) + "\" height=\"" + Num(kHeight) + "\">\n" + Axes(f) +
      Lines(samples, f, stragglers) + Marks(events, f) + "</svg>\n<ul>\n";
  for (const ReportEvent& e : events)
    html += "<li>" + Escape(e.kind) + ": " + Escape(e.text) + "</li>\n";
  for (int rank : stragglers)
    html += "<li>straggler: rank " + std::to_string(rank) + "</li>\n";
  return html + "</ul>\n</body></html>\n";
}

// Each call halves the older half of a rank over the bound: the newest
// samples stay whole, as the end of a run is where it is looked at first.
void Thin(std::vector<ReportSample>* samples, size_t max_per_rank) {
  std::map<int, size_t> count;
  for (const ReportSample& s : *samples) ++count[s.rank];
  for (const auto& [rank, n] : count) {
    if (n <= max_per_rank) continue;
    std::vector<ReportSample> kept;
    size_t seen = 0;
    for (const ReportSample& s : *samples) {
      bool older_half = s.rank == rank && seen++ < n / 2;
      if (!(older_half && seen % 2 == 0)) kept.push_back(s);
    }
    *samples = std::move(kept);
  }
}

}  // namespace dtrun::agent
