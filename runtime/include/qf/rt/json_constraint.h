// Structured output at the token level: which ids may come next so that the reply's text is a
// JSON value of a JsonGrammar (json_grammar.h). The generation loops mask the others out of
// every row of logits before sampling (TokenConstraint, generate.h), as vLLM's structured
// outputs do, so greedy choice and sampling both see only ids that keep the text valid, and the
// stop ids only once the value is complete.
//
// A reply that starts inside a think block (`in_reasoning`) is free until the text `</think>`
// has been generated; the JSON value starts after it (leading whitespace allowed).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "qf/rt/generate.h"
#include "qf/rt/json_grammar.h"
#include "qf/rt/json_matcher.h"
#include "qf/rt/tokenizer.h"

namespace qf::rt {

// A tokenizer's ids as a trie of their bytes, built once and shared by every request: a mask is
// a walk of the trie from the matcher's state, which prunes a byte at the first id that cannot
// continue and takes a whole subtree at once inside a free string. Special tokens have no bytes
// here (they never occur inside JSON). Memory: ~28 bytes a trie node (0.59M nodes for Qwen3.5).
class TokenTrie {
 public:
  explicit TokenTrie(const Tokenizer& tokenizer);

  struct Node {
    uint32_t first_child = 0;  // children are nodes [first_child, first_child + n_children)
    uint32_t n_children = 0;
    uint32_t begin = 0, own_end = 0, end = 0;  // ids_[begin, own_end) end here; [begin, end)
                                               // is the subtree's
    uint8_t byte = 0;
    // Bit q: from UTF-8 state q (json_string_byte) inside a string, every id below this node
    // goes on with its bytes after the node's without leaving the string's characters.
    uint8_t free_from = 0;
    uint32_t max_chars = 0;  // the most characters (UTF-8 first bytes) an id has below it
  };
  const std::vector<Node>& nodes() const { return nodes_; }  // [0]: the root (no byte)
  const std::vector<int32_t>& ids() const { return ids_; }   // in the trie's preorder
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  int32_t n_ids() const { return static_cast<int32_t>(bytes_.size()); }

 private:
  std::vector<Node> nodes_;
  std::vector<int32_t> ids_;
  std::vector<std::string> bytes_;  // by id ("" for special tokens and unused ids)
};

class JsonConstraint final : public TokenConstraint {
 public:
  // `end_ids`: the ids that end generation (allowed once the value is complete; with none,
  // whitespace may follow the value instead). The trie and grammar must outlive this.
  JsonConstraint(std::shared_ptr<const TokenTrie> trie, std::shared_ptr<const JsonGrammar> grammar,
                 std::vector<int32_t> end_ids, bool in_reasoning);

  void accept(int32_t id) override;
  bool allows(int32_t id) const override;
  void mask(std::span<float> row) const override;
  // Whether the JSON value is complete (the text may end here).
  bool complete() const;
  bool in_reasoning() const { return reasoning_; }

  // The ids allowed next, as a bitset by id (bit i of word i / 64), for rows of `n` ids.
  void allowed(int64_t n, std::vector<uint64_t>& bits) const;

 private:
  bool is_end(int32_t id) const;
  // `s` fed `bytes` one by one; false (s then unspecified) as soon as none is left.
  bool feed(JsonState& s, std::string_view bytes) const;

  std::shared_ptr<const TokenTrie> trie_;
  std::shared_ptr<const JsonGrammar> grammar_;
  std::vector<int32_t> end_ids_;
  JsonMatcher matcher_;
  bool reasoning_;
  std::string think_tail_;  // the reasoning's last bytes, to find `</think>` across tokens
  mutable JsonFrameArena arena_;
  JsonState state_;
  mutable std::vector<JsonState> scratch_;  // a state for each depth of the walk
  mutable std::vector<uint64_t> bits_;      // mask's bitset
};

}  // namespace qf::rt
