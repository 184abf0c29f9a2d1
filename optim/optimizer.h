// The Optimizer: parameter groups (learning-rate multiplier, weight decay), step/zero_grad over
// autograd leaves, f32 master weights for non-f32 compute weights, and named state tensors for
// checkpoints. The arithmetic lives in an UpdateRule over one flat contiguous f32 range, so that
// ZeRO-2 (dist/) and CPU offload (placement kHost, host_update.h) run the same rule on a shard or a
// host copy.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "autograd/variable.h"

namespace loom::optim {

// The per-step arguments of one update of one range.
struct StepArgs {
  float lr = 0.f;            // base lr times the group's lr_scale
  float weight_decay = 0.f;  // the group's
  float grad_scale = 1.f;    // gradients are multiplied by this first (clipping, loss-scale undo)
  // When set, grad_scale is read from here instead: one f32 in the memory of the device the update
  // runs on (only given to rules whose reads_grad_scale_at() is true).
  const float* grad_scale_at = nullptr;
  int64_t step = 1;          // 1-based, already incremented for this update
};

// The arithmetic of an optimizer over a flat range of f32 master values. A sharded or offloaded
// wrapper allocates init_state(shard numel) and calls update() on its shard; ranges must start at
// a multiple of alignment() elements of the tensor they come from (8-bit blocks).
class UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  virtual std::string name() const = 0;  // "adamw", "adamw8bit"
  virtual int64_t alignment() const { return 1; }
  // Whether update() honours StepArgs::grad_scale_at (else the Optimizer reads the scale to the host).
  virtual bool reads_grad_scale_at() const { return false; }
  // Zero state for `numel` master values on `device`, as (name, tensor) pairs (names like
  // "exp_avg"; the Optimizer saves them as "<name>.<param>").
  virtual std::vector<std::pair<std::string, Tensor>> init_state(int64_t numel, Device device) const = 0;
  // The state of a range of `numel` values cut from a tensor of `whole_numel` (a ZeRO-2 shard's piece):
  // the same kind of state the whole tensor gets (8-bit AdamW keeps small tensors in f32).
  virtual std::vector<std::pair<std::string, Tensor>> init_state_range(int64_t numel, int64_t whole_numel,
                                                                       Device device) const {
    return init_state(numel, device);
  }
  // master: f32 contiguous; grad: f32 or bf16 with master's numel; state: what init_state gave
  // (possibly restored); compute: when given, a bf16 tensor of master's numel receiving the result.
  virtual void update(Tensor& master, const Tensor& grad, std::vector<Tensor>& state, const StepArgs& args,
                      Tensor* compute) = 0;
  // update() for each of many tensors (an Optimizer's whole step): the same results; a rule may run
  // them together (AdamW: a few launches for a LoRA model's hundreds of adapter tensors).
  struct Item {
    Tensor* master;
    const Tensor* grad;
    std::vector<Tensor>* state;
    StepArgs args;
    Tensor* compute;
  };
  virtual void update_many(std::vector<Item>& items) {
    for (Item& it : items) update(*it.master, *it.grad, *it.state, it.args, it.compute);
  }
  // State shared by every range (8-bit code books), saved under these names once.
  virtual std::vector<std::pair<std::string, Tensor>> shared_state() const { return {}; }
  virtual absl::Status load_shared_state(const std::map<std::string, Tensor>& tensors, const std::string& where) {
    return absl::OkStatus();
  }
};

struct ParamGroup {
  std::string name;
  float lr_scale = 1.f;
  float weight_decay = 0.f;
};

class HostUpdater;

// Where the f32 masters and the rule's state live and where the update runs.
enum class Placement {
  kDevice,  // with the parameters (on the GPU for a CUDA model)
  // CPU optimizer offload (DeepSpeed's offload_optimizer: cpu): f32 masters (of f32 parameters too)
  // and state in pinned host memory, updated on the CPU; gradients are copied down at step() and the
  // new weights copied up in the parameters' dtype (host_update.h). The rule's shared state (8-bit
  // code books) must be on the CPU.
  kHost,
};

