// Jinja values: construction, Python's truthiness, str()/repr(), equality and ordering, json.dumps,
// and the code-point and mark bookkeeping of strings.
#include "text/jinja_value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom::jinja {

void fail(std::string message) { throw Error{0, std::move(message)}; }

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

const Value* CallArgs::get(size_t i, std::string_view name) const {
  if (i < pos.size()) return &pos[i];
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

Value Value::undefined(std::string hint) {
  Value v;
  v.s_ = std::move(hint);
  return v;
}
Value Value::none() {
  Value v;
  v.type_ = Type::kNone;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.type_ = Type::kBool;
  v.b_ = b;
  v.i_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.type_ = Type::kInt;
  v.i_ = i;
  return v;
}
Value Value::number(double d) {
  Value v;
  v.type_ = Type::kFloat;
  v.d_ = d;
  return v;
}
Value Value::string(std::string s, std::vector<Mark> marks) {
  Value v;
  v.type_ = Type::kString;
  v.s_ = std::move(s);
  v.marks_ = std::move(marks);
  return v;
}
Value Value::list(std::vector<Value> items, bool tuple) {
  Value v;
  v.type_ = Type::kList;
  v.list_ = std::make_shared<List>(List{std::move(items), tuple});
  return v;
}
Value Value::dict(std::shared_ptr<Dict> d) {
  Value v;
  v.type_ = Type::kDict;
  v.dict_ = std::move(d);
  return v;
}
Value Value::callable(std::string name, Callable fn) {
  Value v;
  v.type_ = Type::kCallable;
  v.s_ = std::move(name);
  v.fn_ = std::make_shared<Callable>(std::move(fn));
  return v;
}

Value Value::from_json(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return none();
    case nlohmann::json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return integer(j.get<int64_t>());
    case nlohmann::json::value_t::number_float: return number(j.get<double>());
    case nlohmann::json::value_t::string: return string(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      auto d = std::make_shared<Dict>();
      for (const auto& [k, e] : j.items()) d->items.emplace_back(k, from_json(e));
      return dict(std::move(d));
    }
    default: return undefined("binary JSON value");
  }
}

int64_t Value::as_int() const { return type_ == Type::kFloat ? static_cast<int64_t>(d_) : i_; }
double Value::as_double() const { return type_ == Type::kFloat ? d_ : static_cast<double>(i_); }

bool Value::truthy() const {
  switch (type_) {
    case Type::kUndefined:
    case Type::kNone: return false;
    case Type::kBool: return b_;
    case Type::kInt: return i_ != 0;
    case Type::kFloat: return d_ != 0;
    case Type::kString: return !s_.empty();
    case Type::kList: return !list_->items.empty();
    case Type::kDict: return dict_->is_namespace || !dict_->items.empty();
    case Type::kCallable: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (type_) {
    case Type::kUndefined: return "undefined";
    case Type::kNone: return "NoneType";
    case Type::kBool: return "bool";
    case Type::kInt: return "int";
    case Type::kFloat: return "float";
    case Type::kString: return "str";
    case Type::kList: return list_->tuple ? "tuple" : "list";
    case Type::kDict: return dict_->is_namespace ? "Namespace" : "dict";
    case Type::kCallable: return "function";
  }
  return "?";
}

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
    if (sci[i] == '-') sign = "-";
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

// Python's repr() of a str: single quotes unless the text holds ' and no ".
std::string repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == q || c == '\\') out += '\\', out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) out += absl::StrFormat("\\x%02x", c);
    else out += static_cast<char>(c);
  }
  return out + q;
}

void json_string(const std::string& s, std::string* out) {
  *out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7F) *out += absl::StrFormat("\\u%04x", c);
        else *out += static_cast<char>(c);
    }
  }
  *out += '"';
}

void json_value(const Value& v, int indent, int depth, std::string* out) {
  const auto newline = [&](int d) {
    if (indent >= 0) *out += "\n" + std::string(static_cast<size_t>(indent * d), ' ');
  };
  const char* item_sep = indent >= 0 ? "," : ", ";
  switch (v.type()) {
    case Value::Type::kUndefined: fail("tojson: the value is undefined");
    case Value::Type::kNone: *out += "null"; return;
    case Value::Type::kBool: *out += v.as_bool() ? "true" : "false"; return;
    case Value::Type::kInt: *out += std::to_string(v.as_int()); return;
    case Value::Type::kFloat: {
      const double d = v.as_double();
      *out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : format_float(d);
      return;
    }
    case Value::Type::kString: json_string(v.str(), out); return;
    case Value::Type::kList: {
      if (v.items().empty()) {
        *out += "[]";
        return;
      }
      *out += '[';
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i) *out += item_sep;
        newline(depth + 1);
        json_value(v.items()[i], indent, depth + 1, out);
      }
      newline(depth);
      *out += ']';
      return;
    }
    case Value::Type::kDict: {
      if (v.dict_obj()->items.empty()) {
        *out += "{}";
        return;
      }
      *out += '{';
      bool first = true;
      for (const auto& [k, e] : v.dict_obj()->items) {
        if (!first) *out += item_sep;
        first = false;
        newline(depth + 1);
        json_string(k, out);
        *out += ": ";
        json_value(e, indent, depth + 1, out);
      }
      newline(depth);
      *out += '}';
      return;
    }
    case Value::Type::kCallable: fail("tojson: a function is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, int indent) {
  std::string out;
  json_value(v, indent, 0, &out);
  return out;
}

