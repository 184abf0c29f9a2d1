// Loom's Jinja interpreter: the subset of Jinja2 that Hugging Face chat templates use, with the
// settings transformers renders them with (trim_blocks, lstrip_blocks, loop controls,
// raise_exception, strftime_now, tojson without ASCII escaping). Statements: if/elif/else, for
// (loop.*, else, inline if), set (names, namespace attributes, blocks), macro, break/continue,
// filter blocks, generation blocks. Expressions: literals, lists, dicts, attribute/index/slice,
// calls, Python's operators, `~`, `in`, `x if c else y`, filters and tests (text/jinja_builtins.cpp).
// Anything else — include, import, extends, call blocks, an unknown filter or test — is an error
// naming the template line, never a silent difference. Parsing and rendering stay within Limits
// (text/jinja_limits.h): a hostile template gets an error, not a crash or an exhausted machine.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "text/jinja_limits.h"
#include "text/jinja_value.h"

namespace loom::jinja {

struct Stmt;

struct Rendered {
  std::string text;
  std::vector<Mark> marks;  // output byte ranges printed from tagged strings (Value::string marks)
};

class Template {
 public:
  // Parses source; a syntax error, an unsupported construct or nesting past limits.max_depth is
  // InvalidArgument "line N: ...". The limits stay with the template for its renders.
  static absl::StatusOr<Template> parse(const std::string& source, const Limits& limits = {});
  // Renders with these top-level variables (range, namespace, dict, raise_exception and
  // strftime_now are added). A runtime error is InvalidArgument "line N: ..."; a
  // raise_exception("msg") in the template is "line N: raise_exception: msg"; a limit passed is
  // InvalidArgument "line N: ... (Limits::<field>)".
  absl::StatusOr<Rendered> render(const std::vector<std::pair<std::string, Value>>& vars) const;
  const Limits& limits() const { return limits_; }

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body_;
  Limits limits_;
};

}  // namespace loom::jinja
