// Jinja built-ins as transformers' chat templates use them: arithmetic, the str and dict methods
// (strip, split, startswith, items, get, ...), tests (defined, none, string, mapping, ...) and
// globals (range, namespace, raise_exception, strftime_now), and the string helpers the filters
// share (jinja_filters.cpp). Python's semantics, strings indexed by code point.
#include <algorithm>
#include <cmath>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "text/jinja_builtins_internal.h"
#include "text/jinja_interp.h"

namespace loom::jinja {

Value arg(const CallArgs& a, size_t i, std::string_view name, const Value& dflt) {
  const Value* v = a.get(i, name);
  return v ? *v : dflt;
}

const std::string& need_string(const Value& v, std::string_view what) {
  if (!v.is_string()) fail(absl::StrCat(std::string(what), " needs a string, got ", v.type_name()));
  return v.str();
}

static uint32_t decode_at(const std::string& s, size_t b, size_t e) {
  const unsigned char c = static_cast<unsigned char>(s[b]);
  if (e - b == 1) return c;
  uint32_t cp = e - b == 2 ? (c & 0x1F) : e - b == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = b + 1; k < e; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[k]) & 0x3F);
  return cp;
}

// str.strip / lstrip / rstrip (chars: none = whitespace), as a substring so marks survive.
Value strip(const Value& v, bool left, bool right, const Value& chars) {
  const std::string& s = need_string(v, "strip");
  std::vector<uint32_t> set;
  if (!chars.is_none() && !chars.is_undefined()) {
    const std::string& c = need_string(chars, "strip's argument");
    const auto cs = code_point_starts(c);
    for (size_t i = 0; i + 1 < cs.size(); ++i) set.push_back(decode_at(c, cs[i], cs[i + 1]));
  }
  const auto starts = code_point_starts(s);
  const auto strippable = [&](size_t i) {
    const uint32_t cp = decode_at(s, starts[i], starts[i + 1]);
    return set.empty() && (chars.is_none() || chars.is_undefined()) ? is_python_space(cp)
                                                                    : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = starts.size() - 1;
  if (left)
    while (b < e && strippable(b)) ++b;
  if (right)
    while (e > b && strippable(e - 1)) --e;
  return substring(v, starts[b], starts[e]);
}

std::vector<Value> split(const Value& v, const Value& sep, int64_t maxsplit, bool from_right) {
  const std::string& s = need_string(v, "split");
  std::vector<std::pair<size_t, size_t>> parts;  // byte ranges
  if (sep.is_none() || sep.is_undefined()) {     // runs of whitespace, no empty parts
    const auto starts = code_point_starts(s);
    const size_t n = starts.size() - 1;
    const auto space = [&](size_t i) { return is_python_space(decode_at(s, starts[i], starts[i + 1])); };
    if (from_right && maxsplit >= 0) fail("rsplit() without a separator and with maxsplit is not supported");
    size_t i = 0;
    while (i < n) {
      while (i < n && space(i)) ++i;
      if (i == n) break;
      size_t j = i;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t e = n;
        while (e > i && space(e - 1)) --e;
        j = e;
      } else {
        while (j < n && !space(j)) ++j;
      }
      budget::check_items(parts.size() + 1, sizeof(Value), "split()'s result");
      parts.emplace_back(starts[i], starts[j]);
      i = j;
    }
  } else {
    const std::string& d = need_string(sep, "split's separator");
    if (d.empty()) fail("split(): empty separator");
    std::vector<size_t> hits;
    for (size_t p = s.find(d); p != std::string::npos; p = s.find(d, p + d.size())) {
      budget::check_items(hits.size() + 2, sizeof(Value), "split()'s result");
      hits.push_back(p);
    }
    if (maxsplit >= 0 && static_cast<int64_t>(hits.size()) > maxsplit) {
      if (from_right) hits.erase(hits.begin(), hits.end() - maxsplit);
      else hits.resize(static_cast<size_t>(maxsplit));
    }
    size_t begin = 0;
    for (size_t h : hits) parts.emplace_back(begin, h), begin = h + d.size();
    parts.emplace_back(begin, s.size());
  }
  std::vector<Value> out;
  for (const auto& [b, e] : parts) out.push_back(substring(v, b, e));
  return out;
}

