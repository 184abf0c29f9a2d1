// Jinja expressions (see jinja_parser_internal.h for the precedence).
#include "absl/strings/str_cat.h"
#include "text/jinja_parser_internal.h"

namespace loom::jinja {

void ExprParser::unexpected(const std::string& wanted) const {
  const Token& k = peek();
  const std::string got = k.kind == Token::kEnd      ? "the end of the tag"
                          : k.kind == Token::kString ? "a string"
                                                     : absl::StrCat("'", k.text.empty() ? "number" : k.text, "'");
  fail_at(k.line, absl::StrCat("expected ", wanted, ", got ", got));
}

void ExprParser::deeper() {
  if (++depth_ > max_depth_)
    fail_at(peek().line, absl::StrCat("nesting deeper than ", max_depth_, " levels (Limits::max_depth)"));
}

ExprPtr ExprParser::done(ExprPtr e) {
  int d = 0;
  for (const auto& a : e->args)
    if (a) d = std::max(d, a->depth);
  for (const auto& kv : e->kwargs) d = std::max(d, kv.second->depth);
  e->depth = d + 1;
  if (base_ + e->depth > max_depth_)
    fail_at(e->line, absl::StrCat("nesting deeper than ", max_depth_, " levels (Limits::max_depth)"));
  return e;
}

ExprPtr ExprParser::expression(bool with_cond) {
  Nest nest(*this);
  deeper();
  ExprPtr e = or_expr();
  if (with_cond && is_name("if")) {
    const int line = next().line;
    auto c = make(Expr::kCond, line);
    ExprPtr cond = or_expr();
    ExprPtr other;
    if (is_name("else")) {
      next();
      other = expression();
    }
    c->args.push_back(std::move(cond));
    c->args.push_back(std::move(e));
    c->args.push_back(std::move(other));
    return done(std::move(c));
  }
  return e;
}

ExprPtr ExprParser::tuple_or_expression() {
  Nest nest(*this);
  deeper();
  ExprPtr first = expression();
  if (!is_op(",")) return first;
  auto t = make(Expr::kTuple, first->line);
  t->args.push_back(std::move(first));
  while (is_op(",")) {
    next();
    if (at_end()) break;
    t->args.push_back(expression());
  }
  return done(std::move(t));
}

ExprPtr ExprParser::binary(const std::string& op, ExprPtr a, ExprPtr b, int line) {
  auto e = make(Expr::kBinary, line);
  e->name = op;
  e->args.push_back(std::move(a));
  e->args.push_back(std::move(b));
  return done(std::move(e));
}

ExprPtr ExprParser::or_expr() {
  ExprPtr e = and_expr();
  while (is_name("or")) {
    const int line = next().line;
    e = binary("or", std::move(e), and_expr(), line);
  }
  return e;
}

ExprPtr ExprParser::and_expr() {
  ExprPtr e = not_expr();
  while (is_name("and")) {
    const int line = next().line;
    e = binary("and", std::move(e), not_expr(), line);
  }
  return e;
}

ExprPtr ExprParser::not_expr() {
  if (is_name("not")) {
    Nest nest(*this);
    deeper();
    auto e = make(Expr::kUnary, next().line);
    e->name = "not";
    e->args.push_back(not_expr());
    return done(std::move(e));
  }
  return compare();
}

ExprPtr ExprParser::compare() {
  ExprPtr first = math1();
  ExprPtr e;
  while (true) {
    std::string op;
    if (peek().kind == Token::kOp &&
        (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == "<=" ||
         peek().text == ">" || peek().text == ">=")) {
      op = next().text;
    } else if (is_name("in")) {
      next();
      op = "in";
    } else if (is_name("not") && is_name("in", 1)) {
      next(), next();
      op = "not in";
    } else {
      break;
    }
    if (!e) {
      e = make(Expr::kCompare, first->line);
      e->args.push_back(std::move(first));
    }
    e->names.push_back(op);
    e->args.push_back(math1());
  }
  return e ? done(std::move(e)) : std::move(first);
}

ExprPtr ExprParser::math1() {
  ExprPtr e = concat();
  while (is_op("+") || is_op("-")) {
    const Token op = next();
    e = binary(op.text, std::move(e), concat(), op.line);
  }
  return e;
}

ExprPtr ExprParser::concat() {
  ExprPtr e = math2();
  while (is_op("~")) {
    const int line = next().line;
    e = binary("~", std::move(e), math2(), line);
  }
  return e;
}

ExprPtr ExprParser::math2() {
  ExprPtr e = power();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const Token op = next();
    e = binary(op.text, std::move(e), power(), op.line);
  }
  return e;
}

