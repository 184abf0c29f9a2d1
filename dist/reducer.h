// Gradient reduction behind two methods, fed by autograd's grad-ready hooks (flashlight's
// Reducer{add, finalize}): add() hears that a parameter's gradient is final for this backward,
// finalize() completes every reduction once backward is over. DDP buckets (ddp.h) and ZeRO-2's
// reduce-scatter (zero2.h) implement it.
#pragma once
#include <vector>

#include "autograd/variable.h"
#include "dist/communicator.h"

namespace loom::dist {

class Reducer {
 public:
  virtual ~Reducer() = default;
  // Parameter `index` (registration order) has its final gradient for this backward. `grad` is
  // the leaf's gradient cell: an implementation may replace or release it.
  virtual void add(int index, Tensor& grad) = 0;
  // After the step's last backward: reductions issued and complete.
  virtual void finalize() = 0;

  // Accumulation micro-steps keep gradients local (no communication); only the backward of the
  // last micro-step of a step reduces. Defaults to true.
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }

 private:
  bool sync_ = true;
};

// Installs a grad hook on each parameter calling reducer.add(i, grad) when reducer.sync().
// The reducer must outlive every backward over these parameters.
void attach_grad_hooks(Reducer& reducer, const std::vector<ag::Variable>& params);

// Copies rank `root`'s parameter values to every rank (the start of a data-parallel run).
void broadcast_params(Communicator& comm, const std::vector<ag::Variable>& params, int root = 0);

}  // namespace loom::dist
