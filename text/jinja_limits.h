// Limits of Loom's Jinja interpreter: templates arrive inside downloaded models, so parsing and
// rendering stop with a clear error where a real chat template never goes and a hostile one always
// does (deep nesting, endless loops, values of gigabytes), never with a crash or an exhausted machine.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace loom::jinja {

struct Limits {
  // Nesting of blocks and expressions in the source (checked while parsing, long before the
  // parser's recursion could exhaust the C++ stack) and of lists and dicts in values. Real chat
  // templates nest 6-15 levels and render 7-12 deep.
  int max_depth = 256;
  // Nesting while rendering: blocks and expressions being evaluated, summed over the macro calls in
  // progress (what a recursive macro grows); bounds the evaluator's C++ stack. At these defaults a
  // render needs under 512 KiB of stack (under 2 MiB with AddressSanitizer).
  int max_render_depth = 1024;
  // Macros calling macros (recursion).
  int max_call_depth = 64;
  // Work of one render: a step per statement and expression node evaluated, list or dict element
  // built, value compared or serialized, and per 64 bytes of text built; a loop iteration is ~30.
  // The chat templates of tests/fixtures/chat take 70-150 steps a message (a 130k-message
  // conversation fits); reaching the limit takes a few tenths of a second.
  int64_t max_steps = 20'000'000;
  // The rendered text (and the text a {% set %} block or a macro captures).
  size_t max_output_bytes = size_t{64} << 20;
  // Any single value: a string's bytes (and its marks'), a list's or dict's elements (their
  // slots; what they hold is shared, not copied), a printed or JSON form.
  size_t max_value_bytes = size_t{64} << 20;
  // The template's source (the largest chat templates published are tens of KiB); bounds the
  // lexer's tokens, which are made before the parser can check anything else.
  size_t max_source_bytes = size_t{1} << 20;
};

// The render in progress on this thread (values are built deep inside filters and methods that do
// not see the interpreter). Outside a render nothing is counted and nothing fails.
namespace budget {

// Installs limits for the current thread while it lives; nests (a macro's render is not separate).
class Scope {
 public:
  explicit Scope(const Limits& limits);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  int64_t steps() const;

 private:
  void* saved_;
};

bool active();
const Limits& limits();  // the active render's, or the defaults
// Counts n steps of work; fails (Error) past max_steps.
void step(int64_t n = 1);
// Counts the work of building n bytes of text (a step per 64 bytes).
void bytes(size_t n);
// Fails (Error) when a value of n bytes, or of n elements of slot_bytes each, would pass
// max_value_bytes; `what` names it ("a string", "range()").
void check_size(size_t n, std::string_view what);
void check_items(size_t n, size_t slot_bytes, std::string_view what);

}  // namespace budget
}  // namespace loom::jinja
