// Elementwise and shape functions: forward and backward side by side.
#include "autograd/functions.h"
#include "autograd/lambda_node.h"

namespace loom::ag {
using detail::node_of;

Variable add(const Variable& a, const Variable& b, OutputUse use) {
  LOOM_CHECK(use == OutputUse::kRead || (a.value().shape() == b.value().shape() && a.dtype() == b.dtype() &&
                                         a.value().device() == b.value().device()),
             "add: ", a.value().str(), " and ", b.value().str(), " differ in shape, dtype or device");
  Tensor sum = use == OutputUse::kRead ? ops::add(a.value(), b.value())
                                       : detail::unread_value(a.value().shape(), a.dtype(), a.value().device());
  return record1(node_of("add", [](Node&, const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0], g[0]}; }),
                 {&a, &b}, std::move(sum));
}

Variable sub(const Variable& a, const Variable& b) {
  return record1(node_of("sub", [](Node& n, const std::vector<Tensor>& g) {
                   return std::vector<Tensor>{g[0], n.needs_grad(1) ? ops::scale(g[0], -1.f) : Tensor()};
                 }),
                 {&a, &b}, ops::sub(a.value(), b.value()));
}

Variable mul(const Variable& a, const Variable& b) {
  // Each side's gradient needs only the other side's value.
  Tensor keep_a = b.requires_grad() ? a.value() : Tensor();
  Tensor keep_b = a.requires_grad() ? b.value() : Tensor();
  return record1(node_of("mul",
                         [keep_a, keep_b](Node& n, const std::vector<Tensor>& g) {
                           return std::vector<Tensor>{n.needs_grad(0) ? ops::mul(g[0], keep_b) : Tensor(),
                                                      n.needs_grad(1) ? ops::mul(g[0], keep_a) : Tensor()};
                         }),
                 {&a, &b}, ops::mul(a.value(), b.value()));
}

Variable scale(const Variable& a, float s) {
  return record1(node_of("scale", [s](Node&, const std::vector<Tensor>& g) { return std::vector<Tensor>{ops::scale(g[0], s)}; }),
                 {&a}, ops::scale(a.value(), s));
}

Variable add_bias(const Variable& a, const Variable& bias) {
  const DType bias_dtype = bias.dtype();
  return record1(node_of("add_bias",
                         [bias_dtype](Node& n, const std::vector<Tensor>& g) {
                           return std::vector<Tensor>{g[0], n.needs_grad(1) ? ops::sum_rows(g[0], bias_dtype) : Tensor()};
                         }),
                 {&a, &bias}, ops::add_bias(a.value(), bias.value()));
}

Variable cast(const Variable& a, DType dtype) {
  if (a.dtype() == dtype) return a;
  const DType from = a.dtype();
  return record1(node_of("cast", [from](Node&, const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].to(from)}; }),
                 {&a}, a.value().to(dtype));
}

Variable to_device(const Variable& a, Device device) {
  if (a.device() == device) return a;
  const Device from = a.device();
  return record1(node_of("to_device",
                         [from](Node&, const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].to(from)}; }),
                 {&a}, a.value().contiguous().to(device));
}

Variable reshape(const Variable& a, const Shape& shape) {
  const Shape from = a.shape();
  return record1(node_of("reshape", [from](Node&, const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].reshape(from)}; }),
                 {&a}, a.value().reshape(shape));
}

Variable transpose(const Variable& a, int64_t d0, int64_t d1) {
  return record1(node_of("transpose",
                         [d0, d1](Node&, const std::vector<Tensor>& g) {
                           return std::vector<Tensor>{g[0].transpose(d0, d1).contiguous()};
                         }),
                 {&a}, a.value().transpose(d0, d1).contiguous());
}

std::vector<Variable> split(const Variable& a, const std::vector<int64_t>& sizes) {
  const Shape from = a.shape();
  const int64_t last = static_cast<int64_t>(from.size()) - 1;
  int64_t total = 0;
  for (int64_t n : sizes) {
    LOOM_CHECK(n > 0, "split: part sizes must be positive");
    total += n;
  }
  LOOM_CHECK(last >= 0 && total == from[last], "split: parts of ", total, " columns do not cover ", a.value().str());
  std::vector<Tensor> parts;
  int64_t at = 0;
  for (int64_t n : sizes) {
    parts.push_back(a.value().narrow(last, at, n).contiguous());
    at += n;
  }
  auto backward = [from, sizes](Node&, const std::vector<Tensor>& g) {
    return std::vector<Tensor>{ops::cat_last(g, sizes).reshape(from)};
  };
  return record(node_of("split", backward), {&a}, parts);
}

