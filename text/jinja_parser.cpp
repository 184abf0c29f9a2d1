// Jinja parser: segments to a syntax tree, with Jinja's operator precedence (lowest first):
// `x if c else y`, or, and, not, comparisons and `in`, + -, ~, * / // %, **, unary - +, then
// postfix `.attr`, `[index]`, `[a:b:c]`, calls, `| filter` and `is test`.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "text/jinja_ast.h"

namespace loom::jinja {
namespace {

[[noreturn]] void fail_at(int line, std::string message) { throw Error{line, std::move(message)}; }

ExprPtr make(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

// Expressions of one tag's tokens.
class ExprParser {
 public:
  explicit ExprParser(const std::vector<Token>& tokens) : t_(tokens) {}

  const Token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(i_++, t_.size() - 1)]; }
  bool is_op(const char* op, size_t ahead = 0) const { return peek(ahead).kind == Token::kOp && peek(ahead).text == op; }
  bool is_name(const char* n, size_t ahead = 0) const { return peek(ahead).kind == Token::kName && peek(ahead).text == n; }
  bool at_end() const { return peek().kind == Token::kEnd; }
  [[noreturn]] void unexpected(const std::string& wanted) const {
    const Token& k = peek();
    const std::string got = k.kind == Token::kEnd      ? "the end of the tag"
                            : k.kind == Token::kString ? "a string"
                                                       : absl::StrCat("'", k.text.empty() ? "number" : k.text, "'");
    fail_at(k.line, absl::StrCat("expected ", wanted, ", got ", got));
  }
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

  ExprPtr expression(bool with_cond = true) {
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
      return c;
    }
    return e;
  }

  // An expression, or a tuple of them when separated by commas (the value of a set).
  ExprPtr tuple_or_expression() {
    ExprPtr first = expression();
    if (!is_op(",")) return first;
    auto t = make(Expr::kTuple, first->line);
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (at_end()) break;
      t->args.push_back(expression());
    }
    return t;
  }

 private:
  const std::vector<Token>& t_;
  size_t i_ = 0;

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, int line) {
    auto e = make(Expr::kBinary, line);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }
  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (is_name("or")) {
      const int line = next().line;
      e = binary("or", std::move(e), and_expr(), line);
    }
    return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (is_name("and")) {
      const int line = next().line;
      e = binary("and", std::move(e), not_expr(), line);
    }
    return e;
  }
  ExprPtr not_expr() {
    if (is_name("not")) {
      auto e = make(Expr::kUnary, next().line);
      e->name = "not";
      e->args.push_back(not_expr());
      return e;
    }
    return compare();
  }
  ExprPtr compare() {
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
    return e ? std::move(e) : std::move(first);
  }
  ExprPtr math1() {
    ExprPtr e = concat();
    while (is_op("+") || is_op("-")) {
      const Token op = next();
      e = binary(op.text, std::move(e), concat(), op.line);
    }
    return e;
  }
  ExprPtr concat() {
    ExprPtr e = math2();
    while (is_op("~")) {
      const int line = next().line;
      e = binary("~", std::move(e), math2(), line);
    }
    return e;
  }
  ExprPtr math2() {
    ExprPtr e = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token op = next();
      e = binary(op.text, std::move(e), power(), op.line);
    }
    return e;
  }
  ExprPtr power() {
    ExprPtr e = unary(true);
    while (is_op("**")) {
      const int line = next().line;
      e = binary("**", std::move(e), unary(true), line);
    }
    return e;
  }
  ExprPtr unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token op = next();
      e = make(Expr::kUnary, op.line);
      e->name = op.text;
      e->args.push_back(unary(false));
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
  ExprPtr primary() {
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
          return t;
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
          return l;
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
          return d;
        }
        break;
      default: break;
    }
    unexpected("an expression");
  }
  ExprPtr literal(Value v, int line) {
    auto e = make(Expr::kLiteral, line);
    e->value = std::move(v);
    return e;
  }
  ExprPtr sequence(Expr::Kind kind, int line) { return make(kind, line); }
  ExprPtr postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        if (peek().kind == Token::kInt) {  // x.0 is x[0]
          auto ix = make(Expr::kIndex, line);
          ix->args.push_back(std::move(e));
          ix->args.push_back(literal(Value::integer(next().i), line));
          e = std::move(ix);
          continue;
        }
        auto a = make(Expr::kAttr, line);
        a->name = expect_name();
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (is_op("[")) {
        e = subscript(std::move(e));
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }
  ExprPtr subscript(ExprPtr e) {
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
      return ix;
    }
    auto s = make(Expr::kSlice, line);
    s->args.push_back(std::move(e));
    for (auto& p : parts) s->args.push_back(std::move(p));
    return s;
  }
  // ( args ) into e->args (after the existing ones) and e->kwargs.
  void arguments(Expr* e) {
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
  ExprPtr call(ExprPtr callee) {
    auto c = make(Expr::kCall, peek().line);
    c->args.push_back(std::move(callee));
    arguments(c.get());
    return c;
  }
  ExprPtr filter(ExprPtr e) {
    const int line = next().line;  // |
    auto f = make(Expr::kFilter, line);
    f->name = expect_name();
    if (!is_filter(f->name)) fail_at(line, absl::StrCat("unknown or unsupported filter '", f->name, "'"));
    f->args.push_back(std::move(e));
    if (is_op("(")) arguments(f.get());
    return f;
  }
  ExprPtr test(ExprPtr e) {
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
    return t;
  }
};