// ASCII case mapping; other text is refused rather than mapped differently from Python.
std::string ascii_case(const std::string& s, std::string_view how) {
  std::string out = s;
  bool word_start = true;
  for (size_t i = 0; i < out.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(out[i]);
    if (c >= 0x80) fail(absl::StrCat(std::string(how), "() of non-ASCII text is not supported"));
    const bool alpha = std::isalpha(c);
    if (how == "upper") out[i] = static_cast<char>(std::toupper(c));
    else if (how == "lower") out[i] = static_cast<char>(std::tolower(c));
    else if (how == "capitalize") out[i] = static_cast<char>(i == 0 ? std::toupper(c) : std::tolower(c));
    else out[i] = static_cast<char>(word_start ? std::toupper(c) : std::tolower(c));  // title
    word_start = !alpha;
  }
  return out;
}

Value replace(const Value& v, const Value& from, const Value& to, const Value& count) {
  const std::string& s = need_string(v, "replace");
  const std::string& a = need_string(from, "replace's old text");
  const std::string b = to.to_str();
  int64_t left = count.is_none() || count.is_undefined() ? -1 : count.as_int();
  if (a.empty()) fail("replace() of an empty string is not supported");
  if (s.find(a) == std::string::npos || left == 0) return v;
  if (b.size() > a.size()) {  // the result's size before it is built: each hit grows it
    size_t hits = 0;
    for (size_t h = s.find(a); h != std::string::npos && (left < 0 || static_cast<int64_t>(hits) < left);
         h = s.find(a, h + a.size()))
      ++hits;
    const size_t grow = b.size() - a.size();
    budget::check_size(hits > (SIZE_MAX - s.size()) / grow ? SIZE_MAX : s.size() + hits * grow, "replace()'s result");
  }
  std::string out;
  size_t p = 0;
  for (size_t h = s.find(a); h != std::string::npos && left != 0; h = s.find(a, p), --left) {
    out.append(s, p, h - p);
    out += b;
    p = h + a.size();
  }
  out.append(s, p, std::string::npos);
  return Value::string(std::move(out));  // changed text: its marks do not survive
}

static bool starts_or_ends(const std::string& s, const Value& what, bool start) {
  const auto one = [&](const Value& p) {
    const std::string& x = need_string(p, start ? "startswith" : "endswith");
    return start ? s.starts_with(x) : s.ends_with(x);
  };
  if (what.is_list()) {
    for (const Value& p : what.items())
      if (one(p)) return true;
    return false;
  }
  return one(what);
}

Value join(Interp& in, const Value& seq, const std::string& sep, const Value& attribute) {
  std::string out;  // built once, in linear time, its size checked as it grows
  std::vector<Mark> marks;
  bool first = true;
  for (const Value& x : seq.iterate()) {
    const Value e = attribute.is_none() ? x : in.attr(x, attribute.to_str());
    const std::string text = e.is_string() ? std::string() : e.to_str();
    const std::string& part = e.is_string() ? e.str() : text;
    budget::check_size(out.size() + (first ? 0 : sep.size()) + part.size() + (marks.size() + e.marks().size()) * sizeof(Mark),
                       "join()'s result");
    if (!first) out += sep;
    first = false;
    for (Mark m : e.marks()) {
      m.begin += out.size();
      m.end += out.size();
      marks.push_back(m);
    }
    out += part;
  }
  return Value::string(std::move(out), std::move(marks));
}

Value items_of(const Value& v) {
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) fail(absl::StrCat("items() needs a dict, got ", v.type_name()));
  std::vector<Value> out;
  for (const auto& [k, e] : v.dict_obj()->items) out.push_back(Value::list({Value::string(k), e}, true));
  return Value::list(std::move(out));
}

