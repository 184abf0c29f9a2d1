// Values of Loom's Jinja interpreter (text/jinja.h): Python's objects as chat templates see them —
// undefined, None, bool, int, float, str, list/tuple, dict (insertion-ordered, string keys),
// namespace() and callables. Lists, dicts and namespaces are shared by reference as in Python, and
// strings (immutable) too, so copying a value never copies its text.
// A string carries marks: the byte ranges that came from a tagged input string (an assistant
// message's content), kept through slicing, strip, split and concatenation, so the renderer can
// say where each message's text landed in the output.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

namespace loom::jinja {

// A template error (a raise_exception, a type error, an undefined name); line 0 = not yet known.
struct Error {
  int line = 0;
  std::string message;
  bool raised = false;  // from the template's raise_exception()
};
[[noreturn]] void fail(std::string message);

struct Mark {
  size_t begin = 0, end = 0;  // bytes of the string (or of the output)
  int tag = 0;
  bool operator==(const Mark&) const = default;
};

class Value;
struct List {
  std::vector<Value> items;
  bool tuple = false;  // printed as (a, b)
  int depth = 1;       // nesting of lists and dicts, this one included
  bool holds_namespace = false;
};
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
  int depth = 1;
  bool holds_namespace = false;  // a namespace among the values (or this is one)
  const Value* find(std::string_view key) const;
  // Sets key; a namespace refuses a value that holds a namespace (so values stay acyclic and their
  // depth known) and one that would nest it deeper than Limits::max_depth.
  void set(const std::string& key, Value v);
};
struct Str {
  std::string text;
  std::vector<Mark> marks;
};
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* get(size_t i, std::string_view name) const;  // positional i, else keyword name
};
class Interp;
using Callable = std::function<Value(Interp&, const CallArgs&)>;

class Value {
 public:
  enum class Type { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Value() = default;  // undefined
  static Value undefined(std::string hint);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);
  static Value string(std::string s, std::vector<Mark> marks = {});
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value dict(std::shared_ptr<Dict> d);
  static Value callable(std::string name, Callable fn);
  static Value from_json(const nlohmann::json& j);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::kUndefined; }
  bool is_none() const { return type_ == Type::kNone; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_list() const { return type_ == Type::kList; }
  bool is_dict() const { return type_ == Type::kDict; }
  bool is_number() const { return type_ == Type::kInt || type_ == Type::kFloat || type_ == Type::kBool; }
  bool is_callable() const { return type_ == Type::kCallable; }

  bool as_bool() const { return b_; }
  int64_t as_int() const;  // bool and int (float truncated)
  double as_double() const;
  const std::string& str() const;
  const std::vector<Mark>& marks() const;
  const std::vector<Value>& items() const { return list_->items; }
  const List& list_obj() const { return *list_; }
  const std::shared_ptr<Dict>& dict_obj() const { return dict_; }
  const std::string& hint() const { return str(); }  // undefined: what was looked up; callable: name
  // Nesting of lists and dicts (0 for anything else) and whether a namespace is among them.
  int depth() const;
  bool holds_namespace() const;
  const Callable& fn() const { return *fn_; }

  bool truthy() const;
  std::string type_name() const;  // Python's: 'str', 'int', 'dict', ...
  // Python str(): what {{ value }} prints (undefined prints nothing).
  std::string to_str() const;
  std::string repr() const;  // Python repr(), used inside lists and dicts
  // Elements when iterated: a list's items, a dict's keys, a string's characters; undefined is
  // empty; anything else is an error. Counts against the render's budget.
  std::vector<Value> iterate() const;

 private:
  Type type_ = Type::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<const Str> s_;  // a string's text and marks; undefined's hint; callable's name
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Callable> fn_;
};

bool equals(const Value& a, const Value& b);
int compare(const Value& a, const Value& b);  // <0, 0, >0; an error for unorderable types
std::string format_float(double d);           // Python repr() of a float
// Python's json.dumps(v, ensure_ascii=False, indent=indent) (transformers' tojson); indent < 0 = none.
// Fails when the text would pass Limits::max_value_bytes.
std::string to_json(const Value& v, int64_t indent = -1);

// UTF-8 helpers: Python indexes strings by code point.
std::vector<size_t> code_point_starts(const std::string& s);  // byte offset of each code point, then size
bool is_python_space(uint32_t cp);
// s[begin, end) in bytes as a new string value, its marks clipped to the range.
Value substring(const Value& s, size_t begin, size_t end);
Value concat(const Value& a, const Value& b);  // two strings, marks kept

}  // namespace loom::jinja
