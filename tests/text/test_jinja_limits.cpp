// The Jinja interpreter against hostile templates (issue 29): deep nesting, endless loops and
// values of gigabytes end quickly in an error naming the line and the limit, never in a crash, a
// hang or bad_alloc; real chat templates render far inside the limits. Then Python's integer
// semantics, against jinja2 3.1.6's output (or the exact integer it prints where Loom, with 64-bit
// integers, must refuse).
#include <gtest/gtest.h>
#include <pthread.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "text/jinja.h"

namespace loom::jinja {
namespace {

absl::StatusOr<Rendered> render(const std::string& source, const Limits& limits = {},
                                const std::vector<std::pair<std::string, Value>>& vars = {}) {
  auto t = Template::parse(source, limits);
  if (!t.ok()) return t.status();
  return t->render(vars);
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

// Hostile inputs: each must fail with `want` in the message within a bounded CPU time. The steps
// and sizes are 10 and 8 times tighter than the defaults so that the test stays fast under the
// sanitizers (the defaults take ~10x the time: up to 0.3 s each in a release build); the depths
// are the defaults.
TEST(JinjaLimits, HostileTemplatesFailQuicklyWithTheLimitNamed) {
  Limits limits;
  limits.max_steps = 2'000'000;
  limits.max_value_bytes = limits.max_output_bytes = 8 << 20;
  const struct {
    const char* name;
    std::string source;
    const char* want;
  } cases[] = {
      {"brackets", "{{ " + repeat("(", 10000) + "1" + repeat(")", 10000) + " }}",
       "line 1: nesting deeper than 256 levels (Limits::max_depth)"},
      {"lists", "{{ " + repeat("[", 10000) + repeat("]", 10000) + " }}", "nesting deeper than 256 levels"},
      {"unary minus", "{{ " + repeat("-", 10000) + "1 }}", "nesting deeper than 256 levels"},
      {"not", "{{ " + repeat("not ", 10000) + "x }}", "nesting deeper than 256 levels"},
      {"filters", "{{ 'x'" + repeat("|trim", 10000) + " }}", "nesting deeper than 256 levels"},
      {"tests", "{{ x" + repeat(" is defined", 10000) + " }}", "nesting deeper than 256 levels"},
      {"attributes", "{{ x" + repeat(".a", 100000) + " }}", "nesting deeper than 256 levels"},
      {"operators", "{{ 1" + repeat(" + 1", 100000) + " }}", "nesting deeper than 256 levels"},
      {"ifs", "\n" + repeat("{% if true %}", 10000) + repeat("{% endif %}", 10000),
       "line 2: nesting deeper than 256 levels (Limits::max_depth)"},
      {"fors", repeat("{% for x in y %}", 10000) + repeat("{% endfor %}", 10000), "nesting deeper than 256 levels"},
      {"nested range loops",
       "{% for i in range(50000) %}\n{% for j in range(50000) %}{% endfor %}{% endfor %}",
       "more than 2000000 steps (Limits::max_steps)"},
      {"string doubling", "{% set ns = namespace(s='ab') %}{% for i in range(40) %}\n{% set ns.s = ns.s + ns.s %}{% endfor %}",
       "line 2: a string of 16777216 bytes exceeds the limit of 8 MiB on one value (Limits::max_value_bytes)"},
      {"~ doubling", "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
       "Limits::max_value_bytes"},
      {"repetition", "{{ 'a' * 1000000000000 }}", "a repeated string of 1000000000000 bytes exceeds the limit"},
      {"list repetition", "{{ [1, 2] * 1000000000000 }}", "a repeated list of 2000000000000 elements exceeds"},
      {"list doubling", "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
       "a list of"},
      {"replace", "{{ ('a' * 1000000).replace('a', 'b' * 4100) }}", "replace()'s result of 4100000000 bytes exceeds"},
      {"tojson indent", "{{ [[1]] | tojson(indent=1000000000) }}", "tojson's text of"},
      {"indent", "{{ 'a\nb' | indent(1000000000000) }}", "indent()'s width of 1000000000000 bytes exceeds"},
      {"range length", "{{ range(1000000000000) | length }}", "range() of more than 100000 elements"},
      {"range of 2^64", "{{ range(-9223372036854775807, 9223372036854775807) | length }}", "range() of"},
      {"join", "{{ (['a' * 1000000] * 100) | join('') }}", "join()'s result of"},
      {"split", "{{ ('a,' * 4000000).split(',') | length }}", "split()'s result of"},
      {"characters", "{{ ('a' * 8000000) | list | length }}", "the characters of a string of 8000000 elements"},
      {"printed list", "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}",
       "(Limits::max_"},  // a printed value past max_value_bytes, or max_steps first
      {"json of a shared list",
       "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l|tojson }}",
       "(Limits::max_"},
      {"output", "{% for i in range(50000) %}{{ 'x' * 1000 }}{% endfor %}",
       "the rendered text passes 8388608 bytes (Limits::max_output_bytes"},
      {"source", "{{ x }}" + std::string(2 << 20, ' '), "the template is 2097159 bytes, more than the limit of 1048576"},
      {"nested values", "{% set ns = namespace(l=[]) %}{% for i in range(50000) %}{% set ns.l = [ns.l] %}{% endfor %}",
       "lists and dicts nested deeper than 256 levels (Limits::max_depth)"},
      {"namespace cycle", "{% set ns = namespace() %}{% set ns.me = ns %}",
       "namespace attribute 'me' cannot hold a namespace"},
      {"recursive macro", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}\n{{ f(0) }}",
       "macro 'f' called with 64 macro calls in progress (Limits::max_call_depth)"},
      {"deep recursive macro",
       "{% macro f(n) %}" + repeat("{% if true %}", 200) + "{{ f(n + 1) }}" + repeat("{% endif %}", 200) +
           "{% endmacro %}{{ f(0) }}",
       "rendering nests deeper than 1024 levels of blocks, expressions and macro calls (Limits::max_render_depth)"},
      {"deep recursive expression", "{% macro f(n) %}{{ f(n + 1)" + repeat("|trim", 200) + " }}{% endmacro %}{{ f(0) }}",
       "(Limits::max_render_depth)"},
      {"quadratic unique", "{{ (range(30000) + range(30000)) | unique | length }}", "steps (Limits::max_steps)"},
      {"integer overflow", "{% set ns = namespace(x=2) %}{% for i in range(10) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
       "integer result of 4294967296 * 4294967296 does not fit 64 bits"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::clock_t start = std::clock();  // CPU time: the CI machine is shared
    auto r = render(c.source, limits);
    const double seconds = static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC;
    ASSERT_FALSE(r.ok()) << "rendered " << r->text.size() << " bytes";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find(c.want), std::string::npos) << r.status();
    EXPECT_LT(seconds, 3.0) << r.status();
    std::printf("%-24s %.3f s\n", c.name, seconds);
  }
}

// The depth limits stop the recursion long before a thread's stack runs out: the deepest templates
// the defaults allow, and those they stop, run on a thread with a 4 MiB stack (half of Linux's
// default; a release build needs under 512 KiB, AddressSanitizer's bigger frames under 2 MiB).
TEST(JinjaLimits, DepthLimitsFitASmallStack) {
  struct Job {
    std::vector<std::string> sources;
    std::vector<absl::Status> results;
  } job;
  const std::string m = "{% macro f(n) %}";
  job.sources = {
      "{{ " + repeat("(", 250) + "1" + repeat(")", 250) + " }}",
      "{{ " + repeat("-", 250) + "1 }}",
      "{{ 'x'" + repeat("|trim", 250) + " }}",
      "{{ 1" + repeat(" + 1", 250) + " }}",
      repeat("{% if true %}", 250) + repeat("{% endif %}", 250),
      "{{ " + repeat("(", 10000) + " }}",
      m + repeat("{% if true %}", 200) + "{{ f(n + 1) }}" + repeat("{% endif %}", 200) + "{% endmacro %}{{ f(0) }}",
      m + "{{ f(n + 1)" + repeat("|trim", 200) + " }}{% endmacro %}{{ f(0) }}",
      m + "{{ f(n + 1)" + repeat(" ~ 1", 200) + " }}{% endmacro %}{{ f(0) }}",
      m + "{{ " + repeat("-", 200) + "f(n + 1) }}{% endmacro %}{{ f(0) }}",
  };
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, size_t{4} << 20), 0);
  pthread_t thread;
  ASSERT_EQ(pthread_create(
                &thread, &attr,
                [](void* p) -> void* {
                  auto* j = static_cast<Job*>(p);
                  for (const std::string& source : j->sources) {
                    auto r = render(source);
                    j->results.push_back(r.ok() ? absl::OkStatus() : r.status());
                  }
                  return nullptr;
                },
                &job),
            0);
  ASSERT_EQ(pthread_join(thread, nullptr), 0);
  pthread_attr_destroy(&attr);
  ASSERT_EQ(job.results.size(), job.sources.size());
  for (size_t i = 0; i < 5; ++i) EXPECT_TRUE(job.results[i].ok()) << i << ": " << job.results[i];
  EXPECT_NE(job.results[5].message().find("(Limits::max_depth)"), std::string::npos) << job.results[5];
  for (size_t i = 6; i < job.results.size(); ++i)
    EXPECT_NE(job.results[i].message().find("(Limits::max_render_depth)"), std::string::npos) << i << ": " << job.results[i];
}

