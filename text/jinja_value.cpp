// Jinja values: construction (under the render's limits), Python's truthiness, equality and
// ordering, and the code-point and mark bookkeeping of strings. Printing: jinja_print.cpp.
#include "text/jinja_value.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "text/jinja_limits.h"

namespace loom::jinja {

void fail(std::string message) { throw Error{0, std::move(message)}; }

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

namespace {

[[noreturn]] void too_deep() {
  fail(absl::StrCat("lists and dicts nested deeper than ", budget::limits().max_depth, " levels (Limits::max_depth)"));
}

}  // namespace

void Dict::set(const std::string& key, Value v) {
  if (is_namespace) {
    if (v.holds_namespace())
      fail(absl::StrCat("namespace attribute '", key, "' cannot hold a namespace (Loom keeps values acyclic)"));
    depth = std::max(depth, v.depth() + 1);
    if (depth > budget::limits().max_depth && budget::active()) too_deep();
  }
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
  v.s_ = std::make_shared<const Str>(Str{std::move(hint), {}});
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
  budget::check_size(s.size() + marks.size() * sizeof(Mark), "a string");
  budget::bytes(s.size() + marks.size() * sizeof(Mark));
  v.type_ = Type::kString;
  v.s_ = std::make_shared<const Str>(Str{std::move(s), std::move(marks)});
  return v;
}
Value Value::list(std::vector<Value> items, bool tuple) {
  budget::check_items(items.size(), sizeof(Value), "a list");
  budget::step(static_cast<int64_t>(items.size()));
  int depth = 1;
  bool ns = false;
  for (const Value& x : items) depth = std::max(depth, x.depth() + 1), ns = ns || x.holds_namespace();
  if (depth > budget::limits().max_depth && budget::active()) too_deep();
  Value v;
  v.type_ = Type::kList;
  v.list_ = std::make_shared<List>(List{std::move(items), tuple, depth, ns});
  return v;
}
Value Value::dict(std::shared_ptr<Dict> d) {
  budget::check_items(d->items.size(), sizeof(std::pair<std::string, Value>), "a dict");
  budget::step(static_cast<int64_t>(d->items.size()));
  d->holds_namespace = d->is_namespace;
  for (const auto& [k, x] : d->items)
    d->depth = std::max(d->depth, x.depth() + 1), d->holds_namespace = d->holds_namespace || x.holds_namespace();
  if (d->depth > budget::limits().max_depth && budget::active()) too_deep();
  Value v;
  v.type_ = Type::kDict;
  v.dict_ = std::move(d);
  return v;
}
Value Value::callable(std::string name, Callable fn) {
  Value v;
  v.type_ = Type::kCallable;
  v.s_ = std::make_shared<const Str>(Str{std::move(name), {}});
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

namespace {
const Str kEmpty;
}  // namespace

const std::string& Value::str() const { return s_ ? s_->text : kEmpty.text; }
const std::vector<Mark>& Value::marks() const { return s_ ? s_->marks : kEmpty.marks; }
int Value::depth() const { return list_ ? list_->depth : dict_ ? dict_->depth : 0; }
bool Value::holds_namespace() const { return list_ ? list_->holds_namespace : dict_ && dict_->holds_namespace; }

int64_t Value::as_int() const {
  if (type_ != Type::kFloat) return i_;
  // Truncated toward zero as Python's int(); saturated instead of undefined where it cannot fit.
  if (std::isnan(d_)) return 0;
  if (d_ >= 0x1p63) return INT64_MAX;
  if (d_ < -0x1p63) return INT64_MIN;
  return static_cast<int64_t>(d_);
}
double Value::as_double() const { return type_ == Type::kFloat ? d_ : static_cast<double>(i_); }

bool Value::truthy() const {
  switch (type_) {
    case Type::kUndefined:
    case Type::kNone: return false;
    case Type::kBool: return b_;
    case Type::kInt: return i_ != 0;
    case Type::kFloat: return d_ != 0;
    case Type::kString: return !str().empty();
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

std::vector<Value> Value::iterate() const {
  switch (type_) {
    case Type::kUndefined: return {};
    case Type::kList: budget::step(static_cast<int64_t>(list_->items.size())); return list_->items;
    case Type::kDict: {
      budget::step(static_cast<int64_t>(dict_->items.size()));
      std::vector<Value> keys;
      for (const auto& [k, v] : dict_->items) keys.push_back(string(k));
      return keys;
    }
    case Type::kString: {
      size_t n = 0;  // checked before the index of code points (8 bytes a byte) is made
      for (const char c : str()) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
      budget::check_items(n, sizeof(Value), "the characters of a string");
      std::vector<Value> chars;
      chars.reserve(n);
      const auto starts = code_point_starts(str());
      for (size_t i = 0; i + 1 < starts.size(); ++i) chars.push_back(substring(*this, starts[i], starts[i + 1]));
      return chars;
    }
    default: fail(absl::StrCat("'", type_name(), "' object is not iterable"));
  }
}

bool equals(const Value& a, const Value& b) {
  using T = Value::Type;
  budget::step();
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
      if (&a.list_obj() == &b.list_obj()) return true;  // Python compares items by identity first
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
  budget::step();
  if (a.is_number() && b.is_number() && a.type() != Value::Type::kFloat && b.type() != Value::Type::kFloat)
    return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;  // exact beyond 2^53
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
  budget::bytes(s.size());  // a scan of the whole string, whatever is done with it
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
  budget::check_size(a.str().size() + b.str().size() + (a.marks().size() + b.marks().size()) * sizeof(Mark), "a string");
  std::vector<Mark> marks = a.marks();
  for (Mark m : b.marks()) {
    m.begin += a.str().size();
    m.end += a.str().size();
    marks.push_back(m);
  }
  std::string text;
  text.reserve(a.str().size() + b.str().size());
  text.append(a.str()).append(b.str());
  return Value::string(std::move(text), std::move(marks));
}

}  // namespace loom::jinja