std::string Value::to_str() const {
  switch (type_) {
    case Type::kUndefined: return "";
    case Type::kString: return s_;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (type_) {
    case Type::kUndefined: return "";
    case Type::kNone: return "None";
    case Type::kBool: return b_ ? "True" : "False";
    case Type::kInt: return std::to_string(i_);
    case Type::kFloat: return format_float(d_);
    case Type::kString: return repr_string(s_);
    case Type::kList: {
      std::string out = list_->tuple ? "(" : "[";
      for (size_t i = 0; i < list_->items.size(); ++i) absl::StrAppend(&out, i ? ", " : "", list_->items[i].repr());
      if (list_->tuple && list_->items.size() == 1) out += ",";
      return out + (list_->tuple ? ")" : "]");
    }
    case Type::kDict: {
      std::string out = dict_->is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : dict_->items) {
        absl::StrAppend(&out, first ? "" : ", ", repr_string(k), ": ", v.repr());
        first = false;
      }
      return out + (dict_->is_namespace ? "}>" : "}");
    }
    case Type::kCallable: return absl::StrCat("<function ", s_, ">");
  }
  return "";
}

std::vector<Value> Value::iterate() const {
  switch (type_) {
    case Type::kUndefined: return {};
    case Type::kList: return list_->items;
    case Type::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, v] : dict_->items) keys.push_back(string(k));
      return keys;
    }
    case Type::kString: {
      std::vector<Value> chars;
      const auto starts = code_point_starts(s_);
      for (size_t i = 0; i + 1 < starts.size(); ++i) chars.push_back(substring(*this, starts[i], starts[i + 1]));
      return chars;
    }
    default: fail(absl::StrCat("'", type_name(), "' object is not iterable"));
  }
}

bool equals(const Value& a, const Value& b) {
  using T = Value::Type;
  if (a.is_number() && b.is_number()) {
    if (a.type() == T::kFloat || b.type() == T::kFloat) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case T::kUndefined:
    case T::kNone: return true;
    case T::kString: return a.str() == b.str();
    case T::kList: {
      if (a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i)
        if (!equals(a.items()[i], b.items()[i])) return false;
      return true;
    }
    case T::kDict: {
      if (a.dict_obj() == b.dict_obj()) return true;
      if (a.dict_obj()->is_namespace || b.dict_obj()->is_namespace) return false;
      if (a.dict_obj()->items.size() != b.dict_obj()->items.size()) return false;
      for (const auto& [k, v] : a.dict_obj()->items) {
        const Value* o = b.dict_obj()->find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    case T::kCallable: return &a.fn() == &b.fn();
    default: return false;
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.str().compare(b.str()) < 0 ? -1 : a.str() == b.str() ? 0 : 1;
  if (a.is_list() && b.is_list()) {
    const size_t n = std::min(a.items().size(), b.items().size());
    for (size_t i = 0; i < n; ++i)
      if (!equals(a.items()[i], b.items()[i])) return compare(a.items()[i], b.items()[i]);
    return a.items().size() < b.items().size() ? -1 : a.items().size() > b.items().size() ? 1 : 0;
  }
  fail(absl::StrCat("'<' not supported between instances of '", a.type_name(), "' and '", b.type_name(), "'"));
}

std::vector<size_t> code_point_starts(const std::string& s) {
  std::vector<size_t> starts;
  starts.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) starts.push_back(i);
  starts.push_back(s.size());
  return starts;
}

bool is_python_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

Value substring(const Value& s, size_t begin, size_t end) {
  std::vector<Mark> marks;
  for (const Mark& m : s.marks()) {
    const size_t lo = std::max(begin, m.begin), hi = std::min(end, m.end);
    // Overlapping text is kept; an empty result keeps a mark that held it (a stripped blank
    // reply still says where it was), and so does an empty mark inside the range.
    const bool keep = lo < hi || (begin == end && m.begin <= begin && begin <= m.end && m.begin < m.end) ||
                      (m.begin == m.end && begin <= m.begin && m.begin <= end);
    if (keep) marks.push_back({std::max(lo, begin) - begin, std::max(lo, hi) - begin, m.tag});
  }
  return Value::string(s.str().substr(begin, end - begin), std::move(marks));
}

Value concat(const Value& a, const Value& b) {
  std::vector<Mark> marks = a.marks();
  for (Mark m : b.marks()) {
    m.begin += a.str().size();
    m.end += a.str().size();
    marks.push_back(m);
  }
  return Value::string(a.str() + b.str(), std::move(marks));
}

}  // namespace loom::jinja
