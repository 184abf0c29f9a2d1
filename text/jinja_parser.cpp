// Jinja parser, statements: if/elif/else, for (targets, inline if, else), set (names, namespace
// attributes, blocks), macro, break/continue, generation and filter blocks; anything else is an
// error naming the line. Expressions: jinja_expr_parser.cpp.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "text/jinja_ast.h"
#include "text/jinja_parser_internal.h"

namespace loom::jinja {
namespace {

// Statements over the segment list.
class Parser {
 public:
  Parser(std::vector<Segment> segs, const Limits& limits) : s_(std::move(segs)), max_depth_(limits.max_depth) {}

  Body top() {
    Body b = body({});
    return b;
  }

 private:
  std::vector<Segment> s_;
  size_t i_ = 0;
  const int max_depth_;
  int depth_ = 0;         // blocks open around the statement being parsed
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
      auto p = std::make_unique<ExprParser>(seg.tokens, depth_, max_depth_);
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

  // A block's body one level deeper.
  Body block(const std::vector<std::string>& ends, int line) {
    if (++depth_ > max_depth_)
      fail_at(line, absl::StrCat("nesting deeper than ", max_depth_, " levels (Limits::max_depth)"));
    Body b = body(ends);
    --depth_;
    return b;
  }

  std::unique_ptr<Stmt> statement(const std::string& tag, ExprParser& p, int line) {
    auto st = std::make_unique<Stmt>();
    st->line = line;
    if (tag == "if") {
      st->kind = Stmt::kIf;
      ExprPtr cond = p.expression();
      p.expect_end();
      while (true) {
        Body b = block({"elif", "else", "endif"}, line);
        st->branches.emplace_back(std::move(cond), std::move(b));
        if (end_tag_ == "endif") break;
        if (end_tag_ == "else") {
          end_parser_->expect_end();
          Body e = block({"endif"}, line);
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
      st->body = block({"else", "endfor"}, line);
      --loops_;
      if (end_tag_ == "else") {
        end_parser_->expect_end();
        st->else_body = block({"endfor"}, line);
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
        st->body = block({"endset"}, line);
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
      st->body = block({"endmacro"}, line);
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
      st->body = block({"endgeneration"}, line);
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
      st->body = block({"endfilter"}, line);
      end_parser_->expect_end();
      return st;
    }
    fail_at(line, absl::StrCat("unsupported tag '{% ", tag, " %}'"));
  }
};

}  // namespace

Body parse(std::vector<Segment> segments, const Limits& limits) {
  return Parser(std::move(segments), limits).top();
}

}  // namespace loom::jinja