ExprPtr ExprParser::power() {
  ExprPtr e = unary(true);
  while (is_op("**")) {
    const int line = next().line;
    e = binary("**", std::move(e), unary(true), line);
  }
  return e;
}

ExprPtr ExprParser::unary(bool with_filter) {
  Nest nest(*this);
  ExprPtr e;
  if (is_op("-") || is_op("+")) {
    deeper();
    const Token op = next();
    e = make(Expr::kUnary, op.line);
    e->name = op.text;
    e->args.push_back(unary(false));
    e = done(std::move(e));
  } else {
    e = primary();
  }
  e = postfix(std::move(e));
  if (!with_filter) return e;
  while (true) {
    if (is_op("|")) {
      e = filter(std::move(e));
    } else if (is_name("is")) {
      e = test(std::move(e));
    } else if (is_op("(")) {
      e = call(std::move(e));
    } else {
      return e;
    }
  }
}

ExprPtr ExprParser::primary() {
  const Token k = peek();
  switch (k.kind) {
    case Token::kName: {
      next();
      if (k.text == "true" || k.text == "True") return literal(Value::boolean(true), k.line);
      if (k.text == "false" || k.text == "False") return literal(Value::boolean(false), k.line);
      if (k.text == "none" || k.text == "None") return literal(Value::none(), k.line);
      auto e = make(Expr::kName, k.line);
      e->name = k.text;
      return e;
    }
    case Token::kString: {
      std::string s;
      while (peek().kind == Token::kString) s += next().text;  // adjacent literals concatenate
      return literal(Value::string(std::move(s)), k.line);
    }
    case Token::kInt: return next(), literal(Value::integer(k.i), k.line);
    case Token::kFloat: return next(), literal(Value::number(k.d), k.line);
    case Token::kOp:
      if (k.text == "(") {
        next();
        if (is_op(")")) return next(), sequence(Expr::kTuple, k.line);
        ExprPtr first = expression();
        if (is_op(")")) return next(), std::move(first);
        auto t = make(Expr::kTuple, k.line);
        t->args.push_back(std::move(first));
        while (is_op(",")) {
          next();
          if (is_op(")")) break;
          t->args.push_back(expression());
        }
        expect_op(")");
        return done(std::move(t));
      }
      if (k.text == "[") {
        next();
        auto l = make(Expr::kList, k.line);
        while (!is_op("]")) {
          l->args.push_back(expression());
          if (!is_op(",")) break;
          next();
        }
        expect_op("]");
        return done(std::move(l));
      }
      if (k.text == "{") {
        next();
        auto d = make(Expr::kDict, k.line);
        while (!is_op("}")) {
          d->args.push_back(expression());
          expect_op(":");
          d->args.push_back(expression());
          if (!is_op(",")) break;
          next();
        }
        expect_op("}");
        return done(std::move(d));
      }
      break;
    default: break;
  }
  unexpected("an expression");
}

ExprPtr ExprParser::literal(Value v, int line) {
  auto e = make(Expr::kLiteral, line);
  e->value = std::move(v);
  return e;
}