class Optimizer {
 public:
  // sharded: parameters are only registered (no masters, no state): dist::Zero2 owns a shard of
  // those and runs the rule on it (where placement() says); step() and the state_dict functions are
  // then not available.
  explicit Optimizer(std::unique_ptr<UpdateRule> rule, bool sharded = false, Placement placement = Placement::kDevice);
  ~Optimizer();

  // Returns the group's index for add_param.
  int add_group(ParamGroup group);
  // A leaf that requires grad, under a unique name. An f32 value is the master and is updated in
  // place; a bf16 value gets an f32 master copy (made here) and receives the rounded master after
  // each step, so the f32 master carries the small updates that bf16 would lose. With kHost every
  // value gets a host master and receives it (rounded to its dtype) after each step.
  void add_param(const std::string& name, const ag::Variable& var, int group = 0);

  // One update of every parameter that has a gradient; the others are skipped and their step
  // count stays (PyTorch's rule). lr is the base rate; each group multiplies it by lr_scale.
  void step(float lr, float grad_scale = 1.f);
  // The same with the scale in a one-element f32 tensor, e.g. the clipping coefficient the GPU
  // computed (ops::grad_norm_coef): read where the update runs, so the host does not wait for it.
  // Falls back to reading it to the host for rules that cannot (8-bit AdamW), CPU offload, or a
  // tensor on another device than a parameter.
  void step(float lr, const Tensor& grad_scale);
  void zero_grad();

  // Named tensors that restore this optimizer exactly: "<state>.<param>" per parameter,
  // "master.<param>" where the parameter is not f32 (for every parameter with
  // all_masters: then the f32 weights themselves travel with the state, as full fine-tuning
  // checkpoints need), "step.<param>" (i64 [1]), and the rule's shared tensors.
  std::map<std::string, Tensor> state_dict(bool all_masters = false) const;
  // Copies a state_dict() back (any device; state tensors may have any shape of the right numel
  // and dtype), masters included where present (required for non-f32 parameters; else an f32
  // parameter's own value is its master); refreshes the compute weights from the masters. `where` names the source in
  // errors (a file). A missing "step.<param>" is an error unless default_step >= 0 is given.
  absl::Status load_state_dict(const std::map<std::string, Tensor>& tensors, const std::string& where,
                               int64_t default_step = -1);

  const UpdateRule& rule() const { return *rule_; }
  UpdateRule& rule() { return *rule_; }
  bool sharded() const { return sharded_; }
  Placement placement() const { return placement_; }
  bool offloaded() const { return placement_ == Placement::kHost; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  // Bytes of optimizer state (moments, absmax, code books; not master copies).
  int64_t state_bytes() const;
  // Bytes of f32 masters kept apart from non-f32 parameters (what a GPU would hold besides the
  // state; with kHost the f32 parameters' host masters are not counted: the GPU keeps those weights).
  int64_t master_bytes() const;
  // kHost: pinned bytes of the gradient and weight staging buffers (0 before the first step).
  int64_t staging_bytes() const;

  struct Param {
    std::string name;
    ag::Variable var;
    int group = 0;
    Tensor master;  // f32; shares storage with var.value() when that is f32 (kDevice)
    std::vector<Tensor> state;
    std::vector<std::string> state_names;
    int64_t step = 0;
  };
  const std::vector<Param>& params() const { return params_; }

 private:
  void step_on_host(float lr, float grad_scale);
  void step_on_device(float lr, float grad_scale, const Tensor* grad_scale_at);

  std::unique_ptr<UpdateRule> rule_;
  bool sharded_ = false;
  Placement placement_ = Placement::kDevice;
  std::unique_ptr<HostUpdater> host_;  // kHost
  std::vector<ParamGroup> groups_;
  std::vector<Param> params_;
};

}  // namespace loom::optim
