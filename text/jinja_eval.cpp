// Jinja evaluator: statements (text, output, if, for with loop/else/filter, set, namespace
// attributes, block set, macros, break/continue) and expressions, with Jinja's scoping: a for
// loop's body runs in a fresh scope each iteration, so what it sets does not leak out; `if` opens
// no scope; a macro sees the template's top-level names. Every statement and expression node is a
// step of the render's budget and a level of its nesting (Limits).
#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "text/jinja_interp.h"

namespace loom::jinja {

// An iteration builds the loop object (a dozen values, a callable, a scope): it costs as much as
// a few dozen expression nodes, and counts so.
constexpr int64_t kLoopSteps = 16;

// a ~ b, out of Interp::binary's frame (which recursion stacks up).
[[gnu::noinline]] static Value tilde(const Value& a, const Value& b) {
  const Value sa = a.is_string() ? a : Value::string(a.to_str());
  const Value sb = b.is_string() ? b : Value::string(b.to_str());
  return concat(sa, sb);
}

void Output::append(const std::string& s, size_t new_marks) {
  const size_t limit = budget::limits().max_output_bytes;
  if (text.size() + s.size() + (marks.size() + new_marks) * sizeof(Mark) > limit && budget::active())
    fail(absl::StrCat("the rendered text passes ", limit, " bytes (Limits::max_output_bytes; marks count too)"));
  budget::bytes(s.size());
  text += s;
}

void Output::append(const Value& v) {
  if (!v.is_string()) return append(v.to_str());
  const size_t at = text.size();
  append(v.str(), v.marks().size());
  for (Mark m : v.marks()) {
    m.begin += at;
    m.end += at;
    marks.push_back(m);
  }
}

Interp::Nest::Nest(Interp& in) : in(in) {
  budget::step();
  if (++in.depth_ > in.limits_.max_render_depth) {
    --in.depth_;
    fail(absl::StrCat("rendering nests deeper than ", in.limits_.max_render_depth,
                      " levels of blocks, expressions and macro calls (Limits::max_render_depth)"));
  }
}

Value Interp::lookup(const std::string& name) const {
  for (const Frame* f = frame_; f; f = f->parent)
    for (auto it = f->vars.rbegin(); it != f->vars.rend(); ++it)
      if (it->first == name) return it->second;
  return Value::undefined(name);
}

void Interp::assign(const std::string& name, Value v) {
  for (auto& [k, old] : frame_->vars) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  frame_->vars.emplace_back(name, std::move(v));
}

void Interp::exec(const Body& body, Output& out) {
  for (const auto& s : body) {
    exec_stmt(*s, out);
    if (flow_ != Flow::kNormal) return;
  }
}

// The statements that nest (if, for, generation) stay in exec_stmt with a small frame; the rest
// run in exec_leaf, whose locals would otherwise sit in every nested level's frame (much larger
// under AddressSanitizer, which gives each local its own guarded slot).
void Interp::exec_stmt(const Stmt& s, Output& out) {
  line_ = s.line;
  const Nest nest(*this);
  switch (s.kind) {
    case Stmt::kText: out.append(s.text); return;
    case Stmt::kIf:
      for (const auto& [cond, body] : s.branches) {
        if (!cond || truthy(*cond)) {
          exec(body, out);
          return;
        }
      }
      return;
    case Stmt::kFor: exec_for(s, out); return;
    case Stmt::kBreak:
    case Stmt::kContinue:
      flow_ = s.kind == Stmt::kBreak ? Flow::kBreak : Flow::kContinue;
      return;
    case Stmt::kGeneration: exec(s.body, out); return;
    default: exec_leaf(s, out); return;
  }
}

bool Interp::truthy(const Expr& e) { return eval(e).truthy(); }

void Interp::exec_leaf(const Stmt& s, Output& out) {
  switch (s.kind) {
    case Stmt::kOutput: {
      const Value v = eval(*s.expr);
      if (v.is_callable()) fail(absl::StrCat("cannot print the function '", v.hint(), "' (call it with ())"));
      out.append(v);
      return;
    }
    case Stmt::kSet: {
      Value v = eval(*s.expr);
      line_ = s.line;
      if (!s.attr.empty()) {
        const Value ns = lookup(s.targets[0]);
        if (!ns.is_dict() || !ns.dict_obj()->is_namespace)
          fail(absl::StrCat("cannot assign attribute '", s.attr, "' on '", s.targets[0],
                            "', which is not a namespace()"));
        ns.dict_obj()->set(s.attr, std::move(v));
        return;
      }
      if (s.targets.size() == 1) {
        assign(s.targets[0], std::move(v));
        return;
      }
      const std::vector<Value> parts = v.iterate();
      if (parts.size() != s.targets.size())
        fail(absl::StrCat("cannot unpack ", parts.size(), " values into ", s.targets.size(), " names"));
      for (size_t i = 0; i < parts.size(); ++i) assign(s.targets[i], parts[i]);
      return;
    }
    case Stmt::kSetBlock: {
      Output captured;
      exec(s.body, captured);
      assign(s.targets[0], Value::string(std::move(captured.text), std::move(captured.marks)));
      return;
    }
    case Stmt::kMacro: assign(s.text, define_macro(s)); return;
    case Stmt::kFilterBlock: {
      Output captured;
      exec(s.body, captured);
      line_ = s.line;
      out.append(apply_filter(*this, s.text, Value::string(std::move(captured.text), std::move(captured.marks)), {}));
      return;
    }
    default: return;
  }
}

void Interp::exec_for(const Stmt& s, Output& out) {
  std::vector<Value> all = eval(*s.expr).iterate();
  line_ = s.line;
  Frame* outer = frame_;
  std::vector<Value> items;
  if (s.filter) {
    for (Value& v : all) {
      Frame f{{}, outer};
      frame_ = &f;
      if (s.targets.size() == 1) {
        assign(s.targets[0], v);
      } else {
        const auto parts = v.iterate();
        for (size_t k = 0; k < s.targets.size() && k < parts.size(); ++k) assign(s.targets[k], parts[k]);
      }
      const bool keep = eval(*s.filter).truthy();
      frame_ = outer;
      if (keep) items.push_back(std::move(v));
    }
  } else {
    items = std::move(all);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    line_ = s.line;
    budget::step(kLoopSteps);
    Frame f{{}, outer};
    frame_ = &f;
    auto loop = std::make_shared<Dict>();
    auto& l = loop->items;  // distinct keys: no Dict::set lookups
    l.reserve(12);
    l.emplace_back("index", Value::integer(i + 1));
    l.emplace_back("index0", Value::integer(i));
    l.emplace_back("revindex", Value::integer(n - i));
    l.emplace_back("revindex0", Value::integer(n - i - 1));
    l.emplace_back("first", Value::boolean(i == 0));
    l.emplace_back("last", Value::boolean(i == n - 1));
    l.emplace_back("length", Value::integer(n));
    l.emplace_back("depth", Value::integer(1));
    l.emplace_back("depth0", Value::integer(0));
    if (i > 0) l.emplace_back("previtem", items[i - 1]);
    if (i + 1 < n) l.emplace_back("nextitem", items[i + 1]);
    l.emplace_back("cycle", Value::callable("loop.cycle", [i](Interp&, const CallArgs& a) {
                     if (a.pos.empty()) fail("loop.cycle() needs at least one argument");
                     return a.pos[static_cast<size_t>(i) % a.pos.size()];
                   }));
    assign("loop", Value::dict(loop));
    if (s.targets.size() == 1) {
      assign(s.targets[0], items[i]);
    } else {
      const auto parts = items[i].iterate();
      if (parts.size() != s.targets.size())
        fail(absl::StrCat("cannot unpack ", parts.size(), " values into ", s.targets.size(), " loop variables"));
      for (size_t k = 0; k < parts.size(); ++k) assign(s.targets[k], parts[k]);
    }
    exec(s.body, out);
    frame_ = outer;
    const Flow flow = flow_;
    flow_ = Flow::kNormal;
    if (flow == Flow::kBreak) break;
  }
  frame_ = outer;
  if (n == 0) exec(s.else_body, out);
}

Value Interp::define_macro(const Stmt& s) {
  const Stmt* def = &s;
  return Value::callable(s.text, [def](Interp& in, const CallArgs& args) {
    if (in.calls_ >= in.limits_.max_call_depth)
      fail(absl::StrCat("macro '", def->text, "' called with ", in.limits_.max_call_depth,
                        " macro calls in progress (Limits::max_call_depth): recursion without end?"));
    if (args.pos.size() > def->targets.size())
      fail(absl::StrCat("macro '", def->text, "' takes ", def->targets.size(), " arguments, got ", args.pos.size()));
    for (const auto& [k, v] : args.kw) {
      bool known = false;
      for (const auto& t : def->targets) known = known || t == k;
      if (!known) fail(absl::StrCat("macro '", def->text, "' has no parameter '", k, "'"));
    }
    Frame f{{}, in.root_};
    Frame* saved = in.frame_;
    const int saved_line = in.line_;
    // Defaults are evaluated in the macro's scope, after the parameters before them.
    in.frame_ = &f;
    for (size_t i = 0; i < def->targets.size(); ++i) {
      if (const Value* v = args.get(i, def->targets[i])) {
        in.assign(def->targets[i], *v);
      } else if (def->defaults[i]) {
        in.assign(def->targets[i], in.eval(*def->defaults[i]));
      } else {
        in.assign(def->targets[i], Value::undefined(def->targets[i]));
      }
    }
    Output out;
    ++in.calls_;
    const Flow saved_flow = in.flow_;
    in.exec(def->body, out);
    in.flow_ = saved_flow;
    --in.calls_;
    in.frame_ = saved;
    in.line_ = saved_line;
    return Value::string(std::move(out.text), std::move(out.marks));
  });
}

CallArgs Interp::arguments(const Expr& e, size_t first) {
  CallArgs a;
  for (size_t i = first; i < e.args.size(); ++i) a.pos.push_back(eval(*e.args[i]));
  for (const auto& [k, v] : e.kwargs) a.kw.emplace_back(k, eval(*v));
  return a;
}

Value Interp::call(const Value& fn, const CallArgs& args) {
  if (fn.is_undefined()) fail(absl::StrCat("'", fn.hint(), "' is undefined"));
  if (!fn.is_callable()) fail(absl::StrCat("'", fn.type_name(), "' object is not callable"));
  return fn.fn()(*this, args);
}

Value Interp::attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail(absl::StrCat("'", obj.hint(), "' is undefined"));
  if (obj.is_dict()) {
    if (const Value* v = obj.dict_obj()->find(name)) return *v;
  }
  Value m = method(obj, name);
  if (!m.is_undefined()) return m;
  return Value::undefined(absl::StrCat(obj.type_name(), " object has no attribute '", name, "'"));
}

