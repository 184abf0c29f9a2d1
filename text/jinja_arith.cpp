// Jinja arithmetic with Python's semantics: + - * / // % ** over int (64-bit here: a result that
// does not fit is an error, never a wrapped number), float and bool; floor division and modulo
// rounding toward negative infinity; str and list concatenation and repetition, built once at their
// final size and checked against Limits::max_value_bytes before any byte is made.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "text/jinja_interp.h"

namespace loom::jinja {
namespace {

using T = Value::Type;

[[noreturn]] void too_large(const std::string& op, const Value& a, const Value& b) {
  fail(absl::StrCat("integer result of ", a.repr(), " ", op, " ", b.repr(),
                    " does not fit 64 bits (Loom's integers are 64-bit)"));
}

// CPython's float_divmod: x == div * y + mod, mod with the sign of y, div integral.
void float_divmod(double x, double y, double* div, double* mod) {
  double m = std::fmod(x, y);
  double d = (x - m) / y;
  if (m != 0) {
    if ((y < 0) != (m < 0)) m += y, d -= 1;
  } else {
    m = std::copysign(0.0, y);
  }
  double f;
  if (d != 0) {
    f = std::floor(d);
    if (d - f > 0.5) f += 1;
  } else {
    f = std::copysign(0.0, x / y);
  }
  *div = f;
  *mod = m;
}

Value repeat(const Value& seq, int64_t times) {
  const size_t n = times > 0 ? static_cast<size_t>(times) : 0;
  if (seq.is_string()) {
    const std::string& s = seq.str();
    // The product is checked before it is formed: n * size may not fit size_t. Marks count too:
    // an empty tagged string repeated makes no text but a mark per copy.
    const size_t one = s.size() + seq.marks().size() * sizeof(Mark);
    if (one > 0) budget::check_size(n > SIZE_MAX / one ? SIZE_MAX : n * one, "a repeated string");
    std::string out;
    out.reserve(n * s.size());
    std::vector<Mark> marks;
    for (size_t i = 0; i < n; ++i) {
      for (Mark m : seq.marks()) {
        m.begin += out.size();
        m.end += out.size();
        marks.push_back(m);
      }
      out += s;
    }
    return Value::string(std::move(out), std::move(marks));
  }
  const std::vector<Value>& xs = seq.items();
  if (!xs.empty()) budget::check_items(n > SIZE_MAX / xs.size() ? SIZE_MAX : n * xs.size(), sizeof(Value), "a repeated list");
  std::vector<Value> out;
  out.reserve(n * xs.size());
  for (size_t i = 0; i < n; ++i) out.insert(out.end(), xs.begin(), xs.end());
  return Value::list(std::move(out), seq.list_obj().tuple);
}

Value power(const Value& a, const Value& b, bool floats) {
  if (!floats && b.as_int() >= 0) {  // exponentiation by squaring, each product checked
    int64_t base = a.as_int(), r = 1;
    for (int64_t e = b.as_int(); e > 0; e >>= 1) {
      if ((e & 1) && __builtin_mul_overflow(r, base, &r)) too_large("**", a, b);
      if (e > 1 && __builtin_mul_overflow(base, base, &base)) too_large("**", a, b);
    }
    return Value::integer(r);
  }
  const double x = a.as_double(), y = b.as_double();
  if (x == 0 && y < 0) fail("0.0 cannot be raised to a negative power");
  if (x < 0 && std::isfinite(y) && y != std::floor(y))
    fail(absl::StrCat(a.repr(), " ** ", b.repr(), " is a complex number, which Loom does not support"));
  const double r = std::pow(x, y);
  if (std::isinf(r) && std::isfinite(x) && std::isfinite(y)) fail(absl::StrCat(a.repr(), " ** ", b.repr(), ": result too large"));
  return Value::number(r);
}

}  // namespace

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  const bool nums = a.is_number() && b.is_number();
  const bool floats = nums && (a.type() == T::kFloat || b.type() == T::kFloat);
  const auto bad = [&]() -> Value {
    if (op == "+" && a.is_string())
      fail(absl::StrCat("can only concatenate str (not \"", b.type_name(), "\") to str"));
    if (a.is_undefined() || b.is_undefined())
      fail(absl::StrCat("'", (a.is_undefined() ? a : b).hint(), "' is undefined"));
    fail(absl::StrCat("unsupported operand type(s) for ", op, ": '", a.type_name(), "' and '", b.type_name(), "'"));
  };
  const auto is_count = [](const Value& v) { return v.is_number() && v.type() != T::kFloat; };
  if (op == "+") {
    if (nums && floats) return Value::number(a.as_double() + b.as_double());
    if (nums) {
      int64_t r;
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) too_large(op, a, b);
      return Value::integer(r);
    }
    if (a.is_string() && b.is_string()) return concat(a, b);
    if (a.is_list() && b.is_list()) {
      budget::check_items(a.items().size() + b.items().size(), sizeof(Value), "a list");
      std::vector<Value> items;
      items.reserve(a.items().size() + b.items().size());
      items.insert(items.end(), a.items().begin(), a.items().end());
      items.insert(items.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(items), a.list_obj().tuple && b.list_obj().tuple);
    }
    return bad();
  }
  if (op == "*" && (a.is_string() || a.is_list()) && is_count(b)) return repeat(a, b.as_int());
  if (op == "*" && (b.is_string() || b.is_list()) && is_count(a)) return repeat(b, a.as_int());
  if (!nums) return bad();
  const double x = a.as_double(), y = b.as_double();
  const int64_t p = a.as_int(), q = b.as_int();
  if (op == "-" || op == "*") {
    if (floats) return Value::number(op == "-" ? x - y : x * y);
    int64_t r;
    if (op == "-" ? __builtin_sub_overflow(p, q, &r) : __builtin_mul_overflow(p, q, &r)) too_large(op, a, b);
    return Value::integer(r);
  }
  if (op == "/") {
    if (y == 0) fail(floats ? "float division by zero" : "division by zero");
    return Value::number(x / y);
  }
  if (op == "//" || op == "%") {
    if (floats) {
      if (y == 0) fail(op == "//" ? "float floor division by zero" : "float modulo by zero");
      double d, m;
      float_divmod(x, y, &d, &m);
      return Value::number(op == "//" ? d : m);
    }
    if (q == 0) fail("integer division or modulo by zero");
    if (q == -1) {  // p / -1 traps for p = -2**63 in C++; Python's -p
      if (op == "%") return Value::integer(0);
      if (p == INT64_MIN) too_large(op, a, b);
      return Value::integer(-p);
    }
    int64_t d = p / q, m = p % q;
    if (m != 0 && ((m < 0) != (q < 0))) --d, m += q;
    return Value::integer(op == "//" ? d : m);
  }
  if (op == "**") return power(a, b, floats);
  return bad();
}

}  // namespace loom::jinja
