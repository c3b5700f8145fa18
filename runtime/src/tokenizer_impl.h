// Internal: the parsed tokenizer (tokenizer_load.cpp builds it, tokenizer.cpp runs it).
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "qf/rt/tokenizer.h"

namespace qf::rt {

// A compiled PCRE2 pattern (UTF + Unicode properties, JIT where available); move-only.
// Thread-safe: every find_all call brings its own match data.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where);
  Regex(Regex&& o) noexcept : code_(std::exchange(o.code_, nullptr)), jit_(o.jit_) {}
  Regex& operator=(Regex&&) = delete;
  Regex(const Regex&) = delete;
  ~Regex();

  // Per-call state for find_all (match data and a JIT stack), reused across calls.
  class Scratch {
   public:
    Scratch();
    ~Scratch();
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;

   private:
    friend class Regex;
    pcre2_match_data* md_ = nullptr;
    pcre2_match_context* ctx_ = nullptr;
    pcre2_jit_stack* stack_ = nullptr;
  };

  // Appends [begin, end) of every non-empty non-overlapping match in `s` (valid UTF-8), left
  // to right; an empty match steps over one character, as Oniguruma's find_iter does.
  // Throws Error(kUnsupported) when PCRE2 gives up (match or stack limit) rather than
  // silently leaving text unsplit.
  void find_all(std::string_view s, Scratch& scratch,
                std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// `pattern` with \p{L} \p{M} \p{N} \s (and \P{..}, \p{^..}, \S) as Oniguruma has them: a
// class of their own outside brackets, spliced into an enclosing class inside them. A negated
// one inside brackets cannot be spliced and keeps PCRE2's meaning. Regex compiles this.
std::string with_oniguruma_classes(const std::string& pattern);

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext };

struct PreTokenizeStep {
  enum class Kind { kSplit, kByteLevel } kind = Kind::kSplit;
  std::optional<Regex> regex;  // kSplit; kByteLevel with use_regex (GPT-2's pattern)
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool add_prefix_space = false;  // kByteLevel
};

struct BpeMerge {
  int32_t rank;
  int32_t id;  // the merged token
};

// Open-addressing hash map (left id, right id) -> merge, read-only once loaded. The BPE inner
// loop probes it for every adjacent pair; std::unordered_map's nodes would cost a cache miss
// each on Qwen's 500k merges.
class MergeTable {
 public:
  // A pair already present takes the new value (a merge listed twice keeps its last rank, as
  // the HashMap `tokenizers` builds does).
  void insert_or_assign(int32_t left, int32_t right, BpeMerge m);
  const BpeMerge* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t k = key(left, right);
    for (size_t i = slot_of(k);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == k) return &s.merge;
      if (s.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key;
    BpeMerge merge;
  };
  static constexpr uint64_t kEmpty = ~0ull;  // ids are < 2^31, so no real key has all bits set
  static uint64_t key(int32_t l, int32_t r) {
    return static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32 | static_cast<uint32_t>(r);
  }
  size_t slot_of(uint64_t k) const { return (k * 0x9E3779B97F4A7C15ull) >> shift_ & mask_; }
  void grow();

  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
  int shift_ = 64;
};

// Hash for string maps that are searched with string_views (no temporary std::string).
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct Tokenizer::Impl {
  std::string source;  // file name for messages
  uint64_t uid = 0;    // unique per parsed tokenizer: the owner of a thread's BPE cache
  // Decoding: the bytes each id stands for, its string as written in the JSON, and whether it
  // is a special added token. Ids no token has hold "".
  std::vector<std::string> id_bytes;
  std::vector<std::string> id_content;
  std::vector<uint8_t> id_special;
  std::vector<AddedToken> added;
  // Encoding.
  bool nfc = false;                  // the normalizer: NFC or none
  std::vector<PreTokenizeStep> pre;  // at least the ByteLevel step, always last
  bool ignore_merges = false;
  std::optional<int32_t> unk;  // id for bytes without a token; consecutive ones fused if fuse_unk
  bool fuse_unk = false;
  std::array<int32_t, 256> byte_id{};  // the single-byte token of each byte, or -1
  StringIdMap vocab;                   // raw bytes -> id (ignore_merges lookups)
  MergeTable merges;
  StringIdMap content_to_id;  // as written in the JSON
  // Added-token matching on the raw text (normalized=false) and on normalized text; the
  // pattern is the content, normalized for the second set.
  struct AddedPattern {
    std::string text;
    const AddedToken* token;
  };
  struct AddedIndex {
    std::array<std::vector<AddedPattern>, 256> by_first_byte;  // longest first
    bool empty = true;
  };
  AddedIndex added_raw, added_normalized;
};

// Buffers reused for every pre-token.
struct BpeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
    bool alive;
  };
  struct Candidate {
    int32_t rank, pos, id;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

// Byte-pair encoding of one pre-token (raw bytes) as `tokenizers` does it: symbols are the
// single-byte tokens, then the lowest-ranked adjacent pair is merged first, the leftmost among
// equal ranks. Appends the resulting ids. Results for short pre-tokens are remembered in a
// per-thread cache (bpe.cpp), so repeated words cost one hash lookup.
void bpe_encode(const Tokenizer::Impl& t, std::string_view word, BpeScratch& scratch,
                std::vector<int32_t>& ids);

}  // namespace qf::rt
