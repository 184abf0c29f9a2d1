// metrics.jsonl writing and the loss-versus-step SVG chart (see metrics.h).
#include "train/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <utility>
#include <vector>

#include "engine/io_error.h"
#include "engine/text_file.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace loom {

namespace fs = std::filesystem;

namespace {

absl::StatusOr<std::vector<std::string>> read_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in || is_directory_path(path)) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", open_error_reason(path)));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return lines;
}

}  // namespace

std::string metrics_json_line(const StepMetrics& m) {
  nlohmann::ordered_json j;  // field order as documented; nlohmann writes NaN/inf as null
  j["step"] = m.step;
  j["epoch"] = m.epoch;
  j["loss"] = m.loss;
  j["lr"] = m.lr;
  j["grad_norm"] = m.grad_norm;
  j["target_tokens"] = m.target_tokens;
  j["input_tokens"] = m.input_tokens;
  j["tokens_per_s"] = m.tokens_per_s;
  j["mem_bytes"] = m.mem_bytes;
  if (m.host_mem_bytes >= 0) j["host_mem_bytes"] = m.host_mem_bytes;
  if (m.eval_loss) j["eval_loss"] = *m.eval_loss;
  for (const auto& [k, v] : m.extra) j[k] = v;
  return j.dump();
}

absl::StatusOr<MetricsWriter> MetricsWriter::open(const std::string& out_dir, std::optional<int64_t> resume_step) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  std::string path = (fs::path(out_dir) / "metrics.jsonl").string();
  if (resume_step && fs::exists(path)) {
    auto lines = read_lines(path);
    if (!lines.ok()) return lines.status();
    std::string kept;
    for (const std::string& line : *lines) {
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() <= *resume_step)
        kept += line + "\n";
    }
    if (auto st = write_text_atomic(path, kept); !st.ok()) return st;
  }
  // Opened for appending either way, so that a fresh run that fails before its first step leaves
  // an earlier run's metrics as they were; the first write of a fresh run truncates.
  std::ofstream out(path, std::ios::app);
  if (!out) return absl::InternalError(absl::StrCat("cannot open ", path, " for writing"));
  return MetricsWriter(std::move(path), std::move(out), /*truncate_on_first_write=*/!resume_step);
}

absl::Status MetricsWriter::write(const StepMetrics& m) {
  if (truncate_on_first_write_) {
    out_.close();
    out_.open(path_, std::ios::trunc);
    truncate_on_first_write_ = false;
  }
  out_ << metrics_json_line(m) << '\n';
  out_.flush();
  if (!out_) return absl::InternalError(absl::StrCat("cannot write to ", path_));
  return absl::OkStatus();
}

namespace {

// An axis range widened to "nice" tick values (1, 2 or 5 times a power of ten), about 5 ticks.
struct Axis {
  double lo, hi, step;
  int decimals;  // for the tick labels
};

Axis nice_axis(double lo, double hi) {
  if (!(hi > lo)) {  // one value (or none): a unit-wide window around it
    const double pad = std::max(std::abs(lo) * 0.1, 1e-3);
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / 5.0;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  const double step = (f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 5.0 ? 5.0 : 10.0) * mag;
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  return {std::floor(lo / step + 1e-9) * step, std::ceil(hi / step - 1e-9) * step, step, decimals};
}

std::string fmt(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v == 0 ? 0.0 : v);  // no "-0"
  return buf;
}

}  // namespace

