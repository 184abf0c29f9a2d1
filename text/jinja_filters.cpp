// Jinja filters as chat templates use them (trim, tojson, length, default, first/last, join,
// replace, items, list, string, int/float, selectattr/rejectattr/select/reject/map, sort, unique,
// min/max, sum, reverse, round, abs, indent, upper/lower/title/capitalize, safe, dictsort), with
// Python's semantics; string helpers in jinja_builtins_internal.h.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "text/jinja_builtins_internal.h"
#include "text/jinja_interp.h"

namespace loom::jinja {

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
    return Value::string(to_json(v, indent.is_none() ? -1 : static_cast<int>(indent.as_int())));
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
  if (f == "int" || f == "float") {
    const Value dflt = arg(a, 0, "default", f == "int" ? Value::integer(0) : Value::number(0));
    double d;
    if (v.is_number()) {
      d = v.as_double();
    } else if (v.is_string()) {
      try {
        size_t used = 0;
        d = std::stod(v.str(), &used);
        if (used != v.str().size()) return dflt;
      } catch (const std::exception&) {
        return dflt;
      }
    } else {
      return dflt;
    }
    return f == "int" ? Value::integer(static_cast<int64_t>(d)) : Value::number(d);
  }
  if (f == "abs") {
    if (!v.is_number()) fail(absl::StrCat("abs needs a number, got ", v.type_name()));
    return v.type() == Value::Type::kFloat ? Value::number(std::fabs(v.as_double())) : Value::integer(std::llabs(v.as_int()));
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
    const std::string pad = w.is_string() ? w.str() : std::string(static_cast<size_t>(w.as_int()), ' ');
    const bool first = arg(a, 1, "first", kFalse).truthy(), blank = arg(a, 2, "blank", kFalse).truthy();
    const std::string& s = need_string(v, "indent");
    std::string out;
    size_t p = 0;
    for (bool line0 = true; p <= s.size(); line0 = false) {
      const size_t nl = s.find('\n', p);
      const std::string line = s.substr(p, nl == std::string::npos ? std::string::npos : nl - p);
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
