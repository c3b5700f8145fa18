// Byte-pair encoding of one pre-token, the merge table it probes and the cache in front of it.
#include <algorithm>
#include <bit>
#include <cstring>
#include <functional>
#include <span>

#include "tokenizer_impl.h"

namespace qf::rt {

void MergeTable::insert_or_assign(int32_t left, int32_t right, BpeMerge m) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const uint64_t k = key(left, right);
  for (size_t i = slot_of(k);; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == k) {
      s.merge = m;
      return;
    }
    if (s.key == kEmpty) {
      s = {k, m};
      ++size_;
      return;
    }
  }
}

void MergeTable::grow() {
  std::vector<Slot> old = std::move(slots_);
  const size_t n = std::max<size_t>(16, old.size() * 2);  // a power of two, load factor <= 1/2
  slots_.assign(n, Slot{kEmpty, {0, 0}});
  mask_ = n - 1;
  shift_ = 64 - std::countr_zero(n);
  size_ = 0;
  for (const Slot& s : old) {
    if (s.key != kEmpty) {
      insert_or_assign(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key), s.merge);
    }
  }
}

namespace {

// Heap order of `tokenizers`' Merge: the lowest rank on top, then the lowest position.
bool lower_priority(const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
}

// The initial symbols: one per byte (its single-byte token), or the unknown token, fused over a
// run of unknown bytes when fuse_unk is set; bytes with neither are dropped, as tokenizers does.
void initial_symbols(const Tokenizer::Impl& t, std::string_view word,
                     std::vector<BpeScratch::Symbol>& sym) {
  sym.clear();
  bool last_unk = false;
  for (const char c : word) {
    const int32_t id = t.byte_id[static_cast<uint8_t>(c)];
    if (id >= 0) {
      sym.push_back({id, 0, 0, true});
      last_unk = false;
    } else if (t.unk && !(t.fuse_unk && last_unk)) {
      sym.push_back({*t.unk, 0, 0, true});
      last_unk = true;
    }
  }
  const int32_t n = static_cast<int32_t>(sym.size());
  for (int32_t i = 0; i < n; ++i) {
    sym[i].prev = i - 1;
    sym[i].next = i + 1 < n ? i + 1 : -1;
  }
}

// Pre-token -> ids for one thread and one tokenizer (switching tokenizers empties it), so that
// encode stays lock-free and const. Open addressing over at most kSlots/2 entries; full, it
// starts over, following the text's current vocabulary. Holds words of kMaxWordBytes or less.
class BpeCache {
 public:
  static constexpr size_t kMaxWordBytes = 64;

  // Appends the cached ids of `word` and returns true, or returns false.
  bool find(uint64_t owner, std::string_view word, uint64_t hash, std::vector<int32_t>& ids) {
    if (owner != owner_) {
      clear();
      owner_ = owner;
      return false;
    }
    for (size_t i = hash & kMask;; i = (i + 1) & kMask) {
      const Entry& e = slots_[i];
      if (e.n_key == 0) return false;
      if (e.hash == hash && e.n_key == word.size() &&
          std::memcmp(keys_.data() + e.key_at, word.data(), word.size()) == 0) {
        ids.insert(ids.end(), ids_.begin() + e.ids_at, ids_.begin() + e.ids_at + e.n_ids);
        return true;
      }
    }
  }
  // After a find that returned false for the same word.
  void insert(std::string_view word, uint64_t hash, std::span<const int32_t> result) {
    if ((size_ + 1) * 2 > kSlots) clear();
    size_t i = hash & kMask;
    while (slots_[i].n_key != 0) i = (i + 1) & kMask;
    slots_[i] = {hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(word.size()),
                 static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(result.size())};
    keys_.append(word);
    ids_.insert(ids_.end(), result.begin(), result.end());
    ++size_;
  }

 private:
  static constexpr size_t kSlots = size_t{1} << 15;
  static constexpr size_t kMask = kSlots - 1;
  struct Entry {
    uint64_t hash;
    uint32_t key_at, n_key;  // n_key 0: a free slot (empty words are never cached)
    uint32_t ids_at, n_ids;
  };
  void clear() {
    slots_.assign(kSlots, Entry{});
    keys_.clear();
    ids_.clear();
    size_ = 0;
  }

  uint64_t owner_ = 0;  // no tokenizer has uid 0
  std::vector<Entry> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t size_ = 0;
};

void bpe_uncached(const Tokenizer::Impl& t, std::string_view word, BpeScratch& scratch,
                  std::vector<int32_t>& ids) {
  if (t.ignore_merges) {
    if (const auto it = t.vocab.find(word); it != t.vocab.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  std::vector<BpeScratch::Symbol>& sym = scratch.symbols;
  initial_symbols(t, word, sym);
  const int32_t n = static_cast<int32_t>(sym.size());
  if (n <= 1) {
    if (n == 1) ids.push_back(sym[0].id);
    return;
  }
  std::vector<BpeScratch::Candidate>& heap = scratch.heap;
  heap.clear();
  auto consider = [&](int32_t pos) {
    if (pos < 0 || sym[pos].next < 0) return;
    if (const BpeMerge* m = t.merges.find(sym[pos].id, sym[sym[pos].next].id)) {
      heap.push_back({m->rank, pos, m->id});
      std::push_heap(heap.begin(), heap.end(), lower_priority);
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), lower_priority);
    const BpeScratch::Candidate c = heap.back();
    heap.pop_back();
    BpeScratch::Symbol& left = sym[c.pos];
    if (!left.alive || left.next < 0) continue;
    // An entry goes stale when a neighbour merged since: the pair there now yields another token.
    const BpeMerge* m = t.merges.find(left.id, sym[left.next].id);
    if (!m || m->id != c.id) continue;
    BpeScratch::Symbol& right = sym[left.next];
    left.id = c.id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = c.pos;
    consider(left.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) ids.push_back(sym[i].id);
}

}  // namespace

void bpe_encode(const Tokenizer::Impl& t, std::string_view word, BpeScratch& scratch,
                std::vector<int32_t>& ids) {
  if (word.empty()) return;
  if (word.size() > BpeCache::kMaxWordBytes) return bpe_uncached(t, word, scratch, ids);
  thread_local BpeCache cache;
  const uint64_t hash = std::hash<std::string_view>{}(word);
  if (cache.find(t.uid, word, hash, ids)) return;
  const size_t first = ids.size();
  bpe_uncached(t, word, scratch, ids);
  cache.insert(word, hash, std::span<const int32_t>(ids).subspan(first));
}

}  // namespace qf::rt