Value Interp::item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail(absl::StrCat("'", obj.hint(), "' is undefined"));
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = obj.dict_obj()->find(key.str())) return *v;
      return Value::undefined(absl::StrCat("dict object has no element '", key.str(), "'"));
    }
    return Value::undefined("dict object has no such element");
  }
  if ((obj.is_list() || obj.is_string()) && key.is_number() && key.type() != Value::Type::kFloat) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.items().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(absl::StrCat("list index ", key.as_int(), " out of range"));
      return obj.items()[static_cast<size_t>(i)];
    }
    const auto starts = code_point_starts(obj.str());
    const int64_t n = static_cast<int64_t>(starts.size()) - 1;
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined(absl::StrCat("string index ", key.as_int(), " out of range"));
    return substring(obj, starts[static_cast<size_t>(i)], starts[static_cast<size_t>(i) + 1]);
  }
  if (key.is_string()) return attr(obj, key.str());
  return Value::undefined(absl::StrCat(obj.type_name(), " object has no element ", key.repr()));
}

Value Interp::slice(const Value& obj, const Expr* a, const Expr* b, const Expr* c) {
  const auto bound = [&](const Expr* e) -> std::optional<int64_t> {
    if (!e) return std::nullopt;
    const Value v = eval(*e);
    if (v.is_none()) return std::nullopt;
    if (!v.is_number() || v.type() == Value::Type::kFloat) fail("slice indices must be integers or none");
    return v.as_int();
  };
  const std::optional<int64_t> start = bound(a), stop = bound(b), step_opt = bound(c);
  const int64_t step = step_opt.value_or(1);
  if (step == 0) fail("slice step cannot be zero");
  std::vector<size_t> starts;
  int64_t n;
  if (obj.is_list()) {
    n = static_cast<int64_t>(obj.items().size());
  } else if (obj.is_string()) {
    starts = code_point_starts(obj.str());
    n = static_cast<int64_t>(starts.size()) - 1;
  } else {
    fail(absl::StrCat("'", obj.type_name(), "' object cannot be sliced"));
  }
  // Python's slice.indices().
  const auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) x += n;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t lo = clamp(start, step > 0 ? 0 : n - 1), hi = clamp(stop, step > 0 ? n : -1);
  if (obj.is_string() && step == 1) return substring(obj, starts[lo], starts[std::max(lo, hi)]);
  // lo and hi lie in [-1, n], so the count and each index fit; only the step can be huge.
  const uint64_t stride = step > 0 ? static_cast<uint64_t>(step) : 0 - static_cast<uint64_t>(step);
  const uint64_t span = step > 0 ? (hi > lo ? static_cast<uint64_t>(hi - lo) : 0) : (lo > hi ? static_cast<uint64_t>(lo - hi) : 0);
  const uint64_t count = span == 0 ? 0 : (span - 1) / stride + 1;
  std::vector<int64_t> idx;
  idx.reserve(count);
  for (uint64_t k = 0; k < count; ++k)
    idx.push_back(step > 0 ? lo + static_cast<int64_t>(k * stride) : lo - static_cast<int64_t>(k * stride));
  if (obj.is_list()) {
    std::vector<Value> out;
    for (int64_t i : idx) out.push_back(obj.items()[static_cast<size_t>(i)]);
    return Value::list(std::move(out), obj.list_obj().tuple);
  }
  std::string out;  // a strided string slice: its marks do not survive
  for (int64_t i : idx) out += obj.str().substr(starts[i], starts[i + 1] - starts[i]);
  return Value::string(std::move(out));
}

