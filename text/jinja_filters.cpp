// Jinja filters as chat templates use them (trim, tojson, length, default, first/last, join,
// replace, items, list, string, int/float, selectattr/rejectattr/select/reject/map, sort, unique,
// min/max, sum, reverse, round, abs, indent, upper/lower/title/capitalize, safe, dictsort), with
// Python's semantics; string helpers in jinja_builtins_internal.h.
#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "text/jinja_builtins_internal.h"
#include "text/jinja_interp.h"

namespace loom::jinja {
namespace {

void trim_ascii_space(std::string_view& s) {
  const auto space = [](char c) { return static_cast<unsigned char>(c) < 0x80 && is_python_space(static_cast<unsigned char>(c)); };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
}

// Python's int(text) (digits with single underscores between them, a sign, surrounding blanks);
// nullopt when the text is no integer, an error when it does not fit 64 bits.
std::optional<int64_t> parse_int(std::string_view s) {
  trim_ascii_space(s);
  const bool negative = !s.empty() && s[0] == '-';
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  if (s.empty() || s.front() == '_' || s.back() == '_' || s.find("__") != std::string_view::npos) return std::nullopt;
  uint64_t mag = 0;
  for (char c : s) {
    if (c == '_') continue;
    if (c < '0' || c > '9') return std::nullopt;
    if (mag > (uint64_t{1} << 63) / 10 || mag * 10 + static_cast<uint64_t>(c - '0') > (uint64_t{1} << 63) - !negative)
      fail(absl::StrCat("int: ", std::string(s.substr(0, 40)), " does not fit 64 bits (Loom's integers are 64-bit)"));
    mag = mag * 10 + static_cast<uint64_t>(c - '0');
  }
  return negative ? static_cast<int64_t>(0 - mag) : static_cast<int64_t>(mag);
}

// Python's float(text): decimal or exponent notation, inf/infinity/nan, a sign, surrounding blanks.
std::optional<double> parse_float(std::string_view s) {
  trim_ascii_space(s);
  double sign = 1;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) sign = s[0] == '-' ? -1 : 1, s.remove_prefix(1);
  const std::string word = lower_ascii(std::string(s.substr(0, 9)));
  if (word == "inf" || word == "infinity") return sign * HUGE_VAL;
  if (word == "nan") return std::nan("");
  std::string digits;  // underscores only between digits
  for (size_t i = 0; i < s.size(); ++i) {
    const bool between = i > 0 && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
                         std::isdigit(static_cast<unsigned char>(s[i + 1]));
    if (s[i] == '_' && between) continue;
    if (!std::isdigit(static_cast<unsigned char>(s[i])) && s[i] != '.' && s[i] != 'e' && s[i] != 'E' && s[i] != '+' &&
        s[i] != '-')
      return std::nullopt;
    digits += s[i];
  }
  if (digits.empty() || digits[0] == '+' || digits[0] == '-') return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(digits.c_str(), &end);  // only digits . e + - are left: no hex, no words
  if (end != digits.c_str() + digits.size()) return std::nullopt;
  return sign * d;  // 1e999 is inf, as Python's float()
}

// The int and float filters (Jinja's do_int / do_float): the default where Python's int() or
// float() raises (ValueError, OverflowError); integers past 64 bits are errors.
Value to_number(const Value& v, bool integer, const Value& dflt) {
  std::optional<double> d;
  if (v.is_number() && v.type() != Value::Type::kFloat) {
    if (integer) return Value::integer(v.as_int());
    d = static_cast<double>(v.as_int());
  } else if (v.type() == Value::Type::kFloat) {
    d = v.as_double();
  } else if (v.is_string()) {
    if (integer)
      if (const std::optional<int64_t> i = parse_int(v.str())) return Value::integer(*i);
    d = parse_float(v.str());
  }
  if (!d) return dflt;
  if (!integer) return Value::number(*d);
  if (std::isnan(*d)) return dflt;
  if (std::isinf(*d)) return dflt;  // jinja2 3.1 catches the OverflowError too
  if (*d >= 0x1p63 || *d < -0x1p63)
    fail(absl::StrCat("int: ", format_float(*d), " does not fit 64 bits (Loom's integers are 64-bit)"));
  return Value::integer(static_cast<int64_t>(*d));
}

}  // namespace

