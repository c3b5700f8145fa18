// Token masks for structured output (json_constraint.h): a walk of the vocabulary's byte trie
// from the matcher's state.
#include "qf/rt/json_constraint.h"

#include <algorithm>
#include <limits>

#include "qf/error.h"

namespace qf::rt {
namespace {

constexpr std::string_view kThinkEnd = "</think>";

void set_bit(std::vector<uint64_t>& bits, int32_t id) {
  bits[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
}

}  // namespace

TokenTrie::TokenTrie(const Tokenizer& tok) {
  const int32_t n = tok.n_ids();
  bytes_.resize(static_cast<size_t>(n));
  std::vector<int32_t> order;
  for (int32_t id = 0; id < n; ++id) {
    if (tok.is_special(id)) continue;
    bytes_[static_cast<size_t>(id)] = tok.token_bytes(id);
    if (!bytes_[static_cast<size_t>(id)].empty()) order.push_back(id);
  }
  // By bytes (as unsigned), so that each node's ids are one run of `order`.
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const std::string &x = bytes(a), &y = bytes(b);
    return x != y ? x < y : a < b;
  });
  nodes_.emplace_back();
  // Node `node` holds order[lo, hi), which share their first `depth` bytes.
  const auto build = [&](auto& self, uint32_t node, size_t lo, size_t hi, size_t depth) -> void {
    nodes_[node].begin = static_cast<uint32_t>(ids_.size());
    while (lo < hi && bytes(order[lo]).size() == depth) ids_.push_back(order[lo++]);
    nodes_[node].own_end = static_cast<uint32_t>(ids_.size());
    std::vector<std::pair<size_t, size_t>> groups;  // runs of one byte at `depth`
    for (size_t i = lo; i < hi;) {
      size_t j = i + 1;
      while (j < hi && bytes(order[j])[depth] == bytes(order[i])[depth]) ++j;
      groups.emplace_back(i, j);
      i = j;
    }
    const auto first = static_cast<uint32_t>(nodes_.size());
    nodes_[node].first_child = first;
    nodes_[node].n_children = static_cast<uint32_t>(groups.size());
    nodes_.resize(nodes_.size() + groups.size());
    uint8_t free_from = 0xFF;
    uint32_t max_chars = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      const uint32_t child = first + static_cast<uint32_t>(g);
      const auto byte = static_cast<uint8_t>(bytes(order[groups[g].first])[depth]);
      nodes_[child].byte = byte;
      self(self, child, groups[g].first, groups[g].second, depth + 1);
      for (int q = 0; q < kUtf8States; ++q) {
        const int next = json_string_byte(q, byte);
        if (next < 0 || !(nodes_[child].free_from >> next & 1)) free_from &= ~(1u << q);
      }
      max_chars = std::max(max_chars, ((byte & 0xC0) != 0x80 ? 1u : 0u) + nodes_[child].max_chars);
    }
    nodes_[node].free_from = free_from;
    nodes_[node].max_chars = max_chars;
    nodes_[node].end = static_cast<uint32_t>(ids_.size());
  };
  build(build, 0, 0, order.size(), 0);
}

JsonConstraint::JsonConstraint(std::shared_ptr<const TokenTrie> trie,
                               std::shared_ptr<const JsonGrammar> grammar,
                               std::vector<int32_t> end_ids, bool in_reasoning)
    : trie_(std::move(trie)),
      grammar_(std::move(grammar)),
      end_ids_(std::move(end_ids)),
      matcher_(*grammar_, end_ids_.empty()),
      reasoning_(in_reasoning) {
  state_ = matcher_.start(arena_);
  size_t longest = 0;
  for (int32_t id = 0; id < trie_->n_ids(); ++id)
    longest = std::max(longest, trie_->bytes(id).size());
  scratch_.resize(longest + 2);
}

bool JsonConstraint::is_end(int32_t id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}

bool JsonConstraint::feed(JsonState& s, std::string_view bytes) const {
  JsonState next;
  for (const char c : bytes) {
    if (!matcher_.feed(s, static_cast<uint8_t>(c), arena_, next)) return false;
    s.swap(next);
  }
  return true;
}

bool JsonConstraint::complete() const {
  if (reasoning_) return false;
  const size_t mark = arena_.mark();
  const bool done = std::any_of(state_.begin(), state_.end(),
                                [&](const JsonFrame* f) { return matcher_.can_end(f, arena_); });
  arena_.rewind(mark);
  return done;
}