int64_t length(const Value& v) {
  if (v.is_string()) {  // code points, counted without an index of them (8 bytes a byte)
    int64_t n = 0;
    for (const char c : v.str()) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    budget::bytes(v.str().size());
    return n;
  }
  if (v.is_list()) return static_cast<int64_t>(v.items().size());
  if (v.is_dict()) return static_cast<int64_t>(v.dict_obj()->items.size());
  if (v.is_undefined()) return 0;
  fail(absl::StrCat("object of type '", v.type_name(), "' has no len()"));
}

// An attribute path "a.b" of x (selectattr, map, sort, sum, join).
Value attribute_of(Interp& in, const Value& x, const std::string& path) {
  Value cur = x;
  size_t p = 0;
  while (true) {
    const size_t dot = path.find('.', p);
    const std::string part = path.substr(p, dot == std::string::npos ? std::string::npos : dot - p);
    cur = cur.is_undefined() ? cur : in.item(cur, Value::string(part));
    if (dot == std::string::npos) return cur;
    p = dot + 1;
  }
}

std::vector<Value> select(Interp& in, const Value& seq, const CallArgs& a, bool by_attr, bool keep) {
  size_t k = 0;
  std::string attr;
  if (by_attr) {
    if (a.pos.empty()) fail("selectattr/rejectattr needs an attribute name");
    attr = need_string(a.pos[0], "selectattr's attribute");
    k = 1;
  }
  std::string test;
  CallArgs test_args;
  if (k < a.pos.size()) {
    test = need_string(a.pos[k], "the test name");
    if (!is_test(test)) fail(absl::StrCat("unknown or unsupported test '", test, "'"));
    test_args.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(k) + 1, a.pos.end());
  }
  std::vector<Value> out;
  for (const Value& x : seq.iterate()) {
    const Value v = by_attr ? attribute_of(in, x, attr) : x;
    const bool pass = test.empty() ? v.truthy() : apply_test(in, test, v, test_args);
    if (pass == keep) out.push_back(x);
  }
  return out;
}

