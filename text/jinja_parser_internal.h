// Internal to the Jinja interpreter: the expression parser over one tag's tokens, with Jinja's
// operator precedence (lowest first): `x if c else y`, or, and, not, comparisons and `in`, + -, ~,
// * / // %, **, unary - +, then postfix `.attr`, `[index]`, `[a:b:c]`, calls, `| filter` and
// `is test` (jinja_expr_parser.cpp). The statement parser (jinja_parser.cpp) drives it.
#pragma once
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "text/jinja_ast.h"

namespace loom::jinja {

[[noreturn]] inline void fail_at(int line, std::string message) { throw Error{line, std::move(message)}; }

inline ExprPtr make(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

// One tag's expression. `depth` is the nesting of the blocks around the tag; each bracket,
// operator, filter, test, call or attribute nests one level deeper, and past max_depth parsing
// stops with an error: before the parser's recursion can exhaust the C++ stack, and before a
// tree is built that the evaluator or the tree's destructor would recurse too deeply through.
class ExprParser {
 public:
  ExprParser(const std::vector<Token>& tokens, int depth, int max_depth)
      : t_(tokens), base_(depth), depth_(depth), max_depth_(max_depth) {}

  const Token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(i_++, t_.size() - 1)]; }
  bool is_op(const char* op, size_t ahead = 0) const { return peek(ahead).kind == Token::kOp && peek(ahead).text == op; }
  bool is_name(const char* n, size_t ahead = 0) const { return peek(ahead).kind == Token::kName && peek(ahead).text == n; }
  bool at_end() const { return peek().kind == Token::kEnd; }
  [[noreturn]] void unexpected(const std::string& wanted) const;
  void expect_op(const char* op) {
    if (!is_op(op)) unexpected(absl::StrCat("'", op, "'"));
    next();
  }
  std::string expect_name() {
    if (peek().kind != Token::kName) unexpected("a name");
    return next().text;
  }
  void expect_end() {
    if (!at_end()) unexpected("the end of the tag");
  }

  ExprPtr expression(bool with_cond = true);

  // An expression, or a tuple of them when separated by commas (the value of a set).
  ExprPtr tuple_or_expression();

 private:
  const std::vector<Token>& t_;
  size_t i_ = 0;
  const int base_;   // the blocks around the tag
  int depth_;        // the parser's recursion
  const int max_depth_;

  // Restores the depth when the function that nested deeper returns.
  struct Nest {
    explicit Nest(ExprParser& p) : p(p), saved(p.depth_) {}
    ~Nest() { p.depth_ = saved; }
    ExprParser& p;
    const int saved;
  };
  void deeper();
  // Sets a finished node's depth (its subtree's, so loops that build long chains count too).
  ExprPtr done(ExprPtr e);

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, int line);
  ExprPtr or_expr();
  ExprPtr and_expr();
  ExprPtr not_expr();
  ExprPtr compare();
  ExprPtr math1();
  ExprPtr concat();
  ExprPtr math2();
  ExprPtr power();
  ExprPtr unary(bool with_filter);
  ExprPtr primary();
  ExprPtr literal(Value v, int line);
  ExprPtr sequence(Expr::Kind kind, int line) { return make(kind, line); }
  ExprPtr postfix(ExprPtr e);
  ExprPtr subscript(ExprPtr e);
  // ( args ) into e->args (after the existing ones) and e->kwargs.
  void arguments(Expr* e);
  ExprPtr call(ExprPtr callee);
  ExprPtr filter(ExprPtr e);
  ExprPtr test(ExprPtr e);
};

}  // namespace loom::jinja
