// Configuration agreement across ranks (see agreement.h).
#include "dist/agreement.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::dist {

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

absl::Status check_agreement(Communicator& comm, const std::vector<std::pair<std::string, std::string>>& fields) {
  const int world = comm.world_size();
  // Entry 0 hashes the field names, so that ranks built from different code are caught too.
  const int64_t n = static_cast<int64_t>(fields.size()) + 1;
  Tensor count = Tensor::zeros({1}, DType::i64);
  *count.data<int64_t>() = n;
  Tensor counts = Tensor::zeros({world}, DType::i64);
  comm.all_gather(count, counts);
  comm.wait();
  for (int r = 0; r < world; ++r)
    if (counts.data<int64_t>()[r] != n)
      return absl::FailedPreconditionError(absl::StrCat("rank ", r, " checks ", counts.data<int64_t>()[r] - 1,
                                                        " configuration fields, this rank ", n - 1,
                                                        ": the ranks run different builds of loom"));
  Tensor mine = Tensor::zeros({n}, DType::i64);
  std::string names;
  for (const auto& [name, value] : fields) names += name + "\n";
  mine.data<int64_t>()[0] = static_cast<int64_t>(fnv1a64(names));
  for (int64_t i = 1; i < n; ++i) mine.data<int64_t>()[i] = static_cast<int64_t>(fnv1a64(fields[i - 1].second));
  Tensor all = Tensor::zeros({world * n}, DType::i64);
  comm.all_gather(mine, all);
  comm.wait();
  const int64_t* h = all.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int> differ;
    for (int r = 1; r < world; ++r)
      if (h[r * n + i] != h[i]) differ.push_back(r);
    if (differ.empty()) continue;
    if (i == 0)
      return absl::FailedPreconditionError("the ranks check different configuration fields: they run different builds of loom");
    const auto& [name, value] = fields[i - 1];
    return absl::FailedPreconditionError(absl::StrCat(
        "the ranks do not agree on the run's configuration: ", name, " differs between rank 0 and rank",
        differ.size() > 1 ? "s " : " ", absl::StrJoin(differ, ", "), " (rank ", comm.rank(), " has ", name, " = '",
        value, "'); start every rank with the same flags and files"));
  }
  return absl::OkStatus();
}

}  // namespace loom::dist
