// bitsandbytes' AdamW8bit as an UpdateRule (see adamw.h): dispatches to kernels/adamw8bit.h.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/cuda_context.h"
#include "kernels/adamw8bit.h"
#include "kernels/dynamic_map.h"
#include "optim/adamw.h"

namespace loom::optim {
namespace {

Tensor make_map(bool is_signed, Device device) {
  Tensor t = Tensor::empty({256}, DType::f32);
  dynamic_map(is_signed, t.data<float>());
  return t.to(device);
}

class AdamW8bit : public UpdateRule {
 public:
  AdamW8bit(const AdamConfig& c, Device device) : c_(c), qmap1_(make_map(true, device)), qmap2_(make_map(false, device)) {}
  std::string name() const override { return "adamw8bit"; }
  int64_t alignment() const override { return kAdam8bitBlock; }

  std::vector<std::pair<std::string, Tensor>> init_state(int64_t numel, Device device) const override {
    return init_state_range(numel, numel, device);
  }
  // bitsandbytes decides 8-bit or 32-bit state by the whole tensor's size.
  std::vector<std::pair<std::string, Tensor>> init_state_range(int64_t numel, int64_t whole_numel,
                                                               Device device) const override {
    if (whole_numel < kAdam8bitMinSize)
      return {{"state1", Tensor::zeros({numel}, DType::f32, device)},
              {"state2", Tensor::zeros({numel}, DType::f32, device)}};
    const int64_t blocks = adam8bit_blocks(numel);
    return {{"state1", Tensor::zeros({numel}, DType::u8, device)},
            {"state2", Tensor::zeros({numel}, DType::u8, device)},
            {"absmax1", Tensor::zeros({blocks}, DType::f32, device)},
            {"absmax2", Tensor::zeros({blocks}, DType::f32, device)}};
  }

  void update(Tensor& master, const Tensor& grad_in, std::vector<Tensor>& state, const StepArgs& a,
              Tensor* compute) override {
    const char* op = "adamw8bit update";
    const int64_t n = master.numel();
    LOOM_CHECK(master.dtype() == DType::f32 && master.is_contiguous(), op, ": master must be contiguous f32, got ",
               master.str());
    LOOM_CHECK(grad_in.numel() == n && grad_in.device() == master.device(), op, ": grad ", grad_in.str(),
               " does not match master ", master.str());
    const bool quantized = state.size() == 4;
    LOOM_CHECK(quantized || state.size() == 2, op, ": expected 2 or 4 state tensors, got ", state.size());
    for (const Tensor& t : state) LOOM_CHECK(t.device() == master.device() && t.is_contiguous(), op, ": state ", t.str());
    const bool bf16_copy = compute && compute->dtype() == DType::bf16;
    if (compute) LOOM_CHECK(compute->numel() == n && compute->device() == master.device() && compute->is_contiguous(),
                            op, ": compute copy ", compute->str(), " vs ", master.str());
    Tensor grad = grad_in.contiguous();
    const AdamWParams p = adamw_params(c_, a);
    bf16* copy = bf16_copy ? compute->data<bf16>() : nullptr;
    auto run = [&](auto tag) {
      using G = decltype(tag);
      const G* g = grad.data<G>();
      float* w = master.data<float>();
      if (master.is_cuda()) {
#if LOOM_WITH_CUDA
        const Stream s = CudaContext::get(master.device().index).stream;
        if (quantized)
          cuda::adamw8bit_step(w, g, state[0].data<uint8_t>(), state[1].data<uint8_t>(), state[2].data<float>(),
                               state[3].data<float>(), qmap1_.data<float>(), qmap2_.data<float>(), n, p, copy, s);
        else
          cuda::adam32bit_step(w, g, state[0].data<float>(), state[1].data<float>(), n, p, copy, s);
#else
        LOOM_CHECK(false, op, ": Loom was built without CUDA (LOOM_CUDA=OFF)");
#endif
      } else if (quantized) {
        cpu::adamw8bit_step(w, g, state[0].data<uint8_t>(), state[1].data<uint8_t>(), state[2].data<float>(),
                            state[3].data<float>(), qmap1_.data<float>(), qmap2_.data<float>(), n, p, copy);
      } else {
        cpu::adam32bit_step(w, g, state[0].data<float>(), state[1].data<float>(), n, p, copy);
      }
    };
    LOOM_CHECK(qmap1_.device() == master.device(), op, ": code books live on ", qmap1_.device().str(),
               ", master on ", master.device().str());
    if (grad.dtype() == DType::f32) run(float{});
    else if (grad.dtype() == DType::bf16) run(bf16{});
    else LOOM_CHECK(false, op, ": grad must be f32 or bf16, got ", grad.str());
    if (compute && !bf16_copy) compute->copy_(master);
  }

  std::vector<std::pair<std::string, Tensor>> shared_state() const override {
    return {{"qmap1", qmap1_}, {"qmap2", qmap2_}};
  }
  absl::Status load_shared_state(const std::map<std::string, Tensor>& tensors, const std::string& where) override {
    for (auto [key, dst] : {std::pair<const char*, Tensor*>{"qmap1", &qmap1_}, {"qmap2", &qmap2_}}) {
      auto it = tensors.find(key);
      if (it == tensors.end() || it->second.numel() != 256 || it->second.dtype() != DType::f32)
        return absl::DataLossError(absl::StrCat(where, ": missing or misshapen 8-bit code book ", key,
                                                " (expected f32[256])"));
      dst->copy_(it->second.reshape({256}));
    }
    return absl::OkStatus();
  }

 private:
  AdamConfig c_;
  Tensor qmap1_, qmap2_;
};

}  // namespace

std::unique_ptr<UpdateRule> make_adamw8bit(const AdamConfig& config, Device device) {
  return std::make_unique<AdamW8bit>(config, device);
}

}  // namespace loom::optim
