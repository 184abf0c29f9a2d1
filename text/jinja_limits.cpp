// The per-thread budget of the render in progress (text/jinja_limits.h).
#include "text/jinja_limits.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "text/jinja_value.h"

namespace loom::jinja {
namespace budget {
namespace {

struct State {
  Limits limits;
  int64_t steps = 0;
  State* prev = nullptr;
};
thread_local State* current = nullptr;

// 64 MiB, 1.5 GiB, 100 bytes: what an error message says.
std::string human(size_t n) {
  if (n >= (size_t{1} << 20) && n % (size_t{1} << 20) == 0) return absl::StrCat(n >> 20, " MiB");
  if (n >= (size_t{1} << 10) && n % (size_t{1} << 10) == 0) return absl::StrCat(n >> 10, " KiB");
  return absl::StrCat(n, " bytes");
}

constexpr size_t kBytesPerStep = 64;

}  // namespace

Scope::Scope(const Limits& limits) : saved_(current) {
  current = new State{limits, 0, current};
}

Scope::~Scope() {
  State* s = current;
  current = static_cast<State*>(saved_);
  delete s;
}

int64_t Scope::steps() const { return current ? current->steps : 0; }

bool active() { return current != nullptr; }

const Limits& limits() {
  static const Limits kDefaults;
  return current ? current->limits : kDefaults;
}

void step(int64_t n) {
  if (!current) return;
  current->steps += n;
  if (current->steps > current->limits.max_steps)
    fail(absl::StrCat("rendering takes more than ", current->limits.max_steps,
                      " steps (Limits::max_steps): a loop or recursion without end?"));
}

void bytes(size_t n) { step(static_cast<int64_t>(n / kBytesPerStep)); }

void check_size(size_t n, std::string_view what) {
  if (current && n > current->limits.max_value_bytes)
    fail(absl::StrCat(std::string(what), " of ", n, " bytes exceeds the limit of ", human(current->limits.max_value_bytes),
                      " on one value (Limits::max_value_bytes)"));
}

void check_items(size_t n, size_t slot_bytes, std::string_view what) {
  if (current && n > current->limits.max_value_bytes / slot_bytes)
    fail(absl::StrCat(std::string(what), " of ", n, " elements exceeds the limit of ", human(current->limits.max_value_bytes),
                      " on one value (", slot_bytes, " bytes an element; Limits::max_value_bytes)"));
}

}  // namespace budget
}  // namespace loom::jinja
