// libFuzzer: the GGUF reader (header, metadata of every type, tensor infos, alignment, data offsets),
// every typed metadata accessor, dequantisation of each tensor, and the GGUF tokenizer on top.
#include <memory>
#include <vector>

#include "engine/gguf.h"
#include "engine/tensor.h"
#include "tests/fuzz/fuzz_util.h"
#include "text/gguf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto bytes = std::make_shared<const std::vector<uint8_t>>(data, data + size);
  auto file = loom::GgufFile::from_bytes(bytes, "fuzz.gguf");
  if (!file.ok()) return 0;
  for (const loom::GgufKv& kv : file->metadata()) {
    LOOM_FUZZ_CHECK(file->find(kv.key) != nullptr);
    (void)file->get_int(kv.key);
    (void)file->get_float(kv.key);
    (void)file->get_bool(kv.key);
    (void)file->get_string(kv.key);
    (void)file->get_strings(kv.key);
    (void)file->get_ints(kv.key);
    (void)file->get_floats(kv.key);
  }
  for (const loom::GgufTensorInfo& t : file->tensors()) {
    LOOM_FUZZ_CHECK(t.offset <= size && t.nbytes <= size - t.offset);
    LOOM_FUZZ_CHECK(file->bytes(t).size() == t.nbytes);
    auto x = file->read_f32(t);
    if (x.ok()) LOOM_FUZZ_CHECK(x->numel() == t.numel);
  }
  auto tok = loom::gguf_hf_tokenizer(*file);
  (void)tok;
  return 0;
}