ExprPtr ExprParser::postfix(ExprPtr e) {
  while (true) {
    if (is_op(".")) {
      const int line = next().line;
      if (peek().kind == Token::kInt) {  // x.0 is x[0]
        auto ix = make(Expr::kIndex, line);
        ix->args.push_back(std::move(e));
        ix->args.push_back(literal(Value::integer(next().i), line));
        e = done(std::move(ix));
        continue;
      }
      auto a = make(Expr::kAttr, line);
      a->name = expect_name();
      a->args.push_back(std::move(e));
      e = done(std::move(a));
    } else if (is_op("[")) {
      e = subscript(std::move(e));
    } else if (is_op("(")) {
      e = call(std::move(e));
    } else {
      return e;
    }
  }
}

ExprPtr ExprParser::subscript(ExprPtr e) {
  const int line = next().line;  // [
  ExprPtr parts[3];
  int colons = 0;
  while (!is_op("]")) {
    if (is_op(":")) {
      if (++colons > 2) unexpected("']'");
      next();
      continue;
    }
    if (parts[colons]) unexpected("':' or ']'");
    parts[colons] = expression();
  }
  next();
  if (colons == 0) {
    if (!parts[0]) fail_at(line, "empty subscript []");
    auto ix = make(Expr::kIndex, line);
    ix->args.push_back(std::move(e));
    ix->args.push_back(std::move(parts[0]));
    return done(std::move(ix));
  }
  auto s = make(Expr::kSlice, line);
  s->args.push_back(std::move(e));
  for (auto& p : parts) s->args.push_back(std::move(p));
  return done(std::move(s));
}

void ExprParser::arguments(Expr* e) {
  expect_op("(");
  while (!is_op(")")) {
    if (is_op("*") || is_op("**")) fail_at(peek().line, "*args and **kwargs in calls are not supported");
    if (peek().kind == Token::kName && is_op("=", 1)) {
      std::string name = next().text;
      next();
      e->kwargs.emplace_back(std::move(name), expression());
    } else {
      if (!e->kwargs.empty()) fail_at(peek().line, "a positional argument follows a keyword argument");
      e->args.push_back(expression());
    }
    if (!is_op(",")) break;
    next();
  }
  expect_op(")");
}

ExprPtr ExprParser::call(ExprPtr callee) {
  auto c = make(Expr::kCall, peek().line);
  c->args.push_back(std::move(callee));
  arguments(c.get());
  return done(std::move(c));
}

ExprPtr ExprParser::filter(ExprPtr e) {
  const int line = next().line;  // |
  auto f = make(Expr::kFilter, line);
  f->name = expect_name();
  if (!is_filter(f->name)) fail_at(line, absl::StrCat("unknown or unsupported filter '", f->name, "'"));
  f->args.push_back(std::move(e));
  if (is_op("(")) arguments(f.get());
  return done(std::move(f));
}

ExprPtr ExprParser::test(ExprPtr e) {
  const int line = next().line;  // is
  auto t = make(Expr::kTest, line);
  if (is_name("not")) next(), t->negated = true;
  // Tests named like keywords (none, true, false, in) arrive as names too.
  t->name = expect_name();
  if (!is_test(t->name)) fail_at(line, absl::StrCat("unknown or unsupported test '", t->name, "'"));
  t->args.push_back(std::move(e));
  if (is_op("(")) {
    arguments(t.get());
  } else {
    const Token& k = peek();
    const bool arg = (k.kind == Token::kName && k.text != "else" && k.text != "or" && k.text != "and" &&
                      k.text != "if" && k.text != "not" && k.text != "is" && k.text != "in") ||
                     k.kind == Token::kString || k.kind == Token::kInt || k.kind == Token::kFloat ||
                     (k.kind == Token::kOp && (k.text == "[" || k.text == "{"));
    if (arg) t->args.push_back(postfix(primary()));
  }
  return done(std::move(t));
}

}  // namespace loom::jinja
