// Loom's Jinja interpreter against Jinja itself: tests/fixtures/chat/jinja_cases.json holds small
// templates, one language feature each, rendered by transformers' chat-template environment
// (tools/reference/make_chat_template_fixtures.py); the interpreter must print the same text, and fail where
// Jinja fails. Then the interpreter's own contracts: error lines, marks through string operations.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"
#include "text/jinja.h"

namespace loom::jinja {
namespace {

nlohmann::json load(const std::string& name) {
  std::ifstream f(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/chat/" + name);
  EXPECT_TRUE(f.good()) << "missing tests/fixtures/chat/" << name
                        << " (run tools/reference/make_chat_template_fixtures.py)";
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

absl::StatusOr<Rendered> render(const std::string& source, const std::vector<std::pair<std::string, Value>>& vars = {}) {
  auto t = Template::parse(source);
  if (!t.ok()) return t.status();
  return t->render(vars);
}

TEST(Jinja, MatchesJinjaOnEachFeature) {
  const nlohmann::json cases = load("jinja_cases.json");
  ASSERT_GE(cases.size(), 50u);
  int errors = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>() + ": " + c["template"].get<std::string>());
    std::vector<std::pair<std::string, Value>> vars;
    for (const auto& [k, v] : c["variables"].items()) vars.emplace_back(k, Value::from_json(v));
    auto r = render(c["template"].get<std::string>(), vars);
    if (c.contains("error")) {
      ++errors;
      ASSERT_FALSE(r.ok()) << "Jinja says " << c["error"] << " but Loom rendered " << r->text;
      if (c.contains("line")) {
        EXPECT_NE(r.status().message().find("line " + std::to_string(c["line"].get<int>()) + ":"), std::string::npos)
            << r.status();
      }
      continue;
    }
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->text, c["text"].get<std::string>());
  }
  EXPECT_GE(errors, 8);
}

TEST(Jinja, ErrorsNameTheTemplateLine) {
  const struct {
    const char* source;
    const char* want;
  } cases[] = {
      {"a\n{{ raise_exception('roles must alternate') }}", "line 2: raise_exception: roles must alternate"},
      {"a\nb\n{% include 'x.jinja' %}", "line 3: unsupported tag '{% include %}'"},
      {"{% if x %}\n{{ y | frobnicate }}{% endif %}", "line 2: unknown or unsupported filter 'frobnicate'"},
      {"\n\n{{ x is frobnicated }}", "line 3: unknown or unsupported test 'frobnicated'"},
      {"{% for m in messages %}\n\n{{ m.content + 1 }}{% endfor %}", "line 3: can only concatenate str"},
      {"{% if true %}\nnever closed", "line 1: block is never closed: expected elif or else or endif"},
      {"x\n{{ missing.attr }}", "line 2: 'missing' is undefined"},
      {"{% call foo() %}{% endcall %}", "line 1: unsupported tag '{% call %}'"},
      {"{{ 'abc' | upper }}\n{{ 'été' | upper }}", "line 2: upper() of non-ASCII text is not supported"},
      {"{% break %}", "line 1: {% break %} outside a for loop"},
      {"{{ 'unterminated }}", "line 1: string literal is never closed"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.source);
    Value messages = Value::from_json(nlohmann::json::parse(R"([{"role": "user", "content": "hi"}])"));
    auto r = render(c.source, {{"messages", messages}});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(c.want), std::string::npos) << r.status();
  }
}

// Marks follow the tagged text through what templates do to message content.
TEST(Jinja, MarksFollowTaggedText) {
  const Value content = Value::string("  Hello\n", {{0, 8, 7}});
  const struct {
    const char* source;
    std::string printed;  // the output text the mark must cover
  } cases[] = {
      {"[{{ c }}]", "  Hello\n"},
      {"[{{ c | trim }}]", "Hello"},
      {"[{{ c.strip() }}]", "Hello"},
      {"[{{ '<' + c.lstrip() + '>' }}]", "Hello\n"},
      {"[{{ c[2:4] }}]", "He"},
      {"{% set x = 'a' ~ c.split('l')[-1] %}[{{ x }}]", "o\n"},
      {"{% set ns = namespace(t='') %}{% set ns.t = c.rstrip() %}<{{ ns.t }}>", "  Hello"},
      {"{% macro m(x) %}<{{ x|trim }}>{% endmacro %}{{ m(c) }}", "Hello"},
      {"{% set b %}[{{ c|trim }}]{% endset %}{{ b }}", "Hello"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.source);
    auto r = render(c.source, {{"c", content}});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->marks.size(), 1u) << r->text;
    EXPECT_EQ(r->marks[0].tag, 7);
    EXPECT_EQ(r->text.substr(r->marks[0].begin, r->marks[0].end - r->marks[0].begin), c.printed) << r->text;
  }
  // Text that is replaced, case-mapped or serialized is no longer the message's own.
  for (const char* source : {"{{ c.replace('l', 'L') }}", "{{ c|tojson }}", "{{ c|upper }}", "{{ 'x' }}"}) {
    auto r = render(source, {{"c", content}});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->marks.empty()) << source;
  }
  // A blank reply stripped to nothing still says where it was.
  auto blank = render("<{{ c|trim }}>", {{"c", Value::string(" \n ", {{0, 3, 1}})}});
  ASSERT_TRUE(blank.ok()) << blank.status();
  ASSERT_EQ(blank->marks.size(), 1u);
  EXPECT_EQ(blank->marks[0], (Mark{1, 1, 1}));
}

}  // namespace
}  // namespace loom::jinja