Value Interp::compare(const Expr& e) {
  Value left = eval(*e.args[0]);
  for (size_t i = 0; i < e.names.size(); ++i) {
    Value right = eval(*e.args[i + 1]);
    line_ = e.line;
    const std::string& op = e.names[i];
    bool r;
    if (op == "==") r = equals(left, right);
    else if (op == "!=") r = !equals(left, right);
    else if (op == "in" || op == "not in") {
      r = apply_test(*this, "in", left, CallArgs{{right}, {}});
      if (op == "not in") r = !r;
    } else {
      const int c = jinja::compare(left, right);
      r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!r) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

// The left operand in a frame of its own (left-leaning chains recurse through it), then the rest.
Value Interp::binary(const Expr& e) {
  const Value a = eval(*e.args[0]);
  return binary_rest(e, a);
}

Value Interp::binary_rest(const Expr& e, const Value& a) {
  if (e.name == "and" || e.name == "or") {  // Python's: returns an operand
    if (e.name == "and" ? !a.truthy() : a.truthy()) return a;
    return eval(*e.args[1]);
  }
  const Value b = eval(*e.args[1]);
  line_ = e.line;
  if (e.name == "~") return tilde(a, b);
  return arithmetic(e.name, a, b);
}

// As exec_stmt: the recursive path keeps small frames (eval, eval_node, binary).
Value Interp::eval(const Expr& e) {
  line_ = e.line;
  const Nest nest(*this);
  switch (e.kind) {
    case Expr::kLiteral: return e.value;
    case Expr::kName: return lookup(e.name);
    case Expr::kBinary: return binary(e);
    case Expr::kCompare: return compare(e);
    case Expr::kCond:
      if (truthy(*e.args[0])) return eval(*e.args[1]);
      return e.args[2] ? eval(*e.args[2]) : Value::undefined("the else branch of a conditional expression");
    default: return eval_node(e);
  }
}

// Chains (a.b.c, x|f|g, f()()) recurse through their first operand: eval_node evaluates it in a
// frame that holds just that value; what the node does with it runs in apply_node's frame, which
// is not on the recursion's path.
Value Interp::eval_node(const Expr& e) {
  if (e.kind == Expr::kList || e.kind == Expr::kTuple || e.kind == Expr::kDict) return build(e);
  const Value x = eval(*e.args[0]);
  return apply_node(e, x);
}

Value Interp::build(const Expr& e) {
  if (e.kind == Expr::kDict) {
    auto d = std::make_shared<Dict>();
    for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
      const Value k = eval(*e.args[i]);
      if (!k.is_string()) fail(absl::StrCat("dict keys must be strings here, got ", k.type_name()));
      d->set(k.str(), eval(*e.args[i + 1]));
    }
    return Value::dict(std::move(d));
  }
  std::vector<Value> items;
  for (const auto& a : e.args) items.push_back(eval(*a));
  return Value::list(std::move(items), e.kind == Expr::kTuple);
}

Value Interp::apply_node(const Expr& e, const Value& x) {
  switch (e.kind) {
    case Expr::kAttr: line_ = e.line; return attr(x, e.name);
    case Expr::kIndex: {
      const Value key = eval(*e.args[1]);
      line_ = e.line;
      return item(x, key);
    }
    case Expr::kSlice: return slice(x, e.args[1].get(), e.args[2].get(), e.args[3].get());
    case Expr::kCall: {
      const CallArgs a = arguments(e, 1);
      line_ = e.line;
      return call(x, a);
    }
    case Expr::kFilter: {
      const CallArgs a = arguments(e, 1);
      line_ = e.line;
      return apply_filter(*this, e.name, x, a);
    }
    case Expr::kTest: {
      const CallArgs a = arguments(e, 1);
      line_ = e.line;
      return Value::boolean(apply_test(*this, e.name, x, a) != e.negated);
    }
    case Expr::kUnary:
      line_ = e.line;
      if (e.name == "not") return Value::boolean(!x.truthy());
      if (!x.is_number()) fail(absl::StrCat("bad operand type for unary ", e.name, ": '", x.type_name(), "'"));
      if (e.name == "+") return x.type() == Value::Type::kFloat ? x : Value::integer(x.as_int());
      if (x.type() == Value::Type::kFloat) return Value::number(-x.as_double());
      if (x.as_int() == INT64_MIN)
        fail(absl::StrCat("integer result of -(", x.as_int(), ") does not fit 64 bits (Loom's integers are 64-bit)"));
      return Value::integer(-x.as_int());
    default: return Value();
  }
}

}  // namespace loom::jinja
