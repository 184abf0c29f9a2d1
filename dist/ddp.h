// DDP gradient reduction: trainable parameters grouped into buckets of about 25 MB in reverse
// registration order (the order backward produces them); a bucket's all-reduce (sum) starts as
// soon as its last gradient arrives, while backward goes on. Buckets launch in index order on
// every rank, so the collectives match across ranks. After finalize() each parameter's gradient is
// the sum over ranks, as a view into its bucket (no copy back). The caller weights the loss so
// that the sum is the mean it wants (Loom: by the global token count).
#pragma once
#include <vector>

#include "dist/reducer.h"

namespace loom::dist {

constexpr int64_t kDefaultBucketBytes = 25ll << 20;

class DdpReducer : public Reducer {
 public:
  DdpReducer(Communicator& comm, std::vector<ag::Variable> params, int64_t bucket_bytes = kDefaultBucketBytes);
  void add(int index, Tensor& grad) override;
  // Launches what has not started (a parameter whose gradient never came contributes zeros and gets
  // the others' sum), waits, and leaves the sums in the gradients.
  void finalize() override;
  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }

 private:
  struct Bucket {
    std::vector<int> params;
    std::vector<int64_t> offsets;
    int64_t numel = 0;
    DType dtype = DType::f32;
    Device device = Device::cpu();
    Tensor buffer;
    int ready = 0;
    bool launched = false;
  };
  Tensor slot(Bucket& b, int k);
  void launch_ready();

  Communicator& comm_;
  std::vector<ag::Variable> params_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_, slot_of_;
  std::vector<bool> arrived_;
  size_t next_ = 0;  // the next bucket to launch
};

}  // namespace loom::dist