// The defaults are the documented ones, and a value just past 64 MiB is refused before it is built.
TEST(JinjaLimits, DefaultLimits) {
  const Limits d;
  EXPECT_EQ(d.max_depth, 256);
  EXPECT_EQ(d.max_render_depth, 1024);
  EXPECT_EQ(d.max_call_depth, 64);
  EXPECT_EQ(d.max_steps, 20'000'000);
  EXPECT_EQ(d.max_output_bytes, size_t{64} << 20);
  EXPECT_EQ(d.max_value_bytes, size_t{64} << 20);
  EXPECT_EQ(d.max_source_bytes, size_t{1} << 20);
  auto r = render("{{ ('a' * 67108864) | length }}");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, "67108864");
  r = render("{{ 'a' * 67108865 }}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("a repeated string of 67108865 bytes exceeds the limit of 64 MiB"), std::string::npos)
      << r.status();
}

// A tagged string's marks count toward its size: an empty reply repeated makes no text, but a mark
// per copy.
TEST(JinjaLimits, MarksCountTowardSizes) {
  const Value c = Value::string("", {{0, 0, 1}});
  const struct {
    const char* source;
    const char* want;
  } cases[] = {
      {"{{ c * 100000 }}", "a repeated string of 2400000 bytes exceeds the limit of 1 MiB"},
      {"{% set s = ([c] * 10000) | join('') %}{{ ([s] * 10) | join('') }}", "join()'s result of"},
      {"{% for i in range(1000) %}{% for j in range(100) %}{{ c ~ c ~ c ~ c }}{% endfor %}{% endfor %}",
       "the rendered text passes 1048576 bytes"},
  };
  for (const auto& k : cases) {
    SCOPED_TRACE(k.source);
    Limits limits;
    limits.max_value_bytes = limits.max_output_bytes = 1 << 20;
    auto r = render(k.source, limits, {{"c", c}});
    ASSERT_FALSE(r.ok()) << r->marks.size() << " marks";
    EXPECT_NE(r.status().message().find(k.want), std::string::npos) << r.status();
  }
}

