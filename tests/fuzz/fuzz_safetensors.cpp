// libFuzzer: the safetensors reader (header JSON, dtypes, shapes, data offsets) over hostile bytes.
// Every tensor the reader accepts must lie inside the file and read back without fault.
#include <memory>
#include <vector>

#include "engine/safetensors.h"
#include "engine/tensor_io.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto bytes = std::make_shared<const std::vector<uint8_t>>(data, data + size);
  auto file = loom::SafetensorsFile::from_bytes(bytes, "fuzz.safetensors");
  if (!file.ok()) return 0;
  for (const loom::TensorInfo& t : file->tensors()) {
    LOOM_FUZZ_CHECK(t.offset <= size && t.nbytes <= size - t.offset);
    LOOM_FUZZ_CHECK(file->find(t.name) == &t);
    std::span<const uint8_t> b = file->bytes(t);
    LOOM_FUZZ_CHECK(b.size() == t.nbytes);
    loom::Tensor x = loom::read_tensor(*file, t);
    LOOM_FUZZ_CHECK(static_cast<uint64_t>(x.nbytes()) == t.nbytes);
  }
  return 0;
}
