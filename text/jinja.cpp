// Loom's Jinja interpreter: parse once, render many times; template errors become absl::Status.
#include "text/jinja.h"

#include <new>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "text/jinja_interp.h"

namespace loom::jinja {
namespace {

absl::Status to_status(const Error& e) {
  return absl::InvalidArgumentError(
      absl::StrCat("line ", e.line, ": ", e.raised ? "raise_exception: " : "", e.message));
}

}  // namespace

absl::StatusOr<Template> Template::parse(const std::string& source, const Limits& limits) {
  if (source.size() > limits.max_source_bytes)
    return absl::InvalidArgumentError(absl::StrCat("the template is ", source.size(), " bytes, more than the limit of ",
                                                   limits.max_source_bytes, " (Limits::max_source_bytes)"));
  try {
    Template t;
    t.body_ = std::make_shared<const Body>(jinja::parse(lex(source), limits));
    t.limits_ = limits;
    return t;
  } catch (const Error& e) {
    return to_status(e);
  }
}

absl::StatusOr<Rendered> Template::render(const std::vector<std::pair<std::string, Value>>& vars) const {
  const budget::Scope scope(limits_);
  Interp::Frame globals;
  add_globals(&globals);
  Interp::Frame top{vars, &globals};
  Interp in(&top, limits_);
  Output out;
  try {
    in.exec(*body_, out);
  } catch (const Error& e) {
    Error located = e;
    if (located.line == 0) located.line = in.line();
    return to_status(located);
  } catch (const std::bad_alloc&) {  // the limits should make this unreachable; never a crash
    return absl::ResourceExhaustedError(absl::StrCat("line ", in.line(), ": out of memory while rendering"));
  } catch (const std::length_error&) {
    return absl::ResourceExhaustedError(absl::StrCat("line ", in.line(), ": out of memory while rendering"));
  }
  return Rendered{std::move(out.text), std::move(out.marks)};
}

}  // namespace loom::jinja
