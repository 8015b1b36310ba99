// Which tensors of a save share memory: sorted by address, neighbours compared.
#include "formats/memory_overlap.hpp"

#include <algorithm>
#include <cerrno>
#include <functional>
#include <numeric>
#include <utility>

#include "gdskit/error.hpp"

namespace gdskit::formats {
namespace {

using i128 = __int128;
using u128 = unsigned __int128;

// Any layout of real memory spans less than this; more is refused rather than computed with overflow.
constexpr u128 k_max_span = u128{1} << 64;
// Steps the exact comparison of one pair may take before the pair counts as sharing.
constexpr std::int64_t k_max_steps = std::int64_t{1} << 20;

// One dimension of a byte set: coef x for 0 <= x <= bound.
struct term {
  u128 coef;
  u128 bound;
};

// A layout as the set of byte addresses { lo + sum of coef_k x_k : 0 <= x_k <= bound_k }, coefficients
// descending; hi is one past the highest byte.
struct byte_set {
  bool empty = true;
  i128 lo = 0;
  i128 hi = 0;
  std::vector<term> terms;
  // No gaps: every byte from lo to hi belongs to it.
  bool dense() const { return terms.empty() || (terms.size() == 1 && terms[0].coef == 1); }
};

// Rewrites terms into fewer with the same set of sums: equal coefficients add their bounds, and a term whose
// step is exactly the next one's whole run continues it (a contiguous array becomes one term of step 1).
void simplify(std::vector<term>& t) {
  std::sort(t.begin(), t.end(), [](const term& a, const term& b) { return a.coef > b.coef; });
  std::vector<term> out;
  for (const term& x : t) {
    if (!out.empty() && out.back().coef == x.coef) out.back().bound += x.bound;
    else out.push_back(x);
  }
  for (std::size_t i = out.size(); i-- > 1;) {
    if (out[i - 1].coef == (out[i].bound + 1) * out[i].coef) {
      out[i - 1] = {out[i].coef, (out[i - 1].bound + 1) * (out[i].bound + 1) - 1};
      out.erase(out.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  t = std::move(out);
}

[[noreturn]] void too_large(const char* what) {
  throw error(errno_code(EINVAL), "shared memory check", "", -1, 0, what);
}

byte_set normalize(const memory_layout& l) {
  byte_set out;
  if (l.shape.size() != l.strides_bytes.size()) too_large("a layout needs one stride per dimension");
  if (l.shape.size() > 64) too_large("a layout of more than 64 dimensions");
  if (l.itemsize == 0) return out;
  for (std::uint64_t n : l.shape)
    if (n == 0) return out;
  i128 lo = static_cast<i128>(l.address);
  u128 span = 0;
  std::vector<term> terms;
  for (std::size_t k = 0; k < l.shape.size(); ++k) {
    const std::uint64_t n = l.shape[k];
    const std::int64_t s = l.strides_bytes[k];
    if (n > (std::uint64_t{1} << 63)) too_large("a dimension larger than 2**63");
    if (n == 1 || s == 0) continue;  // one index, or every index the same bytes
    const u128 step = s < 0 ? static_cast<u128>(-static_cast<i128>(s)) : static_cast<u128>(s);
    // A negative stride walks down from element 0: the lowest byte is that of the last index.
    if (s < 0) lo -= static_cast<i128>(step * (n - 1));
    terms.push_back({step, n - 1});
    span += step * (n - 1);
    if (span >= k_max_span) too_large("a layout that spans more than the address space");
  }
  if (l.itemsize > 1) terms.push_back({1, l.itemsize - 1});
  span += l.itemsize - 1;
  if (span >= k_max_span) too_large("a layout that spans more than the address space");
  out.empty = false;
  out.lo = lo;
  out.hi = lo + static_cast<i128>(span) + 1;
  if (!l.exact) terms = span == 0 ? std::vector<term>{} : std::vector<term>{{1, span}};
  simplify(terms);
  out.terms = std::move(terms);
  return out;
}

u128 gcd(u128 a, u128 b) {
  while (b != 0) a = std::exchange(b, a % b);
  return a;
}

// The inverse of a modulo m (gcd(a, m) == 1, m > 1).
u128 inverse(u128 a, u128 m) {
  i128 old_r = static_cast<i128>(a), r = static_cast<i128>(m), old_s = 1, s = 0;
  while (r != 0) {
    const i128 q = old_r / r;
    old_r = std::exchange(r, old_r - q * r);
    old_s = std::exchange(s, old_s - q * s);
  }
  i128 inv = old_s % static_cast<i128>(m);
  if (inv < 0) inv += static_cast<i128>(m);
  return static_cast<u128>(inv);
}

// Whether sum of coef_k x_k == target has a solution with 0 <= x_k <= bound_k, largest coefficients first;
// each level only tries the x that leave a remainder the later coefficients' gcd divides and can still reach.
class solver {
 public:
  explicit solver(std::vector<term> t) : t_(std::move(t)), most_(t_.size() + 1, 0), gcd_(t_.size() + 1, 0) {
    for (std::size_t i = t_.size(); i-- > 0;) {
      most_[i] = most_[i + 1] + t_[i].coef * t_[i].bound;
      gcd_[i] = gcd(t_[i].coef, gcd_[i + 1]);
    }
  }

  bool solve(std::size_t i, u128 rem) {
    if (rem == 0) return true;
    if (i == t_.size() || rem > most_[i]) return false;
    const u128 c = t_[i].coef;
    const u128 hi = std::min(t_[i].bound, rem / c);
    if (i + 1 == t_.size()) return rem % c == 0 && rem / c <= t_[i].bound;
    const u128 rest = most_[i + 1];
    const u128 lo = rem > rest ? (rem - rest + c - 1) / c : 0;
    if (lo > hi) return false;
    // c x == rem modulo g (the later coefficients' gcd): x == x0 modulo m.
    const u128 g = gcd_[i + 1];
    const u128 d = gcd(c, g);
    if (rem % d != 0) return false;
    const u128 m = g / d;
    const u128 x0 = m == 1 ? 0 : ((rem / d) % m) * inverse((c / d) % m, m) % m;
    if (hi < x0) return false;
    for (u128 x = hi - (hi - x0) % m; x >= lo; x -= m) {
      if (--steps_left_ < 0) return true;  // past the bound: counted as sharing
      if (solve(i + 1, rem - c * x)) return true;
      if (x < m) break;
    }
    return false;
  }

 private:
  std::vector<term> t_;
  std::vector<u128> most_;  // most_[i]: the largest sum terms i.. reach
  std::vector<u128> gcd_;   // gcd_[i]: the gcd of the coefficients i.. (0 for none)
  std::int64_t steps_left_ = k_max_steps;
};

bool overlap(const byte_set& a, const byte_set& b) {
  if (a.empty || b.empty || a.hi <= b.lo || b.hi <= a.lo) return false;
  if (a.dense() && b.dense()) return true;
  // a.lo + sum a_k x_k == b.lo + sum b_j y_j; with y_j = bound_j - y'_j every coefficient is positive:
  // sum a_k x_k + sum b_j y'_j == b.lo - a.lo + sum b_j bound_j.
  std::vector<term> t = a.terms;
  i128 target = b.lo - a.lo;
  for (const term& x : b.terms) {
    t.push_back(x);
    target += static_cast<i128>(x.coef * x.bound);
  }
  if (target < 0) return false;
  simplify(t);
  return solver(std::move(t)).solve(0, static_cast<u128>(target));
}

class disjoint_sets {
 public:
  explicit disjoint_sets(std::size_t n) : parent_(n) { std::iota(parent_.begin(), parent_.end(), std::size_t{0}); }
  std::size_t find(std::size_t i) {
    while (parent_[i] != i) i = parent_[i] = parent_[parent_[i]];
    return i;
  }
  void unite(std::size_t a, std::size_t b) {
    a = find(a);
    b = find(b);
    if (a != b) parent_[std::max(a, b)] = std::min(a, b);
  }

 private:
  std::vector<std::size_t> parent_;
};

}  // namespace

bool layouts_overlap(const memory_layout& a, const memory_layout& b) { return overlap(normalize(a), normalize(b)); }

std::vector<std::vector<std::size_t>> shared_memory_groups(const std::vector<memory_layout>& tensors) {
  const std::size_t n = tensors.size();
  std::vector<byte_set> sets(n);
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < n; ++i) {
    sets[i] = normalize(tensors[i]);
    if (!sets[i].empty) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (const int c = tensors[a].space.compare(tensors[b].space); c != 0) return c < 0;
    if (sets[a].lo != sets[b].lo) return sets[a].lo < sets[b].lo;
    if (sets[a].hi != sets[b].hi) return sets[a].hi < sets[b].hi;
    return a < b;
  });
  disjoint_sets groups(n);
  // Sweeping up the addresses of one space: the tensors whose span reaches the current one are the only ones
  // it can share with. Gapless ones that reach it all hold its first byte, so they already form one group and
  // joining any of them is enough; tensors with gaps are compared exactly.
  using open_span = std::pair<i128, std::size_t>;  // (end, index): a min-heap on the end
  std::vector<open_span> dense_open;
  std::vector<std::size_t> gapped_open;
  const std::string* space = nullptr;
  for (std::size_t k : order) {
    const byte_set& e = sets[k];
    if (space == nullptr || *space != tensors[k].space) {
      space = &tensors[k].space;
      dense_open.clear();
      gapped_open.clear();
    }
    while (!dense_open.empty() && dense_open.front().first <= e.lo) {
      std::pop_heap(dense_open.begin(), dense_open.end(), std::greater<>());
      dense_open.pop_back();
    }
    std::erase_if(gapped_open, [&](std::size_t j) { return sets[j].hi <= e.lo; });
    for (std::size_t j : gapped_open)
      if (groups.find(j) != groups.find(k) && overlap(sets[j], e)) groups.unite(j, k);
    if (e.dense()) {
      if (!dense_open.empty()) groups.unite(dense_open.front().second, k);
      dense_open.emplace_back(e.hi, k);
      std::push_heap(dense_open.begin(), dense_open.end(), std::greater<>());
    } else {
      for (const auto& [end, j] : dense_open)
        if (end > e.lo && groups.find(j) != groups.find(k) && overlap(sets[j], e)) groups.unite(j, k);
      gapped_open.push_back(k);
    }
  }
  std::vector<std::vector<std::size_t>> out;
  std::vector<std::size_t> slot(n, SIZE_MAX);
  std::vector<std::size_t> size(n, 0);
  for (std::size_t i = 0; i < n; ++i) ++size[groups.find(i)];
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t root = groups.find(i);
    if (size[root] < 2) continue;
    if (slot[root] == SIZE_MAX) {
      slot[root] = out.size();
      out.emplace_back();
    }
    out[slot[root]].push_back(i);
  }
  return out;
}

}  // namespace gdskit::formats