Variable cat_last(const std::vector<Variable>& parts) {
  LOOM_CHECK(!parts.empty(), "cat_last: no parts");
  std::vector<Tensor> values;
  std::vector<int64_t> widths;
  std::vector<const Variable*> inputs;
  for (const Variable& p : parts) {
    values.push_back(p.value());
    widths.push_back(p.value().size(-1));
    inputs.push_back(&p);
  }
  auto backward = [widths](Node&, const std::vector<Tensor>& g) {
    std::vector<Tensor> out;
    const int64_t last = g[0].dim() - 1;
    int64_t at = 0;
    for (int64_t w : widths) {
      out.push_back(g[0].narrow(last, at, w).contiguous());
      at += w;
    }
    return out;
  };
  return record1(node_of("cat_last", backward), inputs, ops::cat_last(values, widths));
}

Variable host_scalar(const std::vector<Variable>& inputs, const HostScalarFn& f) {
  LOOM_CHECK(!inputs.empty(), "host_scalar: no inputs");
  std::vector<double> x;
  std::vector<const Variable*> ptrs;
  for (const Variable& v : inputs) {
    LOOM_CHECK(v.value().numel() == 1, "host_scalar: input ", v.value().str(), " is not a scalar");
    x.push_back(static_cast<double>(v.value().item()));
    ptrs.push_back(&v);
  }
  std::vector<double> d(x.size(), 0.0);
  const double y = f(x, d);
  LOOM_CHECK(d.size() == x.size(), "host_scalar: ", d.size(), " derivatives for ", x.size(), " inputs");
  const Device device = inputs[0].device();
  std::vector<std::pair<Shape, DType>> like;
  for (const Variable& v : inputs) like.emplace_back(v.shape(), v.dtype());
  auto backward = [d, like, device](Node&, const std::vector<Tensor>& g) {
    const double dy = static_cast<double>(g[0].item());
    std::vector<Tensor> out;
    for (size_t i = 0; i < d.size(); ++i)
      out.push_back(Tensor::full(like[i].first, static_cast<float>(dy * d[i]), like[i].second, device));
    return out;
  };
  return record1(node_of("host_scalar", backward), ptrs, Tensor::full({}, static_cast<float>(y), DType::f32, device));
}

Variable narrow(const Variable& a, int64_t dim, int64_t start, int64_t length) {
  const Shape from = a.shape();
  const DType dtype = a.dtype();
  const Device device = a.device();
  return record1(node_of("narrow",
                         [=](Node&, const std::vector<Tensor>& g) {
                           // Scatter into zeros with `dim` moved to the front, where the slice is contiguous.
                           Shape moved = from;
                           std::swap(moved[0], moved[dim < 0 ? dim + moved.size() : dim]);
                           Tensor t = Tensor::zeros(moved, dtype, device);
                           t.narrow(0, start, length).copy_(g[0].transpose(0, dim).contiguous());
                           return std::vector<Tensor>{t.transpose(0, dim).contiguous()};
                         }),
                 {&a}, a.value().narrow(dim, start, length).contiguous());
}

Variable softcap(const Variable& a, float cap) {
  Tensor av = a.value();
  return record1(node_of("softcap",
                         [av, cap](Node&, const std::vector<Tensor>& g) {
                           return std::vector<Tensor>{ops::softcap_backward(av, g[0], cap)};
                         }),
                 {&a}, ops::softcap(av, cap));
}

Variable dropout(const Variable& a, float p, uint64_t seed, uint64_t offset) {
  if (p == 0.f) return a;
  return record1(node_of("dropout",
                         [p, seed, offset](Node&, const std::vector<Tensor>& g) {
                           return std::vector<Tensor>{ops::dropout(g[0], p, seed, offset)};
                         }),
                 {&a}, ops::dropout(a.value(), p, seed, offset));
}

Variable sum(const Variable& a) {
  const Shape shape = a.shape();
  const DType dtype = a.dtype();
  const Device device = a.device();
  return record1(node_of("sum",
                         [=](Node&, const std::vector<Tensor>& g) {
                           return std::vector<Tensor>{Tensor::full(shape, g[0].item(), dtype, device)};
                         }),
                 {&a}, ops::sum(a.value()));
}

}  // namespace loom::ag