// Statements over the segment list.
class Parser {
 public:
  explicit Parser(std::vector<Segment> segs) : s_(std::move(segs)) {}

  Body top() {
    Body b = body({});
    return b;
  }

 private:
  std::vector<Segment> s_;
  size_t i_ = 0;
  int loops_ = 0;         // for loops open around the statement being parsed
  std::string end_tag_;  // the tag that ended the last body()
  std::unique_ptr<ExprParser> end_parser_;  // positioned after the end tag's name

  // Parses statements until one of the `ends` tags; leaves it in end_tag_/end_parser_.
  Body body(const std::vector<std::string>& ends) {
    Body out;
    const int start_line = i_ < s_.size() ? s_[i_].line : 0;
    while (i_ < s_.size()) {
      Segment& seg = s_[i_++];
      if (seg.kind == Segment::kText) {
        auto st = std::make_unique<Stmt>();
        st->kind = Stmt::kText;
        st->line = seg.line;
        st->text = std::move(seg.text);
        out.push_back(std::move(st));
        continue;
      }
      auto p = std::make_unique<ExprParser>(seg.tokens);
      if (seg.kind == Segment::kOutput) {
        auto st = std::make_unique<Stmt>();
        st->kind = Stmt::kOutput;
        st->line = seg.line;
        st->expr = p->tuple_or_expression();
        p->expect_end();
        out.push_back(std::move(st));
        continue;
      }
      if (p->at_end()) fail_at(seg.line, "empty {% %} tag");
      const std::string tag = p->expect_name();
      for (const auto& e : ends) {
        if (tag == e) {
          end_tag_ = tag;
          end_parser_ = std::move(p);
          return out;
        }
      }
      out.push_back(statement(tag, *p, seg.line));
    }
    if (!ends.empty())
      fail_at(start_line, absl::StrCat("block is never closed: expected ", absl::StrJoin(ends, " or ")));
    return out;
  }

