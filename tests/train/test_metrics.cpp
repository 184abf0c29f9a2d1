// MetricsWriter (metrics.jsonl lines, flushing, resume truncation) and the loss SVG: well-formed,
// labelled, and carrying every point where the axes put it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/temp_dir.h"
#include "nlohmann/json.hpp"
#include "train/metrics.h"

namespace loom {
namespace {

using test::TempDir;

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

StepMetrics metrics(int64_t step, double loss) {
  StepMetrics m;
  m.step = step;
  m.epoch = step / 10.0;
  m.loss = loss;
  m.lr = 1e-4 * step;
  m.grad_norm = 0.25 * step;
  m.target_tokens = 1000 + step;
  m.input_tokens = 2000 + step;
  m.tokens_per_s = 12345.5;
  m.mem_bytes = int64_t{3} << 32;
  return m;
}

TEST(Metrics, JsonLineFieldsInOrder) {
  const std::string line = metrics_json_line(metrics(3, 2.5));
  EXPECT_EQ(line,
            "{\"step\":3,\"epoch\":0.3,\"loss\":2.5,\"lr\":0.00030000000000000003,\"grad_norm\":0.75,\"target_tokens\":1003,"
            "\"input_tokens\":2003,\"tokens_per_s\":12345.5,\"mem_bytes\":12884901888}");
  auto j = nlohmann::json::parse(metrics_json_line(metrics(1, std::numeric_limits<double>::quiet_NaN())));
  EXPECT_TRUE(j["loss"].is_null());
}

TEST(Metrics, WriterFlushesEachLineAndResumeTruncates) {
  TempDir dir;
  const std::string out = dir.file("run/sub");  // created on open
  {
    auto w = MetricsWriter::open(out);
    ASSERT_TRUE(w.ok()) << w.status();
    for (int s = 1; s <= 5; ++s) {
      ASSERT_TRUE(w->write(metrics(s, 5.0 - s * 0.5)).ok());
      EXPECT_EQ(lines_of(w->path()).size(), static_cast<size_t>(s)) << "line not flushed after step " << s;
    }
    EXPECT_EQ(w->path(), out + "/metrics.jsonl");
  }
  {
    auto w = MetricsWriter::open(out, /*resume_step=*/3);
    ASSERT_TRUE(w.ok()) << w.status();
    auto kept = lines_of(w->path());
    ASSERT_EQ(kept.size(), 3u);
    EXPECT_EQ(nlohmann::json::parse(kept[2])["step"], 3);
    ASSERT_TRUE(w->write(metrics(4, 1.0)).ok());
  }
  auto lines = lines_of(out + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(nlohmann::json::parse(lines[3])["loss"], 1.0);
  auto fresh = MetricsWriter::open(out);  // a new run starts an empty file at its first step
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(lines_of(out + "/metrics.jsonl").size(), 4u) << "a run that has trained no step yet keeps the old lines";
  ASSERT_TRUE(fresh->write(metrics(1, 2.0)).ok());
  lines = lines_of(out + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(lines[0])["loss"], 2.0);
}

// Tags open and close in order (self-closing ones aside); the text starts with the XML declaration.
void expect_well_formed(const std::string& svg) {
  ASSERT_EQ(svg.rfind("<?xml", 0), 0u);
  std::vector<std::string> stack;
  std::regex tag(R"(<(/?)([a-zA-Z]+)[^>]*?(/?)>)");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tag); it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[2];
    if ((*it)[1] == "/") {
      ASSERT_FALSE(stack.empty()) << "</" << name << "> closes nothing";
      ASSERT_EQ(stack.back(), name);
      stack.pop_back();
    } else if ((*it)[3] != "/") {
      stack.push_back(name);
    }
  }
  EXPECT_TRUE(stack.empty()) << "unclosed <" << (stack.empty() ? "" : stack.back()) << ">";
  EXPECT_EQ(svg.find('&'), std::string::npos);
}

std::vector<std::pair<double, double>> polyline_points(const std::string& svg) {
  std::smatch m;
  std::vector<std::pair<double, double>> pts;
  if (!std::regex_search(svg, m, std::regex("<polyline[^>]*points=\"([^\"]*)\""))) return pts;
  std::istringstream in(m[1].str());
  for (std::string p; in >> p;) {
    const size_t comma = p.find(',');
    pts.emplace_back(std::stod(p.substr(0, comma)), std::stod(p.substr(comma + 1)));
  }
  return pts;
}

TEST(LossSvg, WellFormedAndCarriesEveryPoint) {
  TempDir dir;
  const std::vector<double> losses = {4.1, 3.7, 3.9, 2.2, 2.5, 1.6, 1.65, 0.9, 1.3, 0.75, 0.8};
  {
    auto w = MetricsWriter::open(dir.path());
    ASSERT_TRUE(w.ok());
    for (size_t i = 0; i < losses.size(); ++i) ASSERT_TRUE(w->write(metrics(i + 1, losses[i])).ok());
    ASSERT_TRUE(w->write(metrics(99, std::numeric_limits<double>::quiet_NaN())).ok());  // null: left out
  }
  const std::string svg_path = dir.file("loss.svg");
  ASSERT_TRUE(write_loss_svg(dir.file("metrics.jsonl"), svg_path).ok());
  const std::string svg = text_of(svg_path);
  expect_well_formed(svg);
  EXPECT_FALSE(std::filesystem::exists(svg_path + ".tmp"));
  for (const char* s : {"<svg", "Training loss", ">step<", ">loss<", "<polyline"}) EXPECT_NE(svg.find(s), std::string::npos) << s;
  // Tick labels: steps 1..11 give the axis 0..12 in steps of 2; losses 0.75..4.1 give 0..5 in steps of 1.
  for (const char* s : {">0<", ">12<", ">10<", ">5<", ">4<"}) EXPECT_NE(svg.find(s), std::string::npos) << s;

  auto pts = polyline_points(svg);
  ASSERT_EQ(pts.size(), losses.size());
  // The plot area is x in [80, 770] for steps [0, 12], y in [50, 420] for losses [5, 0].
  for (size_t i = 0; i < pts.size(); ++i) {
    EXPECT_NEAR(pts[i].first, 80 + (i + 1) / 12.0 * 690, 0.01) << i;
    EXPECT_NEAR(pts[i].second, 50 + (5.0 - losses[i]) / 5.0 * 370, 0.01) << i;
  }
}

TEST(LossSvg, EvalLossIsASecondLineWithALegend) {
  TempDir dir;
  {
    auto w = MetricsWriter::open(dir.path());
    ASSERT_TRUE(w.ok());
    for (int i = 1; i <= 10; ++i) {
      StepMetrics m = metrics(i, 5.0 - 0.4 * i);  // 4.6 .. 1.0
      if (i == 5) m.eval_loss = 6.0;              // above every training loss: the axis must reach it
      if (i == 10) m.eval_loss = 1.5;
      ASSERT_TRUE(w->write(m).ok());
    }
  }
  ASSERT_TRUE(write_loss_svg(dir.file("metrics.jsonl"), dir.file("loss.svg")).ok());
  const std::string svg = text_of(dir.file("loss.svg"));
  expect_well_formed(svg);
  for (const char* s : {">training loss<", ">eval loss<", ">6<", ">1<"}) EXPECT_NE(svg.find(s), std::string::npos) << s;
  EXPECT_EQ(polyline_points(svg).size(), 10u);  // the training line comes first
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, std::regex("<polyline class=\"eval\"[^>]*points=\"([^\"]*)\"")));
  // x in [80, 770] for steps [0, 10], y in [50, 420] for losses [6, 1].
  EXPECT_EQ(m[1].str(), "425.00,50.00 770.00,383.00");
}