namespace {

// One chart of the SVG: lines against step, each with its points, colour and legend label.
struct Series {
  std::string label, color, css_class;
  std::vector<std::pair<double, double>> points;
};
struct Panel {
  std::string title, y_label, empty_note;
  std::vector<Series> series;  // the first is the main line; a legend appears when a second has points
};

// Draws `p` in an 800 x 480 box whose top is at y = `y_top`.
void draw_panel(std::ostringstream& s, const Panel& p, double y_top) {
  const double width = 800, height = 480, left = 80, right = 30, top = 50, bottom = 60;
  const double pw = width - left - right, ph = height - top - bottom;
  const std::vector<std::pair<double, double>>& main = p.series.front().points;
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (!main.empty()) {
    x0 = main.front().first, x1 = main.back().first;
    y0 = y1 = main.front().second;
    for (const Series& se : p.series)
      for (const auto& q : se.points)
        x0 = std::min(x0, q.first), x1 = std::max(x1, q.first), y0 = std::min(y0, q.second), y1 = std::max(y1, q.second);
  }
  const Axis ax = nice_axis(x0, x1), ay = nice_axis(y0, y1);
  auto px = [&](double x) { return left + (x - ax.lo) / (ax.hi - ax.lo) * pw; };
  auto py = [&](double y) { return top + ph - (y - ay.lo) / (ay.hi - ay.lo) * ph; };
  if (y_top > 0) s << "<g transform=\"translate(0 " << y_top << ")\">\n";
  s << "<text x=\"" << width / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">" << p.title << "</text>\n";
  // Grid lines and tick labels.
  const int nx = static_cast<int>(std::lround((ax.hi - ax.lo) / ax.step));
  const int ny = static_cast<int>(std::lround((ay.hi - ay.lo) / ay.step));
  for (int i = 0; i <= nx; ++i) {
    const double v = ax.lo + i * ax.step, x = px(v);
    s << "<line x1=\"" << fmt(x, 2) << "\" y1=\"" << top << "\" x2=\"" << fmt(x, 2) << "\" y2=\"" << top + ph
      << "\" stroke=\"#e0e0e0\"/>\n"
      << "<text x=\"" << fmt(x, 2) << "\" y=\"" << top + ph + 18 << "\" text-anchor=\"middle\">" << fmt(v, ax.decimals)
      << "</text>\n";
  }
  for (int i = 0; i <= ny; ++i) {
    const double v = ay.lo + i * ay.step, y = py(v);
    s << "<line x1=\"" << left << "\" y1=\"" << fmt(y, 2) << "\" x2=\"" << left + pw << "\" y2=\"" << fmt(y, 2)
      << "\" stroke=\"#e0e0e0\"/>\n"
      << "<text x=\"" << left - 8 << "\" y=\"" << fmt(y + 4, 2) << "\" text-anchor=\"end\">" << fmt(v, ay.decimals)
      << "</text>\n";
  }
  // Axes and their labels.
  s << "<line x1=\"" << left << "\" y1=\"" << top + ph << "\" x2=\"" << left + pw << "\" y2=\"" << top + ph
    << "\" stroke=\"black\"/>\n"
    << "<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\"" << top + ph << "\" stroke=\"black\"/>\n"
    << "<text x=\"" << left + pw / 2 << "\" y=\"" << height - 15 << "\" text-anchor=\"middle\">step</text>\n"
    << "<text x=\"20\" y=\"" << top + ph / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 20 " << top + ph / 2
    << ")\">" << p.y_label << "</text>\n";
  if (main.empty()) {
    s << "<text x=\"" << left + pw / 2 << "\" y=\"" << top + ph / 2 << "\" text-anchor=\"middle\" fill=\"#808080\">"
      << p.empty_note << "</text>\n";
    if (y_top > 0) s << "</g>\n";
    return;
  }
  // The lines: the main one, then the others (a dot per point: held-out values are sparse).
  bool legend = false;
  for (size_t k = 0; k < p.series.size(); ++k) {
    const Series& se = p.series[k];
    if (se.points.empty()) continue;
    legend = legend || k > 0;
    s << "<polyline" << (se.css_class.empty() ? "" : " class=\"" + se.css_class + "\"") << " fill=\"none\" stroke=\""
      << se.color << "\" stroke-width=\"1.5\" points=\"";
    for (size_t i = 0; i < se.points.size(); ++i)
      s << (i ? " " : "") << fmt(px(se.points[i].first), 2) << ',' << fmt(py(se.points[i].second), 2);
    s << "\"/>\n";
    if (k > 0 || se.points.size() == 1)
      for (const auto& q : se.points)
        s << "<circle cx=\"" << fmt(px(q.first), 2) << "\" cy=\"" << fmt(py(q.second), 2) << "\" r=\"3\" fill=\"" << se.color
          << "\"/>\n";
  }
  if (legend) {
    const double lx = left + pw - 150, ly = top + 14;
    for (size_t k = 0; k < p.series.size(); ++k) {
      const double y = ly + 18 * static_cast<double>(k);
      s << "<line x1=\"" << lx << "\" y1=\"" << y << "\" x2=\"" << lx + 24 << "\" y2=\"" << y << "\" stroke=\""
        << p.series[k].color << "\" stroke-width=\"1.5\"/>\n<text x=\"" << lx + 30 << "\" y=\"" << y + 4 << "\">"
        << p.series[k].label << "</text>\n";
    }
  }
  if (y_top > 0) s << "</g>\n";
}

}  // namespace

absl::Status write_loss_svg(const std::string& metrics_jsonl_path, const std::string& svg_path) {
  auto lines = read_lines(metrics_jsonl_path);
  if (!lines.ok()) return lines.status();
  // (step, value) of each key drawn: the loss, and a preference objective's margin and accuracy,
  // each beside its held-out value.
  const std::vector<std::string> keys = {"loss",           "eval_loss",           "rewards/margins",
                                         "eval_rewards/margins", "rewards/accuracies", "eval_rewards/accuracies"};
  std::vector<std::vector<std::pair<double, double>>> values(keys.size());
  for (size_t i = 0; i < lines->size(); ++i) {
    const std::string& line = (*lines)[i];
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() && i + 1 == lines->size()) break;  // the last line cut short by a crash
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number())
      return absl::InvalidArgumentError(absl::StrCat(metrics_jsonl_path, ":", i + 1,
                                                     ": expected a JSON object with a numeric \"step\""));
    for (size_t k = 0; k < keys.size(); ++k)
      if (j.contains(keys[k]) && j[keys[k]].is_number()) values[k].emplace_back(j["step"].get<double>(), j[keys[k]].get<double>());
  }
  for (auto& v : values) std::sort(v.begin(), v.end());
  std::vector<Panel> panels;
  panels.push_back({"Training loss", "loss", "no loss values yet",
                    {{"training loss", "#1f77b4", "", values[0]}, {"eval loss", "#ff7f0e", "eval", values[1]}}});
  if (!values[2].empty())
    panels.push_back({"Reward margin (chosen minus rejected)", "margin", "",
                      {{"training", "#2ca02c", "", values[2]}, {"held out", "#ff7f0e", "eval", values[3]}}});
  if (!values[4].empty())
    panels.push_back({"Reward accuracy (chosen above rejected)", "accuracy", "",
                      {{"training", "#9467bd", "", values[4]}, {"held out", "#ff7f0e", "eval", values[5]}}});
  const double width = 800, height = 480 * static_cast<double>(panels.size());
  std::ostringstream s;
  s << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << ' ' << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect x=\"0\" y=\"0\" width=\"" << width << "\" height=\"" << height << "\" fill=\"white\"/>\n";
  for (size_t k = 0; k < panels.size(); ++k) draw_panel(s, panels[k], 480.0 * static_cast<double>(k));
  s << "</svg>\n";
  return write_text_atomic(svg_path, s.str());
}

}  // namespace loom