// Linear repetition: a megabyte of 'a' * n is built at once, not by a million copies.
TEST(JinjaLimits, RepetitionIsLinear) {
  const std::clock_t start = std::clock();
  auto r = render("{{ 'ab' * 2000000 }}{{ ([1] * 500000) | length }}");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, repeat("ab", 2000000) + "500000");
  EXPECT_LT(static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC, 2.0);  // quadratic: a minute
}

// Just inside each limit renders; the limits are the caller's to change.
TEST(JinjaLimits, InsideTheLimitsRendersAndLimitsAdjust) {
  const std::string deep = "{{ " + repeat("(", 250) + "7" + repeat(")", 250) + " }}";
  auto ok = render(deep);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->text, "7");
  const std::string blocks = repeat("{% if true %}", 250) + "y" + repeat("{% endif %}", 250);
  ASSERT_TRUE(render(blocks).ok());
  // A macro recursing 60 deep (under max_call_depth 64) through a few levels each.
  auto rec = render("{% macro f(n) %}{% if n > 0 %}({{ f(n - 1) }}){% endif %}{% endmacro %}{{ f(60) }}");
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->text, repeat("(", 60) + repeat(")", 60));

  Limits tight;
  tight.max_depth = 4;
  EXPECT_NE(render("{{ ((((1)))) }}", tight).status().message().find("nesting deeper than 4 levels"), std::string::npos);
  tight = Limits{};
  tight.max_steps = 1000;
  EXPECT_NE(render("{% for i in range(10000) %}{% endfor %}", tight).status().message().find("more than 1000 steps"),
            std::string::npos);
  tight = Limits{};
  tight.max_output_bytes = 10;
  EXPECT_NE(render("{{ 'x' * 11 }}", tight).status().message().find("passes 10 bytes"), std::string::npos);
  EXPECT_TRUE(render("{{ 'x' * 10 }}", tight).ok());
  tight = Limits{};
  tight.max_value_bytes = 1024;
  EXPECT_NE(render("{{ 'x' * 1025 }}", tight).status().message().find("exceeds the limit of 1 KiB"), std::string::npos);
  tight = Limits{};
  tight.max_call_depth = 2;
  EXPECT_NE(render("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(0) }}", tight).status().message().find("2 macro calls"),
            std::string::npos);
}