void JsonConstraint::accept(int32_t id) {
  if (id < 0 || id >= trie_->n_ids() || is_end(id)) return;
  const std::string& b = trie_->bytes(id);
  if (reasoning_) {
    think_tail_ += b;
    const size_t at = think_tail_.find(kThinkEnd);
    if (at == std::string::npos) {
      if (think_tail_.size() > kThinkEnd.size())
        think_tail_.erase(0, think_tail_.size() - kThinkEnd.size());
      return;
    }
    reasoning_ = false;
    // What follows `</think>` in this token starts the value, if it can.
    const size_t after = at + kThinkEnd.size();
    JsonState s = state_;
    if (feed(s, std::string_view(b).substr(b.size() - (think_tail_.size() - after))))
      state_ = std::move(s);
    return;
  }
  if (!feed(state_, b)) {
    throw Error(Errc::kUsage, "token " + std::to_string(id) +
                                  " does not continue the JSON value (structured output)");
  }
}

bool JsonConstraint::allows(int32_t id) const {
  if (reasoning_) return true;
  if (is_end(id)) return complete();
  if (id < 0 || id >= trie_->n_ids() || trie_->bytes(id).empty()) return false;
  const size_t mark = arena_.mark();
  JsonState s = state_;
  const bool ok = feed(s, trie_->bytes(id));
  arena_.rewind(mark);
  return ok;
}

void JsonConstraint::allowed(int64_t n, std::vector<uint64_t>& bits) const {
  // Ids past the tokenizer's (padding rows of the LM head) have no bytes: never allowed.
  bits.assign(static_cast<size_t>((std::max<int64_t>(n, trie_->n_ids()) + 63) / 64), 0);
  if (reasoning_) {
    for (int64_t i = 0; i < n; ++i) set_bit(bits, static_cast<int32_t>(i));
    return;
  }
  const auto& nodes = trie_->nodes();
  const auto& ids = trie_->ids();
  const size_t mark = arena_.mark();
  scratch_[0] = state_;
  // Depth-first over the trie: a child is visited only while some alternative lives.
  const auto visit_child = [&](auto& self, uint32_t c, size_t depth) -> void {
    const TokenTrie::Node& child = nodes[c];
    const size_t at = arena_.mark();
    JsonState& next = scratch_[depth + 1];
    if (matcher_.feed(scratch_[depth], child.byte, arena_, next)) {
      const bool all = std::any_of(next.begin(), next.end(), [&](const JsonFrame* f) {
        return matcher_.string_room(f) >= child.max_chars && (child.free_from >> f->aux & 1);
      });
      const uint32_t stop = all ? child.end : child.own_end;
      for (uint32_t i = child.begin; i < stop; ++i) set_bit(bits, ids[i]);
      if (!all) {
        for (uint32_t g = child.first_child; g < child.first_child + child.n_children; ++g)
          self(self, g, depth + 1);
      }
    }
    arena_.rewind(at);
  };
  const ByteDfa* dfa = state_.size() == 1 ? matcher_.string_pattern(state_[0]) : nullptr;
  if (dfa) {
    // Inside a pattern string: its DFA alone, a table lookup per byte, up to a closing quote,
    // from where the matcher takes over with the string's frame at the DFA's state.
    const auto visit_dfa = [&](auto& self, uint32_t node, int32_t ds, size_t depth) -> void {
      const TokenTrie::Node& p = nodes[node];
      for (uint32_t c = p.first_child; c < p.first_child + p.n_children; ++c) {
        const TokenTrie::Node& child = nodes[c];
        if (child.byte == '"') {
          const size_t at = arena_.mark();
          JsonFrame f = *state_[0];
          f.aux = static_cast<uint32_t>(ds);
          scratch_[depth] = {arena_.make(f)};
          visit_child(visit_child, c, depth);
          arena_.rewind(at);
          continue;
        }
        const int32_t next = dfa->next(ds, child.byte);
        if (next == ByteDfa::kDead) continue;
        for (uint32_t i = child.begin; i < child.own_end; ++i) set_bit(bits, ids[i]);
        self(self, c, next, depth + 1);
      }
    };
    visit_dfa(visit_dfa, 0, static_cast<int32_t>(state_[0]->aux), 0);
  } else {
    const TokenTrie::Node& root = nodes[0];
    for (uint32_t c = root.first_child; c < root.first_child + root.n_children; ++c)
      visit_child(visit_child, c, 0);
  }
  arena_.rewind(mark);
  if (complete()) {
    for (const int32_t id : end_ids_) {
      if (id >= 0 && id < n) set_bit(bits, id);
    }
  }
}

void JsonConstraint::mask(std::span<float> row) const {
  if (reasoning_) return;
  allowed(static_cast<int64_t>(row.size()), bits_);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < row.size(); ++i) {
    if (!(bits_[i >> 6] >> (i & 63) & 1)) row[i] = ninf;
  }
}

}  // namespace qf::rt