// A preference objective's metrics add two charts below the loss: the reward margin and the reward
// accuracy, each with its held-out values, each 480 high.
TEST(LossSvg, PreferenceRunsAlsoDrawMarginAndAccuracy) {
  TempDir dir;
  {
    auto w = MetricsWriter::open(dir.path());
    ASSERT_TRUE(w.ok());
    for (int i = 1; i <= 4; ++i) {
      StepMetrics m = metrics(i, 0.7 - 0.1 * i);
      m.extra = {{"rewards/margins", 0.5 * i}, {"rewards/accuracies", 0.25 * i}};
      if (i == 4) m.eval_loss = 0.4, m.extra.push_back({"eval_rewards/margins", 1.0}), m.extra.push_back({"eval_rewards/accuracies", 0.5});
      ASSERT_TRUE(w->write(m).ok());
    }
  }
  ASSERT_TRUE(write_loss_svg(dir.file("metrics.jsonl"), dir.file("loss.svg")).ok());
  const std::string svg = text_of(dir.file("loss.svg"));
  expect_well_formed(svg);
  for (const char* s : {"height=\"1440\"", ">Reward margin (chosen minus rejected)<", ">Reward accuracy (chosen above rejected)<",
                        "translate(0 480)", "translate(0 960)", ">held out<"})
    EXPECT_NE(svg.find(s), std::string::npos) << s;
  // Three training lines and three held-out ones (one point each), in chart order.
  const std::regex line("<polyline( class=\"eval\")?[^>]*points=\"([^\"]*)\"");
  std::vector<std::string> got;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), line); it != std::sregex_iterator(); ++it)
    got.push_back(std::string((*it)[1].matched ? "eval " : "") + (*it)[2].str());
  ASSERT_EQ(got.size(), 6u);
  // The margin chart: steps 1..4 (ticks of 1: the axis is [1, 4]) in x [80, 770], margins 0.5..2
  // (ticks of 0.5: [0.5, 2]) in y [420, 50]; the held-out margin 1.0 at step 4.
  EXPECT_EQ(got[2], "80.00,420.00 310.00,296.67 540.00,173.33 770.00,50.00");
  EXPECT_EQ(got[3], "eval 770.00,296.67");
}