// The real chat templates of tests/fixtures/chat/templates, over a 200-message conversation, render
// under limits far tighter than the defaults: they nest 6-15 levels, render 7-12 deep and take
// 14k-29k steps here (measured when the limits were chosen).
TEST(JinjaLimits, RealTemplatesRenderFarInsideTheLimits) {
  Limits tight;
  tight.max_depth = 32;
  tight.max_render_depth = 32;
  tight.max_call_depth = 4;
  tight.max_steps = Limits{}.max_steps / 400;
  tight.max_output_bytes = Limits{}.max_output_bytes / 10;
  tight.max_value_bytes = Limits{}.max_value_bytes / 10;
  std::vector<Value> messages;
  for (int i = 0; i < 200; ++i) {
    auto m = std::make_shared<Dict>();
    m->set("role", Value::string(i % 2 ? "assistant" : "user"));
    m->set("content", Value::string(repeat(absl::StrCat("message ", i, " text. "), 20)));
    messages.push_back(Value::dict(m));
  }
  int n = 0;
  for (const auto& f : std::filesystem::directory_iterator(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/chat/templates")) {
    SCOPED_TRACE(f.path().filename().string());
    std::ifstream in(f.path());
    std::stringstream ss;
    ss << in.rdbuf();
    auto r = render(ss.str(), tight,
                    {{"messages", Value::list(messages)},
                     {"add_generation_prompt", Value::boolean(true)},
                     {"bos_token", Value::string("<s>")},
                     {"eos_token", Value::string("</s>")}});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GT(r->text.size(), 200u * 300u);
    ++n;
  }
  EXPECT_GE(n, 8);
}

// Python's integers and division, as jinja2 3.1.6 renders these templates.
TEST(JinjaLimits, IntegerSemanticsMatchPython) {
  const struct {
    const char* source;
    const char* text;
  } cases[] = {
      {"{{ -7 // 2 }}", "-4"},
      {"{{ -7 % 2 }}", "1"},
      {"{{ 7 // -2 }}", "-4"},
      {"{{ 7 % -2 }}", "-1"},
      {"{{ -7.5 // 2 }}", "-4.0"},
      {"{{ -7.5 % 2 }}", "0.5"},
      {"{{ 1 // 0.1 }}", "9.0"},
      {"{{ 1 % 0.1 }}", "0.09999999999999995"},
      {"{{ 2 ** -1 }}", "0.5"},
      {"{{ 2 ** 62 }}", "4611686018427387904"},
      {"{{ (-2) ** 63 }}", "-9223372036854775808"},
      {"{{ -9223372036854775807 - 1 }}", "-9223372036854775808"},
      {"{{ (-9223372036854775807 - 1) % -1 }}", "0"},
      {"{{ 3 * 'ab' }}", "ababab"},
      {"{{ 'ab' * 3 }}", "ababab"},
      {"{{ 'ab' * -1 }}", ""},
      {"{{ [1] * 3 }}", "[1, 1, 1]"},
      {"{{ (1,) * 2 }}", "(1, 1)"},
      {"{{ (1,) + (2,) }}", "(1, 2)"},
      {"{{ 5 / 2 }}", "2.5"},
      {"{{ 4 / 2 }}", "2.0"},
      {"{{ 2 ** 0.5 }}", "1.4142135623730951"},
      {"{{ 10 ** 18 }}", "1000000000000000000"},
      {"{{ 0 ** 0 }}", "1"},
      {"{{ -2 ** 2 }}", "4"},
      {"{{ 2 ** 3 ** 2 }}", "64"},
      {"{{ 4611686018427387904 > 4611686018427387903 }}", "True"},
      {"{{ '12'|int + 1 }}", "13"},
      {"{{ ' 12 '|int }}", "12"},
      {"{{ '1_000'|int }}", "1000"},
      {"{{ '0x1A'|int }}", "0"},
      {"{{ '4.7'|int }}", "4"},
      {"{{ 'nan'|int }}", "0"},
      {"{{ 'inf'|int }}", "0"},
      {"{{ '1e3'|int }}", "1000"},
      {"{{ '1e999'|float }}", "inf"},
      {"{{ 'abc'|float }}", "0.0"},
      {"{{ -5|abs }}", "5"},
      {"{{ range(5, 0, -2)|list }}", "[5, 3, 1]"},
      {"{{ [1, 2, 3, 4, 5][::9223372036854775807] }}", "[1]"},
      {"{{ 1e999 }}", "inf"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.source);
    auto r = render(c.source);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->text, c.text);
  }
  // jinja2 prints these exactly (Python's big integers, given in the comments); Loom refuses them,
  // never wraps or traps.
  const char* too_large[] = {
      "{{ (-9223372036854775807 - 1) // -1 }}",  // 9223372036854775808
      "{{ 9223372036854775807 + 1 }}",           // 9223372036854775808
      "{{ 10 ** 19 }}",                          // 10000000000000000000
      "{{ 2 ** 64 }}",                           // 18446744073709551616
      "{{ 9223372036854775807 * 2 }}",           // 18446744073709551614
      "{{ -(-9223372036854775807 - 1) }}",       // 9223372036854775808
      "{{ (-9223372036854775807 - 1) | abs }}",  // 9223372036854775808
      "{{ 2 ** 1000000000000 }}",                // a number of 301029995664 digits
      "{{ 99999999999999999999 }}",              // 99999999999999999999 (a literal)
  };
  for (const char* source : too_large) {
    SCOPED_TRACE(source);
    auto r = render(source);
    ASSERT_FALSE(r.ok()) << r->text;
    EXPECT_NE(r.status().message().find("does not fit 64 bits"), std::string::npos) << r.status();
  }
  // ZeroDivisionError in jinja2; a clear error here.
  const struct {
    const char* source;
    const char* want;
  } errors[] = {
      {"{{ 1 // 0 }}", "integer division or modulo by zero"},
      {"{{ 1 % 0 }}", "integer division or modulo by zero"},
      {"{{ 1 / 0 }}", "division by zero"},
      {"{{ 1.5 // 0 }}", "float floor division by zero"},
      {"{{ 0 ** -1 }}", "0.0 cannot be raised to a negative power"},
      {"{{ 7 is divisibleby 0 }}", "integer division or modulo by zero"},
  };
  for (const auto& c : errors) {
    SCOPED_TRACE(c.source);
    auto r = render(c.source);
    ASSERT_FALSE(r.ok()) << r->text;
    EXPECT_NE(r.status().message().find(c.want), std::string::npos) << r.status();
  }
  // INT64_MIN divisible by -1 (a C++ trap): True in Python.
  auto r = render("{{ (-9223372036854775807 - 1) is divisibleby(-1) }}");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, "True");
}

}  // namespace
}  // namespace loom::jinja
