#include "diff.hpp"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace primecfg::migrate {

namespace {

std::vector<std::string_view> split_lines(std::string_view t) {
  std::vector<std::string_view> out;
  std::size_t b = 0;
  while (b < t.size()) {
    std::size_t nl = t.find('\n', b);
    std::size_t e = nl == std::string_view::npos ? t.size() : nl + 1;
    out.push_back(t.substr(b, e - b));
    b = e;
  }
  return out;
}

enum class op { same, del, add };

struct edit {
  op kind;
  std::size_t a, b;  // line indices in the old and new text (the one that applies)
};

// The edit script: common prefix and suffix are matched directly, the middle
// by a longest-common-subsequence table (configs are small).
std::vector<edit> script(const std::vector<std::string_view>& a, const std::vector<std::string_view>& b) {
  std::size_t pre = 0;
  while (pre < a.size() && pre < b.size() && a[pre] == b[pre]) ++pre;
  std::size_t suf = 0;
  while (suf < a.size() - pre && suf < b.size() - pre && a[a.size() - 1 - suf] == b[b.size() - 1 - suf])
    ++suf;
  const std::size_t n = a.size() - pre - suf, m = b.size() - pre - suf;
  std::vector<std::vector<std::size_t>> lcs(n + 1, std::vector<std::size_t>(m + 1, 0));
  for (std::size_t i = n; i-- > 0;)
    for (std::size_t j = m; j-- > 0;)
      lcs[i][j] = a[pre + i] == b[pre + j] ? lcs[i + 1][j + 1] + 1 : std::max(lcs[i + 1][j], lcs[i][j + 1]);

  std::vector<edit> out;
  for (std::size_t k = 0; k < pre; ++k) out.push_back({op::same, k, k});
  std::size_t i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[pre + i] == b[pre + j]) {
      out.push_back({op::same, pre + i, pre + j});
      ++i, ++j;
    } else if (j < m && (i == n || lcs[i][j + 1] > lcs[i + 1][j])) {
      out.push_back({op::add, pre + i, pre + j});
      ++j;
    } else {
      out.push_back({op::del, pre + i, pre + j});
      ++i;
    }
  }
  for (std::size_t k = 0; k < suf; ++k) out.push_back({op::same, pre + n + k, pre + m + k});
  return out;
}

void put_line(std::string& out, char prefix, std::string_view line) {
  out += prefix;
  out += line;
  if (line.empty() || line.back() != '\n') out += "\n\\ No newline at end of file\n";
}

std::string range(std::size_t start, std::size_t len) {
  // 1-based start; an empty range names the line before it.
  std::size_t first = len == 0 ? start : start + 1;
  return len == 1 ? std::to_string(first) : std::to_string(first) + "," + std::to_string(len);
}

}  // namespace

std::string unified_diff(std::string_view old_name, std::string_view new_name, std::string_view old_text,
                         std::string_view new_text, int context) {
  if (old_text == new_text) return {};
  auto a = split_lines(old_text), b = split_lines(new_text);
  auto s = script(a, b);
  const std::size_t ctx = static_cast<std::size_t>(std::max(context, 0));

  std::string out;
  out += "--- ";
  out += old_name;
  out += "\n+++ ";
  out += new_name;
  out += "\n";

  std::size_t k = 0;
  while (k < s.size()) {
    while (k < s.size() && s[k].kind == op::same) ++k;
    if (k == s.size()) break;
    // A hunk: from ctx lines before the first change to ctx lines after the
    // last change that is within 2*ctx same lines of the previous one.
    std::size_t first = k >= ctx ? k - ctx : 0;
    std::size_t last = k;  // last changed index
    std::size_t q = k;
    while (q < s.size()) {
      if (s[q].kind != op::same) {
        last = q;
        ++q;
        continue;
      }
      std::size_t run = q;
      while (run < s.size() && s[run].kind == op::same) ++run;
      if (run == s.size() || run - q > 2 * ctx) break;
      q = run;
    }
    std::size_t end = std::min(s.size(), last + 1 + ctx);

    std::size_t a_start = s[first].a, b_start = s[first].b, a_len = 0, b_len = 0;
    for (std::size_t r = first; r < end; ++r) {
      if (s[r].kind != op::add) ++a_len;
      if (s[r].kind != op::del) ++b_len;
    }
    out += "@@ -" + range(a_start, a_len) + " +" + range(b_start, b_len) + " @@\n";
    for (std::size_t r = first; r < end; ++r) {
      switch (s[r].kind) {
        case op::same:
          put_line(out, ' ', a[s[r].a]);
          break;
        case op::del:
          put_line(out, '-', a[s[r].a]);
          break;
        case op::add:
          put_line(out, '+', b[s[r].b]);
          break;
      }
    }
    k = end;
  }
  return out;
}

}  // namespace primecfg::migrate
