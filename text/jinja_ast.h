// Internal to the Jinja interpreter: the lexer's segments and tokens, and the syntax tree the
// parser builds and the evaluator walks. Every node keeps its template line for error messages.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_limits.h"
#include "text/jinja_value.h"

namespace loom::jinja {

struct Token {
  enum Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind = kEnd;
  std::string text;  // name, operator, or the unescaped string literal
  int64_t i = 0;
  double d = 0;
  int line = 0;
};

// The template cut into text and tags, whitespace control already applied to the text.
struct Segment {
  enum Kind { kText, kOutput, kStatement } kind = kText;
  std::string text;           // kText
  std::vector<Token> tokens;  // kOutput / kStatement, ending with a kEnd token
  int line = 0;
};
// Splits source into segments with transformers' settings (trim_blocks, lstrip_blocks) and the
// -/+ markers; comments are dropped. Throws Error on an unclosed tag or a bad token.
std::vector<Segment> lex(const std::string& source);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Expr {
  enum Kind {
    kLiteral,   // value
    kName,      // name
    kList,      // args
    kTuple,     // args
    kDict,      // kwargs-like pairs: keys in args[2i], values in args[2i+1]
    kAttr,      // args[0] . name
    kIndex,     // args[0] [ args[1] ]
    kSlice,     // args[0] [ args[1] : args[2] : args[3] ] (null = omitted)
    kCall,      // args[0] ( args[1..], kwargs )
    kFilter,    // name: args[0] | name ( args[1..], kwargs )
    kTest,      // name: args[0] is [not] name ( args[1..] )
    kUnary,     // name in {-, +, not}: args[0]
    kBinary,    // name in {+, -, *, /, //, %, **, ~, and, or}: args[0], args[1]
    kCompare,   // names[i] between args[i] and args[i+1] (==, !=, <, <=, >, >=, in, not in)
    kCond,      // args[1] if args[0] else args[2] (args[2] null = undefined)
  } kind = kLiteral;
  int line = 0;
  int depth = 1;  // of the subtree (ExprParser::done)
  Value value;
  std::string name;
  std::vector<std::string> names;
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;
struct Stmt {
  enum Kind {
    kText,        // text
    kOutput,      // {{ expr }}
    kIf,          // branches (cond null = else)
    kFor,         // targets in expr [if filter] body [else else_body]
    kSet,         // targets = expr (or ns.attr = expr when attr is set)
    kSetBlock,    // {% set targets[0] %}body{% endset %}
    kMacro,       // name(targets with defaults) body
    kBreak,
    kContinue,
    kGeneration,  // {% generation %}body{% endgeneration %}: rendered as is
    kFilterBlock, // {% filter name %}body{% endfilter %}: name in text, args in expr's args
  } kind = kText;
  int line = 0;
  std::string text;
  std::string attr;
  ExprPtr expr, filter;
  std::vector<std::string> targets;
  std::vector<ExprPtr> defaults;  // macro parameter defaults (null = required)
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
};

// Parses segments into a body. Throws Error naming the line for syntax errors, unknown filters
// and tests, and tags Loom does not implement (include, import, extends, block, call, raw, ...).
// Past Limits::max_depth (blocks and expressions nested) it throws too.
Body parse(std::vector<Segment> segments, const Limits& limits);

// Known filter and test names (checked when parsing).
bool is_filter(const std::string& name);
bool is_test(const std::string& name);

}  // namespace loom::jinja