std::string lower_ascii(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

Value method(const Value& obj, const std::string& name) {
  const auto bind = [&](auto fn) {
    return Value::callable(name, [obj, fn](Interp& in, const CallArgs& a) { return fn(in, obj, a); });
  };
  if (obj.is_string()) {
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return bind([name](Interp&, const Value& s, const CallArgs& a) {
        return strip(s, name != "rstrip", name != "lstrip", arg(a, 0, "chars", kNone));
      });
    if (name == "split" || name == "rsplit")
      return bind([name](Interp&, const Value& s, const CallArgs& a) {
        const Value m = arg(a, 1, "maxsplit", Value::integer(-1));
        return Value::list(split(s, arg(a, 0, "sep", kNone), m.as_int(), name == "rsplit"));
      });
    if (name == "startswith" || name == "endswith")
      return bind([name](Interp&, const Value& s, const CallArgs& a) {
        if (a.pos.empty()) fail(absl::StrCat(name, "() needs an argument"));
        return Value::boolean(starts_or_ends(s.str(), a.pos[0], name == "startswith"));
      });
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize")
      return bind([name](Interp&, const Value& s, const CallArgs&) { return Value::string(ascii_case(s.str(), name)); });
    if (name == "replace")
      return bind([](Interp&, const Value& s, const CallArgs& a) {
        return replace(s, arg(a, 0, "old", kNone), arg(a, 1, "new", kNone), arg(a, 2, "count", kNone));
      });
    if (name == "find")
      return bind([](Interp&, const Value& s, const CallArgs& a) {
        const size_t p = s.str().find(need_string(arg(a, 0, "sub", kNone), "find"));
        if (p == std::string::npos) return Value::integer(-1);
        return Value::integer(static_cast<int64_t>(code_point_starts(s.str().substr(0, p)).size()) - 1);
      });
    if (name == "join")
      return bind([](Interp& in, const Value& s, const CallArgs& a) {
        if (a.pos.empty()) fail("join() needs an argument");
        return join(in, a.pos[0], s.str(), kNone);
      });
  }
  if (obj.is_dict() && !obj.dict_obj()->is_namespace) {
    if (name == "items") return bind([](Interp&, const Value& d, const CallArgs&) { return items_of(d); });
    if (name == "keys") return bind([](Interp&, const Value& d, const CallArgs&) { return Value::list(d.iterate()); });
    if (name == "values")
      return bind([](Interp&, const Value& d, const CallArgs&) {
        std::vector<Value> out;
        for (const auto& [k, v] : d.dict_obj()->items) out.push_back(v);
        return Value::list(std::move(out));
      });
    if (name == "get")
      return bind([](Interp&, const Value& d, const CallArgs& a) {
        const Value k = arg(a, 0, "key", kNone);
        const Value* v = k.is_string() ? d.dict_obj()->find(k.str()) : nullptr;
        return v ? *v : arg(a, 1, "default", kNone);
      });
  }
  return Value::undefined(absl::StrCat(obj.type_name(), " object has no attribute '", name, "'"));
}

bool is_test(const std::string& n) {
  static const char* kNames[] = {"boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "even",
                                 "false", "float", "ge", ">=", "gt", "greaterthan", ">", "in", "integer", "iterable",
                                 "le", "<=", "lower", "lt", "lessthan", "<", "mapping", "ne", "!=", "none", "number",
                                 "odd", "sameas", "sequence", "string", "true", "undefined", "upper"};
  return std::find(std::begin(kNames), std::end(kNames), n) != std::end(kNames);
}

bool apply_test(Interp& in, const std::string& t, const Value& v, const CallArgs& a) {
  using T = Value::Type;
  const auto other = [&]() -> const Value& {
    if (a.pos.empty()) fail(absl::StrCat("test '", t, "' needs an argument"));
    return a.pos[0];
  };
  if (t == "defined") return !v.is_undefined();
  if (t == "undefined") return v.is_undefined();
  if (t == "none") return v.is_none();
  if (t == "boolean") return v.type() == T::kBool;
  if (t == "true") return v.type() == T::kBool && v.as_bool();
  if (t == "false") return v.type() == T::kBool && !v.as_bool();
  if (t == "integer") return v.type() == T::kInt;
  if (t == "float") return v.type() == T::kFloat;
  if (t == "number") return v.is_number();
  if (t == "string") return v.is_string();
  if (t == "mapping") return v.is_dict() && !v.dict_obj()->is_namespace;
  if (t == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (t == "sequence") return v.is_list() || v.is_dict() || v.is_string();
  if (t == "callable") return v.is_callable();
  if (t == "odd" || t == "even" || t == "divisibleby") {
    if (v.type() != T::kInt) fail(absl::StrCat("test '", t, "' needs an integer, got ", v.type_name()));
    const int64_t d = t == "divisibleby" ? other().as_int() : 2;
    if (d == 0) fail("integer division or modulo by zero");
    const bool div = d == -1 || v.as_int() % d == 0;  // INT64_MIN % -1 traps in C++
    return t == "odd" ? !div : div;
  }
  if (t == "eq" || t == "equalto" || t == "==") return equals(v, other());
  if (t == "ne" || t == "!=") return !equals(v, other());
  if (t == "lt" || t == "lessthan" || t == "<") return compare(v, other()) < 0;
  if (t == "le" || t == "<=") return compare(v, other()) <= 0;
  if (t == "gt" || t == "greaterthan" || t == ">") return compare(v, other()) > 0;
  if (t == "ge" || t == ">=") return compare(v, other()) >= 0;
  if (t == "sameas") {
    const Value& o = other();
    if (v.type() != o.type()) return false;
    if (v.is_list()) return &v.list_obj() == &o.list_obj();
    if (v.is_dict()) return v.dict_obj() == o.dict_obj();
    return equals(v, o);
  }
  if (t == "in") {
    const Value& c = other();
    if (c.is_string()) {
      if (!v.is_string()) fail(absl::StrCat("'in <string>' requires a string on the left, not ", v.type_name()));
      return c.str().find(v.str()) != std::string::npos;
    }
    if (c.is_dict()) return v.is_string() && c.dict_obj()->find(v.str()) != nullptr;
    if (c.is_list()) return std::any_of(c.items().begin(), c.items().end(), [&](const Value& x) { return equals(x, v); });
    if (c.is_undefined()) fail(absl::StrCat("'", c.hint(), "' is undefined"));
    fail(absl::StrCat("argument of type '", c.type_name(), "' is not iterable"));
  }
  if (t == "lower" || t == "upper") {
    if (!v.is_string()) return false;
    bool cased = false;
    for (unsigned char c : v.str()) {
      if (t == "lower" ? std::isupper(c) : std::islower(c)) return false;
      cased = cased || std::isalpha(c);
    }
    return cased;
  }
  (void)in;
  fail(absl::StrCat("unknown or unsupported test '", t, "'"));
}

void add_globals(Interp::Frame* frame) {
  frame->vars.emplace_back("range", Value::callable("range", [](Interp&, const CallArgs& a) {
    if (a.pos.empty() || a.pos.size() > 3) fail("range() takes 1 to 3 arguments");
    for (const Value& v : a.pos)
      if (!v.is_number() || v.type() == Value::Type::kFloat)
        fail(absl::StrCat("'", v.type_name(), "' object cannot be interpreted as an integer"));
    int64_t start = 0, stop, step = 1;
    if (a.pos.size() == 1) stop = a.pos[0].as_int();
    else start = a.pos[0].as_int(), stop = a.pos[1].as_int();
    if (a.pos.size() == 3) step = a.pos[2].as_int();
    if (step == 0) fail("range() arg 3 must not be zero");
    // The length first (in 128 bits: stop - start can pass 2^63), so a huge range fails before
    // anything is built and i never steps past the end.
    const __int128 span = step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
    const __int128 stride = step > 0 ? static_cast<__int128>(step) : -static_cast<__int128>(step);
    const __int128 len = span <= 0 ? 0 : (span - 1) / stride + 1;
    // transformers renders in Jinja's sandbox, whose range() refuses more than MAX_RANGE items.
    constexpr int64_t kMaxRange = 100000;
    if (len > kMaxRange)
      fail(absl::StrCat("range() of more than ", kMaxRange, " elements (Jinja's sandbox, which transformers renders "
                        "with, refuses it too)"));
    std::vector<Value> out;
    out.reserve(static_cast<size_t>(len));
    for (__int128 k = 0; k < len; ++k) out.push_back(Value::integer(static_cast<int64_t>(start + k * step)));
    return Value::list(std::move(out));
  }));
  for (const bool ns : {true, false}) {
    const char* name = ns ? "namespace" : "dict";
    frame->vars.emplace_back(name, Value::callable(name, [ns](Interp&, const CallArgs& a) {
      auto d = std::make_shared<Dict>();
      d->is_namespace = ns;
      for (const Value& p : a.pos) {
        if (!p.is_dict()) fail("namespace()/dict() takes keyword arguments or a dict");
        for (const auto& [k, v] : p.dict_obj()->items) d->set(k, v);
      }
      for (const auto& [k, v] : a.kw) d->set(k, v);
      return Value::dict(std::move(d));
    }));
  }
  frame->vars.emplace_back("raise_exception", Value::callable("raise_exception", [](Interp& in, const CallArgs& a) -> Value {
    throw Error{in.line(), a.pos.empty() ? std::string("raise_exception()") : a.pos[0].to_str(), true};
  }));
  frame->vars.emplace_back("strftime_now", Value::callable("strftime_now", [](Interp&, const CallArgs& a) {
    if (a.pos.empty() || !a.pos[0].is_string()) fail("strftime_now() needs a format string");
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, a.pos[0].str().c_str(), &tm);
    return Value::string(std::string(buf, n));
  }));
}

}  // namespace loom::jinja