bool is_filter(const std::string& n) {
  static const char* kNames[] = {"abs",   "capitalize", "count", "d",         "default", "dictsort", "first",
                                 "float", "indent",     "int",   "items",     "join",    "last",     "length",
                                 "list",  "lower",      "map",   "max",       "min",     "reject",   "rejectattr",
                                 "replace", "reverse",  "round", "safe",      "select",  "selectattr", "sort",
                                 "string", "sum",       "title", "tojson",    "trim",    "unique",   "upper"};
  return std::find(std::begin(kNames), std::end(kNames), n) != std::end(kNames);
}

Value apply_filter(Interp& in, const std::string& f, const Value& v, const CallArgs& a) {
  if (f == "trim") return strip(v, true, true, arg(a, 0, "chars", kNone));
  if (f == "tojson") {
    const Value indent = arg(a, 0, "indent", kNone);
    if (!indent.is_none() && (!indent.is_number() || indent.type() == Value::Type::kFloat))
      fail(absl::StrCat("tojson's indent must be an integer, got ", indent.type_name()));
    // json.dumps: a negative indent indents by nothing, but still breaks lines.
    return Value::string(to_json(v, indent.is_none() ? -1 : std::max<int64_t>(indent.as_int(), 0)));
  }
  if (f == "length" || f == "count") return Value::integer(length(v));
  if (f == "upper" || f == "lower" || f == "title" || f == "capitalize")
    return Value::string(ascii_case(need_string(v, f), f));
  if (f == "default" || f == "d") {
    const bool boolean = arg(a, 1, "boolean", kFalse).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return arg(a, 0, "default_value", Value::string(""));
    return v;
  }
  if (f == "first" || f == "last") {
    const std::vector<Value> xs = v.iterate();
    if (xs.empty()) return Value::undefined(absl::StrCat(f, " of an empty sequence"));
    return f == "first" ? xs.front() : xs.back();
  }
  if (f == "join") return join(in, v, arg(a, 0, "d", Value::string("")).to_str(), arg(a, 1, "attribute", kNone));
  if (f == "replace") return replace(v, arg(a, 0, "old", kNone), arg(a, 1, "new", kNone), arg(a, 2, "count", kNone));
  if (f == "items") return items_of(v);
  if (f == "list") return Value::list(v.iterate());
  if (f == "string") return v.is_string() ? v : Value::string(v.to_str());
  if (f == "safe") return v;
  if (f == "int" || f == "float") return to_number(v, f == "int", arg(a, 0, "default", f == "int" ? Value::integer(0) : Value::number(0)));
  if (f == "abs") {
    if (!v.is_number()) fail(absl::StrCat("abs needs a number, got ", v.type_name()));
    if (v.type() == Value::Type::kFloat) return Value::number(std::fabs(v.as_double()));
    if (v.as_int() == INT64_MIN)
      fail(absl::StrCat("integer result of abs(", v.as_int(), ") does not fit 64 bits (Loom's integers are 64-bit)"));
    return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  if (f == "round") {
    const int64_t p = arg(a, 0, "precision", Value::integer(0)).as_int();
    const std::string method = arg(a, 1, "method", Value::string("common")).to_str();
    const double scale = std::pow(10.0, static_cast<double>(p)), x = v.as_double() * scale;
    const double r = method == "floor" ? std::floor(x) : method == "ceil" ? std::ceil(x) : std::round(x);
    return Value::number(r / scale);
  }
  if (f == "selectattr" || f == "rejectattr") return Value::list(select(in, v, a, true, f == "selectattr"));
  if (f == "select" || f == "reject") return Value::list(select(in, v, a, false, f == "select"));
  if (f == "map") {
    std::vector<Value> out;
    const Value* attribute = a.get(SIZE_MAX, "attribute");
    for (const Value& x : v.iterate()) {
      if (attribute) {
        Value e = attribute_of(in, x, attribute->to_str());
        if (e.is_undefined()) e = arg(a, SIZE_MAX, "default", e);
        out.push_back(std::move(e));
      } else {
        if (a.pos.empty()) fail("map needs a filter name or attribute=");
        const std::string& name = need_string(a.pos[0], "map's filter name");
        if (!is_filter(name)) fail(absl::StrCat("unknown or unsupported filter '", name, "'"));
        CallArgs rest;
        rest.pos.assign(a.pos.begin() + 1, a.pos.end());
        out.push_back(apply_filter(in, name, x, rest));
      }
    }
    return Value::list(std::move(out));
  }
  if (f == "reverse") {
    if (v.is_string()) {
      const auto s = code_point_starts(v.str());
      std::string out;
      for (size_t i = s.size() - 1; i > 0; --i) out += v.str().substr(s[i - 1], s[i] - s[i - 1]);
      return Value::string(std::move(out));
    }
    std::vector<Value> xs = v.iterate();
    std::reverse(xs.begin(), xs.end());
    return Value::list(std::move(xs));
  }
  if (f == "sort" || f == "dictsort" || f == "unique" || f == "min" || f == "max") {
    std::vector<Value> xs = f == "dictsort" ? items_of(v).items() : v.iterate();
    const bool reverse = f == "sort" && arg(a, 0, "reverse", kFalse).truthy();
    const bool case_sensitive = arg(a, f == "sort" ? 1 : 0, "case_sensitive", kFalse).truthy();
    const Value attribute = arg(a, f == "sort" ? 2 : SIZE_MAX, "attribute", kNone);
    const auto key = [&](const Value& x) {
      Value k = f == "dictsort" ? x.items()[0] : attribute.is_none() ? x : attribute_of(in, x, attribute.to_str());
      return k.is_string() && !case_sensitive ? Value::string(lower_ascii(k.str())) : k;
    };
    if (f == "unique") {
      std::vector<Value> out, seen;
      for (const Value& x : xs) {
        const Value k = key(x);
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); }))
          seen.push_back(k), out.push_back(x);
      }
      return Value::list(std::move(out));
    }
    std::stable_sort(xs.begin(), xs.end(), [&](const Value& x, const Value& y) {
      const int c = compare(key(x), key(y));
      return reverse ? c > 0 : c < 0;
    });
    if (f == "min" || f == "max") {
      if (xs.empty()) return Value::undefined(absl::StrCat(f, " of an empty sequence"));
      return f == "min" ? xs.front() : xs.back();
    }
    return Value::list(std::move(xs));
  }
  if (f == "sum") {
    const Value attribute = arg(a, 0, "attribute", kNone);
    Value total = arg(a, 1, "start", Value::integer(0));
    for (const Value& x : v.iterate())
      total = arithmetic("+", total, attribute.is_none() ? x : attribute_of(in, x, attribute.to_str()));
    return total;
  }
  if (f == "indent") {
    const Value w = arg(a, 0, "width", Value::integer(4));
    const int64_t width = w.is_string() ? 0 : std::max<int64_t>(w.as_int(), 0);  // ' ' * -1 == ''
    budget::check_size(static_cast<uint64_t>(width), "indent()'s width");
    const std::string pad = w.is_string() ? w.str() : std::string(static_cast<size_t>(width), ' ');
    const bool first = arg(a, 1, "first", kFalse).truthy(), blank = arg(a, 2, "blank", kFalse).truthy();
    const std::string& s = need_string(v, "indent");
    std::string out;
    size_t p = 0;
    for (bool line0 = true; p <= s.size(); line0 = false) {
      const size_t nl = s.find('\n', p);
      const std::string line = s.substr(p, nl == std::string::npos ? std::string::npos : nl - p);
      budget::check_size(out.size() + pad.size() + line.size() + 1, "indent()'s result");
      if ((!line0 || first) && (blank || !line.empty())) out += pad;
      out += line;
      if (nl == std::string::npos) break;
      out += '\n';
      p = nl + 1;
    }
    return Value::string(std::move(out));
  }
  fail(absl::StrCat("unknown or unsupported filter '", f, "'"));
}

}  // namespace loom::jinja
