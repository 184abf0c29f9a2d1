// Internal to the Jinja interpreter: helpers shared by the methods (jinja_builtins.cpp) and the
// filters (jinja_filters.cpp). String results are substrings of their input where Python's are, so
// marks survive strip/split/join.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja_interp.h"

namespace loom::jinja {

inline const Value kNone = Value::none();
inline const Value kFalse = Value::boolean(false);

// Positional argument i, else keyword `name`, else dflt.
Value arg(const CallArgs& a, size_t i, std::string_view name, const Value& dflt);
const std::string& need_string(const Value& v, std::string_view what);
Value strip(const Value& v, bool left, bool right, const Value& chars);  // str.strip/lstrip/rstrip
std::vector<Value> split(const Value& v, const Value& sep, int64_t maxsplit, bool from_right);
std::string ascii_case(const std::string& s, std::string_view how);  // upper, lower, title, capitalize
Value replace(const Value& v, const Value& from, const Value& to, const Value& count);
Value join(Interp& in, const Value& seq, const std::string& sep, const Value& attribute);
Value items_of(const Value& v);  // a dict's (key, value) tuples
int64_t length(const Value& v);
Value attribute_of(Interp& in, const Value& x, const std::string& path);  // "a.b"
// select/reject (by_attr false) and selectattr/rejectattr (true): the items whose test passes == keep.
std::vector<Value> select(Interp& in, const Value& seq, const CallArgs& a, bool by_attr, bool keep);
std::string lower_ascii(std::string s);

}  // namespace loom::jinja