TEST(LossSvg, SinglePointEmptyAndDamagedFiles) {
  TempDir dir;
  const std::string jsonl = dir.file("m.jsonl"), svg = dir.file("out.svg");
  auto put = [&](const std::string& text) { std::ofstream(jsonl, std::ios::trunc) << text; };

  put(metrics_json_line(metrics(7, 2.0)) + "\n");
  ASSERT_TRUE(write_loss_svg(jsonl, svg).ok());
  expect_well_formed(text_of(svg));
  EXPECT_EQ(polyline_points(text_of(svg)).size(), 1u);
  EXPECT_NE(text_of(svg).find("<circle"), std::string::npos);

  put("");
  ASSERT_TRUE(write_loss_svg(jsonl, svg).ok());
  expect_well_formed(text_of(svg));
  EXPECT_NE(text_of(svg).find("no loss values yet"), std::string::npos);

  // A crash mid-write leaves a partial last line: ignored.
  put(metrics_json_line(metrics(1, 3.0)) + "\n" + metrics_json_line(metrics(2, 2.0)) + "\n{\"step\":3,\"lo");
  ASSERT_TRUE(write_loss_svg(jsonl, svg).ok());
  EXPECT_EQ(polyline_points(text_of(svg)).size(), 2u);

  // Damage anywhere else is an error naming the file and line.
  put(metrics_json_line(metrics(1, 3.0)) + "\nnot json\n" + metrics_json_line(metrics(3, 2.0)) + "\n");
  auto st = write_loss_svg(jsonl, svg);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(jsonl + ":2"), std::string::npos) << st;

  EXPECT_FALSE(write_loss_svg(dir.file("missing.jsonl"), svg).ok());
}

}  // namespace
}  // namespace loom
