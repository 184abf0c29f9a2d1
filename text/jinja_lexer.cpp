// Jinja lexer: cuts a template into text, {{ output }} and {% statement %} segments, tokenizes the
// tags, drops {# comments #}, and applies whitespace control as transformers configures Jinja:
// trim_blocks (the first newline after a block or comment tag goes), lstrip_blocks (spaces and
// tabs before a block or comment tag at the start of a line go), and the explicit markers
// `{%-`/`-%}` (all whitespace on that side goes) and `{%+`/`+%}` (the two options are off there);
// a single newline ending the template is dropped (keep_trailing_newline off).
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "text/jinja_ast.h"

namespace loom::jinja {
namespace {

[[noreturn]] void fail_at(int line, std::string message) { throw Error{line, std::move(message)}; }

struct Raw {
  Segment seg;
  char kind = 't';  // 't' text, 'v' {{ }}, 'b' {% %}, 'c' {# #}
  char left = 0;    // '-' or '+' after the opening braces
  char right = 0;   // '-' or '+' before the closing braces
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  explicit Lexer(const std::string& src) : s_(src) {}

  std::vector<Raw> run() {
    std::vector<Raw> out;
    while (pos_ < s_.size()) {
      size_t open = pos_;
      while (true) {
        open = s_.find('{', open);
        if (open == std::string::npos || open + 1 >= s_.size()) {
          open = std::string::npos;
          break;
        }
        const char c = s_[open + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++open;
      }
      const size_t text_end = open == std::string::npos ? s_.size() : open;
      if (text_end > pos_) {
        Raw t;
        t.seg.kind = Segment::kText;
        t.seg.text = s_.substr(pos_, text_end - pos_);
        t.seg.line = line_;
        advance_to(text_end);
        out.push_back(std::move(t));
      }
      if (open == std::string::npos) break;
      out.push_back(tag());
    }
    return out;
  }

 private:
  const std::string& s_;
  size_t pos_ = 0;
  int line_ = 1;

  void advance_to(size_t p) {
    for (; pos_ < p; ++pos_)
      if (s_[pos_] == '\n') ++line_;
  }
  bool at(const char* lit) const { return s_.compare(pos_, std::strlen(lit), lit) == 0; }

  Raw tag() {
    Raw r;
    r.seg.line = line_;
    const char opener = s_[pos_ + 1];
    r.kind = opener == '{' ? 'v' : opener == '%' ? 'b' : 'c';
    advance_to(pos_ + 2);
    if (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) r.left = s_[pos_], advance_to(pos_ + 1);
    if (r.kind == 'c') {
      const size_t close = s_.find("#}", pos_);
      if (close == std::string::npos) fail_at(r.seg.line, "comment {# is never closed with #}");
      if (close > pos_ && (s_[close - 1] == '-' || s_[close - 1] == '+')) r.right = s_[close - 1];
      advance_to(close + 2);
      return r;
    }
    const char closer = r.kind == 'v' ? '}' : '%';
    r.seg.kind = r.kind == 'v' ? Segment::kOutput : Segment::kStatement;
    while (true) {
      while (pos_ < s_.size() && is_space(s_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= s_.size())
        fail_at(r.seg.line, absl::StrCat("tag opened with {", std::string(1, opener), " is never closed"));
      for (const char mark : {'-', '+', '\0'}) {
        const std::string end = mark ? absl::StrCat(std::string(1, mark), std::string(1, closer), "}")
                                     : absl::StrCat(std::string(1, closer), "}");
        if (s_.compare(pos_, end.size(), end) == 0 && !(mark == '+' && r.kind == 'v')) {
          r.right = mark;
          Token t;
          t.kind = Token::kEnd;
          t.line = line_;
          r.seg.tokens.push_back(t);
          advance_to(pos_ + end.size());
          return r;
        }
      }
      r.seg.tokens.push_back(token());
    }
  }

  Token token() {
    Token t;
    t.line = line_;
    const char c = s_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = pos_;
      while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
      t.kind = Token::kName;
      t.text = s_.substr(pos_, e - pos_);
      advance_to(e);
      return t;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return number();
    if (c == '\'' || c == '"') return string_literal();
    for (const char* op : {"**", "//", "==", "!=", "<=", ">="}) {
      if (at(op)) {
        t.kind = Token::kOp;
        t.text = op;
        advance_to(pos_ + 2);
        return t;
      }
    }
    if (std::strchr("+-*/%~<>=()[]{},.:|", c)) {
      t.kind = Token::kOp;
      t.text = std::string(1, c);
      advance_to(pos_ + 1);
      return t;
    }
    fail_at(line_, absl::StrCat("unexpected character '", std::string(1, c), "' in a tag"));
  }

  Token number() {
    Token t;
    t.line = line_;
    size_t e = pos_;
    bool is_float = false;
    const auto digits = [&] {
      while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
    };
    digits();
    if (e + 1 < s_.size() && s_[e] == '.' && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
      is_float = true;
      ++e;
      digits();
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t k = e + 1;
      if (k < s_.size() && (s_[k] == '+' || s_[k] == '-')) ++k;
      if (k < s_.size() && std::isdigit(static_cast<unsigned char>(s_[k]))) {
        is_float = true;
        e = k;
        digits();
      }
    }
    std::string text;
    for (size_t i = pos_; i < e; ++i)
      if (s_[i] != '_') text += s_[i];
    advance_to(e);
    if (is_float) {
      t.kind = Token::kFloat;
      t.d = std::strtod(text.c_str(), nullptr);  // as Python: 1e999 is inf, never an exception
    } else {
      t.kind = Token::kInt;
      try {
        t.i = std::stoll(text);
      } catch (const std::out_of_range&) {
        fail_at(t.line, absl::StrCat("integer literal ", text, " does not fit 64 bits (Loom's integers are 64-bit)"));
      }
    }
    return t;
  }

  // A Python string literal with its escapes (\n \t \r \\ \' \" \xNN \uNNNN \UNNNNNNNN).
  Token string_literal() {
    Token t;
    t.kind = Token::kString;
    t.line = line_;
    const char q = s_[pos_];
    size_t i = pos_ + 1;
    std::string out;
    while (true) {
      if (i >= s_.size()) fail_at(t.line, "string literal is never closed");
      const char c = s_[i];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        ++i;
        continue;
      }
      if (i + 1 >= s_.size()) fail_at(t.line, "string literal is never closed");
      const char e = s_[i + 1];
      i += 2;
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '0': out += '\0'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (i + n > s_.size()) fail_at(t.line, "truncated \\x/\\u escape in a string literal");
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            const char h = s_[i + k];
            if (!std::isxdigit(static_cast<unsigned char>(h))) fail_at(t.line, "bad \\x/\\u escape in a string literal");
            cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
          }
          i += n;
          if (cp < 0x80) {
            out += static_cast<char>(cp);
          } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          } else if (cp < 0x10000) {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          } else {
            out += static_cast<char>(0xF0 | (cp >> 18));
            out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          }
          break;
        }
        default: out += '\\', out += e;  // Python keeps unknown escapes as written
      }
    }
    t.text = std::move(out);
    advance_to(i + 1);
    return t;
  }
};

}  // namespace

