// Internal to the Jinja interpreter: the evaluator's state (scopes, output with marks, loop
// control) shared by the statement/expression evaluator and the built-in filters, tests and methods.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_ast.h"

namespace loom::jinja {

// Rendered text; past Limits::max_output_bytes appending fails.
struct Output {
  std::string text;
  std::vector<Mark> marks;  // output byte ranges that came from tagged strings
  void append(const Value& v);
  void append(const std::string& s, size_t new_marks = 0);
};

class Interp {
 public:
  struct Frame {
    std::vector<std::pair<std::string, Value>> vars;
    Frame* parent = nullptr;
  };

  Interp(Frame* globals, const Limits& limits) : frame_(globals), root_(globals), limits_(limits) {}

  void exec(const Body& body, Output& out);
  Value eval(const Expr& e);
  Value call(const Value& fn, const CallArgs& args);
  Value attr(const Value& obj, const std::string& name);
  Value item(const Value& obj, const Value& key);

  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value v);
  int line() const { return line_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Frame* frame_;
  Frame* root_;
  int line_ = 0;
  Flow flow_ = Flow::kNormal;
  const Limits& limits_;
  int calls_ = 0;  // macro calls in progress
  int depth_ = 0;  // statements and expressions being evaluated, over all calls (the C++ stack)

  // Counts a step and one level of evaluation nesting while it lives.
  struct Nest {
    explicit Nest(Interp& in);
    ~Nest() { --in.depth_; }
    Interp& in;
  };

  void exec_stmt(const Stmt& s, Output& out);
  [[gnu::noinline]] void exec_leaf(const Stmt& s, Output& out);
  [[gnu::noinline]] Value eval_node(const Expr& e);
  [[gnu::noinline]] Value build(const Expr& e);  // list, tuple, dict
  [[gnu::noinline]] Value apply_node(const Expr& e, const Value& first);
  [[gnu::noinline]] bool truthy(const Expr& e);
  void exec_for(const Stmt& s, Output& out);
  Value define_macro(const Stmt& s);
  Value binary(const Expr& e);
  [[gnu::noinline]] Value binary_rest(const Expr& e, const Value& left);
  Value compare(const Expr& e);
  Value slice(const Value& obj, const Expr* a, const Expr* b, const Expr* c);
  CallArgs arguments(const Expr& e, size_t first);
};

// Built-ins (text/jinja_builtins.cpp).
Value apply_filter(Interp& in, const std::string& name, const Value& v, const CallArgs& args);
bool apply_test(Interp& in, const std::string& name, const Value& v, const CallArgs& args);
// A str or dict method bound to obj (`content.strip`, `message.get`), or undefined when none.
Value method(const Value& obj, const std::string& name);
// range, namespace, dict, raise_exception, strftime_now.
void add_globals(Interp::Frame* frame);
// Python's a + b, a - b, ... for numbers, str + str, list + list.
Value arithmetic(const std::string& op, const Value& a, const Value& b);

}  // namespace loom::jinja
