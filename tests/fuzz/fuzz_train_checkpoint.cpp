// libFuzzer: the training-checkpoint reader: trainer_state.json (first, as libFuzzer's length-prefixed
// string) and optimizer.safetensors (the rest) in a checkpoint folder, through resolve_checkpoint and
// read_train_checkpoint.
#include <fuzzer/FuzzedDataProvider.h>

#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "train/train_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  static const std::string out = loom::fuzz::scratch_subdir("train_out");
  static const std::string dir = loom::fuzz::scratch_subdir("train_out/checkpoint-7");
  const std::string state = in.ConsumeRandomLengthString(1 << 16);
  const std::vector<uint8_t> optim = in.ConsumeRemainingBytes<uint8_t>();
  loom::fuzz::write_file(dir + "/trainer_state.json", state.data(), state.size());
  loom::fuzz::write_file(dir + "/optimizer.safetensors", optim.data(), optim.size());
  auto resolved = loom::resolve_checkpoint(out);
  if (resolved.ok()) LOOM_FUZZ_CHECK(*resolved == dir || *resolved == dir + "/");
  auto ckpt = loom::read_train_checkpoint(dir);
  (void)ckpt;
  return 0;
}