  std::unique_ptr<Stmt> statement(const std::string& tag, ExprParser& p, int line) {
    auto st = std::make_unique<Stmt>();
    st->line = line;
    if (tag == "if") {
      st->kind = Stmt::kIf;
      ExprPtr cond = p.expression();
      p.expect_end();
      while (true) {
        Body b = body({"elif", "else", "endif"});
        st->branches.emplace_back(std::move(cond), std::move(b));
        if (end_tag_ == "endif") break;
        if (end_tag_ == "else") {
          end_parser_->expect_end();
          Body e = body({"endif"});
          st->branches.emplace_back(nullptr, std::move(e));
          break;
        }
        cond = end_parser_->expression();
        end_parser_->expect_end();
      }
      end_parser_->expect_end();
      return st;
    }
    if (tag == "for") {
      st->kind = Stmt::kFor;
      st->targets.push_back(p.expect_name());
      while (p.is_op(",")) p.next(), st->targets.push_back(p.expect_name());
      if (!p.is_name("in")) p.unexpected("'in'");
      p.next();
      st->expr = p.expression(/*with_cond=*/false);
      if (p.is_name("if")) {
        p.next();
        st->filter = p.expression(false);
      }
      if (p.is_name("recursive")) fail_at(line, "recursive for loops are not supported");
      p.expect_end();
      ++loops_;
      st->body = body({"else", "endfor"});
      --loops_;
      if (end_tag_ == "else") {
        end_parser_->expect_end();
        st->else_body = body({"endfor"});
      }
      end_parser_->expect_end();
      return st;
    }
    if (tag == "set") {
      std::string first = p.expect_name();
      if (p.is_op(".")) {  // set ns.attr = value
        p.next();
        st->kind = Stmt::kSet;
        st->targets.push_back(std::move(first));
        st->attr = p.expect_name();
        p.expect_op("=");
        st->expr = p.tuple_or_expression();
        p.expect_end();
        return st;
      }
      st->targets.push_back(std::move(first));
      while (p.is_op(",")) p.next(), st->targets.push_back(p.expect_name());
      if (p.at_end() && st->targets.size() == 1) {  // {% set x %}...{% endset %}
        st->kind = Stmt::kSetBlock;
        st->body = body({"endset"});
        end_parser_->expect_end();
        return st;
      }
      st->kind = Stmt::kSet;
      p.expect_op("=");
      st->expr = p.tuple_or_expression();
      p.expect_end();
      return st;
    }
    if (tag == "macro") {
      st->kind = Stmt::kMacro;
      st->text = p.expect_name();
      p.expect_op("(");
      while (!p.is_op(")")) {
        st->targets.push_back(p.expect_name());
        if (p.is_op("=")) {
          p.next();
          st->defaults.push_back(p.expression());
        } else {
          if (!st->defaults.empty() && st->defaults.back())
            fail_at(line, "a macro parameter without a default follows one with a default");
          st->defaults.push_back(nullptr);
        }
        if (!p.is_op(",")) break;
        p.next();
      }
      p.expect_op(")");
      p.expect_end();
      const int loops = loops_;
      loops_ = 0;  // a loop around the definition is not around the macro's body
      st->body = body({"endmacro"});
      loops_ = loops;
      end_parser_->expect_end();
      return st;
    }
    if (tag == "break" || tag == "continue") {
      st->kind = tag == "break" ? Stmt::kBreak : Stmt::kContinue;
      if (loops_ == 0) fail_at(line, absl::StrCat("{% ", tag, " %} outside a for loop"));
      p.expect_end();
      return st;
    }
    if (tag == "generation") {
      st->kind = Stmt::kGeneration;
      p.expect_end();
      st->body = body({"endgeneration"});
      end_parser_->expect_end();
      return st;
    }
    if (tag == "filter") {
      st->kind = Stmt::kFilterBlock;
      st->text = p.expect_name();
      if (!is_filter(st->text)) fail_at(line, absl::StrCat("unknown or unsupported filter '", st->text, "'"));
      st->expr = make(Expr::kFilter, line);
      st->expr->name = st->text;
      st->expr->args.push_back(nullptr);  // the rendered body goes here
      if (p.is_op("(")) fail_at(line, "arguments to a {% filter %} block are not supported");
      p.expect_end();
      st->body = body({"endfilter"});
      end_parser_->expect_end();
      return st;
    }
    fail_at(line, absl::StrCat("unsupported tag '{% ", tag, " %}'"));
  }
};

}  // namespace

Body parse(std::vector<Segment> segments) { return Parser(std::move(segments)).top(); }

}  // namespace loom::jinja
