// Jinja values as text: Python's str() and repr() and json.dumps. A printed form can be far larger
// than its value (one list shared a million times), so the text is checked against
// Limits::max_value_bytes as it grows and its work counted against the render's steps.
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "text/jinja_limits.h"
#include "text/jinja_value.h"

namespace loom::jinja {

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's repr layout: fixed for 1e-4 <= |d| < 1e16.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, end);  // e.g. "-1.2345e+02"
  const size_t e = sci.find('e');
  const int exp10 = std::stoi(sci.substr(e + 1));
  std::string sign, digits;
  for (size_t i = 0; i < e; ++i) {
    if (sci[i] == '-') sign.assign(1, '-');
    else if (sci[i] != '.') digits += sci[i];
  }
  if (exp10 < -4 || exp10 >= 16) {
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return sign + m + ebuf;
  }
  std::string out;
  if (exp10 < 0) {
    out = "0." + std::string(-exp10 - 1, '0') + digits;
  } else if (static_cast<int>(digits.size()) <= exp10 + 1) {
    out = digits + std::string(exp10 + 1 - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, exp10 + 1) + "." + digits.substr(exp10 + 1);
  }
  return sign + out;
}

namespace {

// Text that grows under the render's limits: each node printed is a step, each 4 KiB more are 64.
class Printer {
 public:
  explicit Printer(std::string_view what) : what_(what) {}
  void add(std::string_view s) {
    budget::check_size(out_.size() + s.size(), what_);
    out_.append(s);
    account();
  }
  void add(char c) { add(std::string_view(&c, 1)); }
  void spaces(size_t n) {
    budget::check_size(out_.size() + n, what_);
    out_.append(n, ' ');
    account();
  }
  void node() { budget::step(); }
  std::string take() {
    budget::bytes(out_.size() - counted_);
    return std::move(out_);
  }

 private:
  std::string_view what_;
  std::string out_;
  size_t counted_ = 0;
  void account() {
    if (out_.size() - counted_ >= 4096) budget::bytes(out_.size() - counted_), counted_ = out_.size();
  }
};

// Python's repr() of a str: single quotes unless the text holds ' and no ".
void repr_string(const std::string& s, Printer& p) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  p.add(q);
  size_t run = 0;  // start of the bytes copied as they are
  const auto flush = [&](size_t i) {
    p.add(std::string_view(s).substr(run, i - run));
    run = i + 1;
  };
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == q || c == '\\') flush(i), p.add('\\'), p.add(static_cast<char>(c));
    else if (c == '\n') flush(i), p.add("\\n");
    else if (c == '\r') flush(i), p.add("\\r");
    else if (c == '\t') flush(i), p.add("\\t");
    else if (c < 0x20 || c == 0x7F) flush(i), p.add(absl::StrFormat("\\x%02x", c));
  }
  flush(s.size());
  p.add(q);
}

void repr_value(const Value& v, Printer& p) {
  p.node();
  switch (v.type()) {
    case Value::Type::kString: repr_string(v.str(), p); return;
    case Value::Type::kList: {
      const bool tuple = v.list_obj().tuple;
      p.add(tuple ? '(' : '[');
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i) p.add(", ");
        repr_value(v.items()[i], p);
      }
      if (tuple && v.items().size() == 1) p.add(',');
      p.add(tuple ? ')' : ']');
      return;
    }
    case Value::Type::kDict: {
      const bool ns = v.dict_obj()->is_namespace;
      p.add(ns ? "<Namespace {" : "{");
      bool first = true;
      for (const auto& [k, e] : v.dict_obj()->items) {
        if (!first) p.add(", ");
        first = false;
        repr_string(k, p);
        p.add(": ");
        repr_value(e, p);
      }
      p.add(ns ? "}>" : "}");
      return;
    }
    case Value::Type::kUndefined: return;
    case Value::Type::kNone: p.add("None"); return;
    case Value::Type::kBool: p.add(v.as_bool() ? "True" : "False"); return;
    case Value::Type::kInt: p.add(std::to_string(v.as_int())); return;
    case Value::Type::kFloat: p.add(format_float(v.as_double())); return;
    case Value::Type::kCallable: p.add(absl::StrCat("<function ", v.hint(), ">")); return;
  }
}

void json_string(const std::string& s, Printer& p) {
  p.add('"');
  size_t run = 0;
  const auto flush = [&](size_t i) {
    p.add(std::string_view(s).substr(run, i - run));
    run = i + 1;
  };
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': flush(i), p.add("\\\""); break;
      case '\\': flush(i), p.add("\\\\"); break;
      case '\n': flush(i), p.add("\\n"); break;
      case '\r': flush(i), p.add("\\r"); break;
      case '\t': flush(i), p.add("\\t"); break;
      case '\b': flush(i), p.add("\\b"); break;
      case '\f': flush(i), p.add("\\f"); break;
      default:
        if (c < 0x20 || c == 0x7F) flush(i), p.add(absl::StrFormat("\\u%04x", c));
    }
  }
  flush(s.size());
  p.add('"');
}

// indent < 0: none. A newline and indent*depth spaces can pass the limit at once (indent=10**9),
// so the size is checked before the spaces are made.
void json_value(const Value& v, int64_t indent, int depth, Printer& p) {
  p.node();
  const auto newline = [&](int d) {
    if (indent < 0) return;
    p.add('\n');
    const uint64_t limit = budget::limits().max_value_bytes;
    const uint64_t n = static_cast<uint64_t>(indent) > limit ? limit + 1 : static_cast<uint64_t>(indent) * d;
    p.spaces(n);
  };
  const char* item_sep = indent >= 0 ? "," : ", ";
  switch (v.type()) {
    case Value::Type::kUndefined: fail("tojson: the value is undefined");
    case Value::Type::kNone: p.add("null"); return;
    case Value::Type::kBool: p.add(v.as_bool() ? "true" : "false"); return;
    case Value::Type::kInt: p.add(std::to_string(v.as_int())); return;
    case Value::Type::kFloat: {
      const double d = v.as_double();
      p.add(std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : format_float(d));
      return;
    }
    case Value::Type::kString: json_string(v.str(), p); return;
    case Value::Type::kList: {
      if (v.items().empty()) {
        p.add("[]");
        return;
      }
      p.add('[');
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i) p.add(item_sep);
        newline(depth + 1);
        json_value(v.items()[i], indent, depth + 1, p);
      }
      newline(depth);
      p.add(']');
      return;
    }
    case Value::Type::kDict: {
      if (v.dict_obj()->items.empty()) {
        p.add("{}");
        return;
      }
      p.add('{');
      bool first = true;
      for (const auto& [k, e] : v.dict_obj()->items) {
        if (!first) p.add(item_sep);
        first = false;
        newline(depth + 1);
        json_string(k, p);
        p.add(": ");
        json_value(e, indent, depth + 1, p);
      }
      newline(depth);
      p.add('}');
      return;
    }
    case Value::Type::kCallable: fail("tojson: a function is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, int64_t indent) {
  Printer p("tojson's text");
  json_value(v, indent, 0, p);
  return p.take();
}

std::string Value::to_str() const {
  if (type_ == Type::kUndefined) return "";
  if (type_ == Type::kString) return str();
  return repr();
}

std::string Value::repr() const {
  Printer p("a printed value");
  repr_value(*this, p);
  return p.take();
}

}  // namespace loom::jinja