std::vector<Segment> lex(const std::string& source) {
  // keep_trailing_newline is off: one newline at the very end of the template is dropped.
  std::string src = source;
  if (src.ends_with("\r\n")) src.resize(src.size() - 2);
  else if (src.ends_with("\n")) src.pop_back();
  std::vector<Raw> raw = Lexer(src).run();
  // Whitespace control on each text segment, from the tags on either side of it.
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i].kind != 't') continue;
    std::string& text = raw[i].seg.text;
    const Raw* prev = i > 0 ? &raw[i - 1] : nullptr;
    const Raw* next = i + 1 < raw.size() ? &raw[i + 1] : nullptr;
    bool line_start = prev == nullptr;
    if (prev && prev->right == '-') {
      size_t k = 0;
      while (k < text.size() && is_space(text[k])) ++k;
      text.erase(0, k);
    } else if (prev && prev->kind != 'v' && prev->right != '+') {  // trim_blocks
      if (text.starts_with("\n")) text.erase(0, 1), line_start = true;
      else if (text.starts_with("\r\n")) text.erase(0, 2), line_start = true;
    }
    if (next && next->left == '-') {
      size_t k = text.size();
      while (k > 0 && is_space(text[k - 1])) --k;
      text.resize(k);
    } else if (next && next->kind != 'v' && next->left != '+') {  // lstrip_blocks
      const size_t nl = text.rfind('\n');
      const size_t from = nl == std::string::npos ? 0 : nl + 1;
      if (nl != std::string::npos || line_start) {
        bool blank = true;
        for (size_t k = from; k < text.size(); ++k) blank = blank && (text[k] == ' ' || text[k] == '\t');
        if (blank) text.resize(from);
      }
    }
  }
  std::vector<Segment> out;
  for (Raw& r : raw) {
    if (r.kind == 'c') continue;
    if (r.kind == 't' && r.seg.text.empty()) continue;
    out.push_back(std::move(r.seg));
  }
  return out;
}

}  // namespace loom::jinja
