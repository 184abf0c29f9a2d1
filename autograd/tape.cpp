// The tape and backward() (see tape.h).
#include "autograd/tape.h"

#include <algorithm>

#include <unordered_map>
#include <utility>

#include "autograd/short_lived_leaves.h"
#include "engine/ops.h"

namespace loom::ag {
namespace {

struct Tape {
  std::vector<std::shared_ptr<Node>> nodes;
};
thread_local bool t_grad_enabled = true;
thread_local std::vector<Tape> t_tapes(1);

Tape& current() { return t_tapes.back(); }

}  // namespace

bool grad_enabled() { return t_grad_enabled; }

GradModeGuard::GradModeGuard(bool enabled) : previous_(t_grad_enabled) { t_grad_enabled = enabled; }
GradModeGuard::~GradModeGuard() { t_grad_enabled = previous_; }

TapeScope::TapeScope() { t_tapes.emplace_back(); }
TapeScope::~TapeScope() { t_tapes.pop_back(); }

bool recomputing() { return t_tapes.size() > 1; }

namespace {
thread_local int64_t t_unread_outputs = 0;
}  // namespace
int64_t unread_outputs() { return t_unread_outputs; }
Tensor detail::unread_value(const Shape& shape, DType dtype, Device device) {
  ++t_unread_outputs;
  // No memory behind it: its shape, dtype and device (and views of it) are all anyone may use, so a
  // rerun's skipped product costs no transient (a MoE layer's down output, [tokens k, hidden], was its
  // largest). Reading or writing it would dereference a null pointer: a bug shows at once.
  const size_t bytes = static_cast<size_t>(bytes_for(dtype, numel_of(shape)));
  return Tensor::from_storage(std::make_shared<Storage>(nullptr, bytes, device, nullptr), shape, dtype);
}

size_t tape_size() { return current().nodes.size(); }
void clear_tape() { current().nodes.clear(); }

bool should_record(const std::vector<const Variable*>& inputs) {
  if (!t_grad_enabled) return false;
  for (const Variable* v : inputs)
    if (v && v->requires_grad()) return true;
  return false;
}

std::vector<Variable> record(std::shared_ptr<Node> node, const std::vector<const Variable*>& inputs,
                             std::vector<Tensor> outputs, bool always) {
  std::vector<Variable> out;
  out.reserve(outputs.size());
  if (!(always ? t_grad_enabled : should_record(inputs))) {
    for (Tensor& t : outputs) out.emplace_back(std::move(t), false);
    return out;
  }
  for (const Variable* v : inputs) node->inputs.push_back(v && v->requires_grad() ? v->cell() : nullptr);
  for (Tensor& t : outputs) {
    Variable v = Variable::make_output(std::move(t));
    node->outputs.push_back(v.cell());
    out.push_back(std::move(v));
  }
  current().nodes.push_back(std::move(node));
  return out;
}

Variable record1(std::shared_ptr<Node> node, const std::vector<const Variable*>& inputs, Tensor output) {
  std::vector<Tensor> outs;
  outs.push_back(std::move(output));
  return std::move(record(std::move(node), inputs, std::move(outs))[0]);
}

namespace detail {
namespace {
thread_local std::vector<const GradCell*> t_short_lived;
}  // namespace

ShortLivedLeaves::ShortLivedLeaves(std::vector<const GradCell*> cells) : previous_size_(t_short_lived.size()) {
  t_short_lived.insert(t_short_lived.end(), cells.begin(), cells.end());
}
ShortLivedLeaves::~ShortLivedLeaves() { t_short_lived.resize(previous_size_); }
bool ShortLivedLeaves::contains(const GradCell* cell) {
  return std::find(t_short_lived.begin(), t_short_lived.end(), cell) != t_short_lived.end();
}
}  // namespace detail

namespace {
// Whether g's storage is held by g alone (and is not borrowed memory): its holder may write it in place.
bool exclusively_held(const Tensor& g) { return g.storage().use_count() == 1 && !g.storage()->borrowed(); }
// Whether g is all of its storage (holds no more memory than its own values).
bool spans_its_storage(const Tensor& g) {
  return g.is_contiguous() && static_cast<size_t>(g.nbytes()) == g.storage()->nbytes();
}
}  // namespace

void accumulate_grad(GradCell& cell, const Tensor& g, const char* from) {
  LOOM_CHECK(g.shape() == cell.shape, "backward of ", from, ": gradient ", g.str(), " does not match the shape ",
             shape_str(cell.shape), " of its input");
  LOOM_CHECK(g.dtype() == cell.dtype, "backward of ", from, ": gradient ", g.str(), " does not match the dtype ",
             name(cell.dtype), " of its input");
  if (cell.is_leaf) {
    // A leaf owns its gradient: a node may hand the same tensor to several inputs (add), and leaf
    // gradients are later accumulated and reduced in place (grad accumulation, data parallelism).
    const bool short_lived = detail::ShortLivedLeaves::contains(&cell);
    if (cell.grad.defined()) {
      // A short-lived leaf's may be shared (below): then the sum is a new tensor.
      if (short_lived && !exclusively_held(cell.grad))
        cell.grad = ops::add(cell.grad, g);
      else
        ops::add_(cell.grad, g);
    } else if (short_lived) {
      // A recomputed layer's input gradient, passed on to the layer before at once: taken as it is
      // when it spans its storage (holds no more memory than its own), also when shared (a pre-norm
      // block's residual add hands one tensor to the layer input and to the attention output): it is
      // never written in place while shared (the add above; Node::take_grad_so_far's kWrite checks
      // too), so one [tokens, hidden] copy a layer fewer.
      cell.grad = spans_its_storage(g) && !g.storage()->borrowed() ? g : g.clone();
    } else if (exclusively_held(g) && g.storage()->long_lived() && spans_its_storage(g)) {
      // Made for this (an adapter's dA and dB, allocated in the long-lived pool) and held by no one
      // else: it becomes the gradient as it is, without the copy below.
      cell.grad = g;
    } else {
      const LongLivedPoolScope held_until_the_step;  // out of the activations' pool (engine/memory.h)
      cell.grad = g.clone();
    }
  } else {
    // Intermediates are never modified in place, so they may share storage; sums are new tensors.
    cell.grad = cell.grad.defined() ? ops::add(cell.grad, g) : g.contiguous();
  }
}

Tensor Node::take_grad_so_far(size_t i, GradUse use) {
  if (!needs_grad(i)) return Tensor();
  GradCell& c = *inputs[i];
  // A leaf's gradient is accumulated and reduced in place later (grad accumulation, data
  // parallelism), but for a recomputed checkpoint's input, which hands it on to the layer before.
  const bool ours = !c.is_leaf || detail::ShortLivedLeaves::contains(&c);
  if (!ours || !c.grad.defined()) return Tensor();
  if (use == GradUse::kRead) return std::exchange(c.grad, Tensor());
  if (!c.grad.is_contiguous()) return Tensor();
  Tensor g = std::exchange(c.grad, Tensor());
  if (exclusively_held(g)) return g;
  c.grad = std::move(g);  // shared with another cell or a saved tensor, or borrowed memory: not ours to write
  return Tensor();
}

void backward(const Variable& root, Tensor grad) {
  LOOM_CHECK(root.requires_grad(), "backward() on a ", root.value().str(), " that does not require grad");
  if (!grad.defined()) {
    LOOM_CHECK(root.value().numel() == 1, "backward() without a gradient needs a scalar root, got ", root.value().str());
    grad = Tensor::full(root.shape(), 1.f, root.dtype(), root.device());
  }
  backward(std::vector<Variable>{root}, std::vector<Tensor>{grad});
}

void backward(const std::vector<Variable>& roots, const std::vector<Tensor>& grads) {
  LOOM_CHECK(roots.size() == grads.size(), "backward: ", roots.size(), " roots but ", grads.size(), " gradients");
  std::vector<std::shared_ptr<Node>> nodes = std::move(current().nodes);
  current().nodes.clear();

  // How many recorded uses each leaf has left: its hooks fire when that reaches zero.
  // Intermediate cells are owned only by the nodes that consume them; nodes die as soon as they
  // have run, so the cells are held here until the pass ends (they are small: grads get freed).
  std::unordered_map<GradCell*, int> pending;
  std::vector<std::shared_ptr<GradCell>> cells;
  for (const auto& n : nodes)
    for (const auto& c : n->inputs) {
      if (c && c->is_leaf) ++pending[c.get()];
      if (c && !c->is_leaf) cells.push_back(c);
    }

  for (size_t i = 0; i < roots.size(); ++i)
    if (roots[i].requires_grad() && grads[i].defined()) accumulate_grad(*roots[i].cell(), grads[i], "the root");

  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    std::shared_ptr<Node> node = std::move(*it);
    std::vector<Tensor> grad_out;
    bool any = false;
    // An output's gradient is needed by this node alone (cleared below in any case): handed over,
    // so that a backward may write into it where nothing else holds it (the GLU's, kept values).
    for (const auto& w : node->outputs) {
      auto cell = w.lock();
      grad_out.push_back(cell && !cell->is_leaf ? std::move(cell->grad) : cell ? cell->grad : Tensor());
      any = any || grad_out.back().defined();
    }
    if (any) {
      std::vector<Tensor> grad_in = node->backward(grad_out);
      LOOM_CHECK(grad_in.size() == node->inputs.size(), "backward of ", node->name(), " returned ", grad_in.size(),
                 " gradients for ", node->inputs.size(), " inputs");
      for (size_t i = 0; i < grad_in.size(); ++i)
        if (node->inputs[i] && grad_in[i].defined()) accumulate_grad(*node->inputs[i], grad_in[i], node->name());
    }
    for (const auto& w : node->outputs)  // intermediate gradients are not needed any more
      if (auto cell = w.lock(); cell && !cell->is_leaf) cell->grad = Tensor();
    for (const auto& c : node->inputs) {
      if (!c || !c->is_leaf) continue;
      if (--pending[c.get()] == 0 && c->grad.defined())
        for (auto& hook : c->hooks) hook(c->grad);
    }
    node.reset();  // saved tensors go now, not at the end of backward
  }
}

}  // namespace loom::ag
