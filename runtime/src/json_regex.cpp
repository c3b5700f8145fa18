// Patterns to byte DFAs (json_regex.h): the pattern parsed to a tree of code point sets,
// concatenations, alternations, repeats and anchors; the tree to a Thompson NFA over UTF-8 bytes
// (each set as the byte-range sequences of its UTF-8 encodings), between two loops of any
// character (a match may start and end anywhere); the NFA to a DFA by subset construction, each
// state also counting the characters so far (up to the lengths' bound); then every state from
// which no accepting one is reachable made dead.
#include "qf/rt/json_regex.h"

#include <algorithm>
#include <deque>
#include <map>
#include <string>
#include <utility>

#include "qf/error.h"
#include "utf8.h"

namespace qf::rt {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr size_t kMaxNfaStates = size_t{1} << 16;
// Bounds on building the DFA, whatever the pattern: NFA states visited, and NFA states held in
// the DFA states' sets (a request's schema is compiled as it arrives).
constexpr size_t kMaxWork = size_t{1} << 23, kMaxHeld = size_t{1} << 22;

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code points, inclusive

[[noreturn]] void fail(const std::string& what) {
  throw Error(Errc::kUsage, what);
}

// Sorted, merged, without the surrogates (no UTF-8 encodes them) and without what a string
// written without escapes cannot hold: the control characters, '"' and '\'.
Ranges normal(Ranges r) {
  static const Ranges kHoles = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0xD800, 0xDFFF}};
  Ranges cut;
  for (auto [lo, hi] : r) {
    for (const auto& [hlo, hhi] : kHoles) {
      if (lo > hi) break;
      if (hhi < lo || hlo > hi) continue;
      if (hlo > lo) cut.emplace_back(lo, hlo - 1);
      lo = hhi + 1;
    }
    if (lo <= hi) cut.emplace_back(lo, hi);
  }
  std::sort(cut.begin(), cut.end());
  Ranges out;
  for (const auto& [lo, hi] : cut) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

Ranges negate(const Ranges& r) {  // r normal
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return normal(out);
}

Ranges any_char() {
  return normal({{0, kMaxCodePoint}});
}
Ranges digits() {
  return {{'0', '9'}};
}
Ranges word() {
  return normal({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}});
}
Ranges space() {  // ECMA-262 WhiteSpace and LineTerminator
  return normal({{'\t', '\r'},
                 {' ', ' '},
                 {0xA0, 0xA0},
                 {0x1680, 0x1680},
                 {0x2000, 0x200A},
                 {0x2028, 0x2029},
                 {0x202F, 0x202F},
                 {0x205F, 0x205F},
                 {0x3000, 0x3000},
                 {0xFEFF, 0xFEFF}});
}

struct Node {
  enum class Kind { kEmpty, kSet, kConcat, kAlt, kRepeat, kBegin, kEnd };
  Kind kind = Kind::kEmpty;
  Ranges set;
  std::vector<Node> kids;
  int64_t min = 0, max = -1;  // kRepeat; max -1: no limit
};

class Parser {
 public:
  explicit Parser(std::string_view p) {
    for (size_t i = 0; i < p.size();) {
      size_t len = 0;
      const uint32_t cp = detail::code_point(p, i, len);
      if (len == 0) fail("the pattern is not valid UTF-8");
      cps_.push_back(cp);
      i += len;
    }
  }

  Node parse() {
    Node n = alternation();
    if (at_ < cps_.size()) fail(where() + "an unmatched ')'");
    return n;
  }

 private:
  std::string where() const { return "at character " + std::to_string(at_) + " of the pattern: "; }
  bool more() const { return at_ < cps_.size(); }
  uint32_t peek(size_t k = 0) const { return at_ + k < cps_.size() ? cps_[at_ + k] : 0xFFFFFFFF; }
  bool eat(uint32_t c) {
    if (peek() != c) return false;
    ++at_;
    return true;
  }

  Node alternation() {
    Node alt{Node::Kind::kAlt, {}, {concatenation()}};
    while (eat('|')) alt.kids.push_back(concatenation());
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
  }

  Node concatenation() {
    Node cat{Node::Kind::kConcat, {}, {}};
    while (more() && peek() != '|' && peek() != ')') cat.kids.push_back(quantified());
    return cat;
  }

  // {n}, {n,}, {n,m} at the cursor: true and the bounds (the cursor past them), or false (the
  // cursor unmoved: a '{' that is not a quantifier is a literal, ECMA-262 Annex B).
  bool braces(int64_t& lo, int64_t& hi) {
    const size_t save = at_;
    const auto number = [&](int64_t& v) {
      if (!more() || peek() < '0' || peek() > '9') return false;
      v = 0;
      while (more() && peek() >= '0' && peek() <= '9') {
        v = std::min<int64_t>(v * 10 + (peek() - '0'), 1 << 20);
        ++at_;
      }
      return true;
    };
    if (eat('{') && number(lo)) {
      hi = lo;
      if (eat(',')) {
        hi = -1;
        number(hi);
      }
      if (eat('}')) return true;
    }
    at_ = save;
    return false;
  }

  Node quantified() {
    Node atom_node = atom();
    for (;;) {
      int64_t lo = 0, hi = -1;
      if (eat('*')) {
      } else if (eat('+')) {
        lo = 1;
      } else if (eat('?')) {
        hi = 1;
      } else if (!braces(lo, hi)) {
        return atom_node;
      }
      if (hi >= 0 && hi < lo) fail(where() + "a quantifier {n,m} with m < n");
      if (atom_node.kind == Node::Kind::kBegin || atom_node.kind == Node::Kind::kEnd)
        fail(where() + "a quantifier after an anchor");
      eat('?');  // lazy: the same strings
      if (peek() == '*' || peek() == '+' || peek() == '?')
        fail(where() + "a quantifier after a quantifier");
      Node r{Node::Kind::kRepeat, {}, {std::move(atom_node)}, lo, hi};
      atom_node = std::move(r);
    }
  }

  Node set_node(Ranges r) { return Node{Node::Kind::kSet, normal(std::move(r)), {}}; }

  Node atom() {
    const uint32_t c = peek();
    if (c == '*' || c == '+' || c == '?') fail(where() + "nothing to repeat");
    if (c == '{') {
      int64_t lo = 0, hi = 0;
      if (braces(lo, hi)) fail(where() + "nothing to repeat");
    }
    ++at_;
    switch (c) {
      case '(': {
        if (eat('?')) {
          if (peek() == '=' || peek() == '!' ||
              (peek() == '<' && (peek(1) == '=' || peek(1) == '!')))
            fail(where() + "lookarounds are not supported");
          if (eat('<')) {  // a named group: a group
            while (more() && peek() != '>') ++at_;
            if (!eat('>')) fail(where() + "an unterminated group name");
          } else if (!eat(':')) {
            fail(where() + "an unknown group kind '(?'");
          }
        }
        Node inner = alternation();
        if (!eat(')')) fail(where() + "a '(' without its ')'");
        return inner;
      }
      case ')':
        fail(where() + "an unmatched ')'");
      case '[':
        return char_class();
      case '.':
        return set_node(negate(normal({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}})));
      case '^':
        return Node{Node::Kind::kBegin, {}, {}};
      case '$':
        return Node{Node::Kind::kEnd, {}, {}};
      case '\\': {
        Ranges r;
        if (!escape(false, r)) fail(where() + "'\\' at the end of the pattern");
        return set_node(std::move(r));
      }
      default:
        return set_node({{c, c}});
    }
  }

  uint32_t hex(int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      const uint32_t c = peek();
      const int d = c >= '0' && c <= '9'   ? static_cast<int>(c - '0')
                    : c >= 'a' && c <= 'f' ? static_cast<int>(c - 'a' + 10)
                    : c >= 'A' && c <= 'F' ? static_cast<int>(c - 'A' + 10)
                                           : -1;
      if (d < 0) fail(where() + "a \\x or \\u escape needs " + std::to_string(n) + " hex digits");
      v = v << 4 | static_cast<uint32_t>(d);
      ++at_;
    }
    return v;
  }

  // After a '\': the set it stands for in `r`; false at the pattern's end. `in_class`: \b is
  // a backspace there.
  bool escape(bool in_class, Ranges& r) {
    if (!more()) return false;
    const uint32_t c = peek();
    ++at_;
    switch (c) {
      case 'd':
        r = digits();
        break;
      case 'D':
        r = negate(normal(digits()));
        break;
      case 'w':
        r = word();
        break;
      case 'W':
        r = negate(word());
        break;
      case 's':
        r = space();
        break;
      case 'S':
        r = negate(space());
        break;
      case 't':
        r = {{'\t', '\t'}};
        break;
      case 'n':
        r = {{'\n', '\n'}};
        break;
      case 'r':
        r = {{'\r', '\r'}};
        break;
      case 'f':
        r = {{'\f', '\f'}};
        break;
      case 'v':
        r = {{'\v', '\v'}};
        break;
      case 'x': {
        const uint32_t v = hex(2);
        r = {{v, v}};
        break;
      }
      case 'u': {
        uint32_t v = hex(4);
        if (v >= 0xD800 && v < 0xDC00 && peek() == '\\' && peek(1) == 'u') {  // a pair
          at_ += 2;
          const uint32_t low = hex(4);
          if (low < 0xDC00 || low > 0xDFFF) fail(where() + "a lone surrogate in a \\u escape");
          v = 0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00);
        }
        r = {{v, v}};
        break;
      }
      case '0':
        if (peek() >= '0' && peek() <= '9') fail(where() + "octal escapes are not supported");
        r = {{0, 0}};
        break;
      case 'b':
        if (!in_class) fail(where() + "word boundaries (\\b) are not supported");
        r = {{8, 8}};
        break;
      case 'B':
        fail(where() + "word boundaries (\\B) are not supported");
      case 'c':
      case 'p':
      case 'P':
      case 'k':
        fail(where() + "the escape '\\" + std::string(1, static_cast<char>(c)) +
             "' is not supported");
      default:
        if (c >= '1' && c <= '9') fail(where() + "backreferences are not supported");
        r = {{c, c}};
    }
    return true;
  }

  Node char_class() {
    const bool negated = eat('^');
    Ranges r;
    for (;;) {
      if (!more()) fail(where() + "a '[' without its ']'");
      if (peek() == ']') {
        ++at_;
        break;
      }
      // One item: a character (possibly the start of a range) or a class escape.
      uint32_t lo = peek();
      Ranges item;
      ++at_;
      if (lo == '\\') {
        if (!escape(true, item)) fail(where() + "a '[' without its ']'");
        if (item.size() != 1 || item[0].first != item[0].second) {  // \d and the like
          r.insert(r.end(), item.begin(), item.end());
          continue;
        }
        lo = item[0].first;
      }
      if (peek() == '-' && peek(1) != ']' && at_ + 1 < cps_.size()) {
        ++at_;
        uint32_t hi = peek();
        ++at_;
        if (hi == '\\') {
          Ranges e;
          if (!escape(true, e)) fail(where() + "a '[' without its ']'");
          if (e.size() != 1 || e[0].first != e[0].second)
            fail(where() + "a class escape as a range's end");
          hi = e[0].first;
        }
        if (hi < lo) fail(where() + "a range out of order in a class");
        r.emplace_back(lo, hi);
      } else {
        r.emplace_back(lo, lo);
      }
    }
    Ranges n = normal(r);
    return set_node(negated ? negate(n) : n);
  }

  std::vector<uint32_t> cps_;
  size_t at_ = 0;
};

// The UTF-8 encodings of the code points lo..hi (one encoded length, no surrogates) as byte
// range sequences: every byte string of a sequence's ranges encodes one of them, and each
// encoding is in exactly one sequence.
void utf8_sequences(uint32_t lo, uint32_t hi,
                    std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  for (const uint32_t b : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= b && hi > b) {
      utf8_sequences(lo, b, out);
      utf8_sequences(b + 1, hi, out);
      return;
    }
  }
  for (int i = 1; i < 4; ++i) {  // split where lower continuation bytes do not span 80..BF
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  detail::append_utf8(a, lo);
  detail::append_utf8(b, hi);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t i = 0; i < a.size(); ++i)
    seq.emplace_back(static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i]));
  out.push_back(std::move(seq));
}

struct Nfa {
  struct State {
    std::vector<std::tuple<uint8_t, uint8_t, int32_t>> bytes;
    std::vector<int32_t> eps, begin, end;  // begin / end: passable at the string's start / end
  };
  std::vector<State> s;
  std::vector<uint32_t> mark;  // close(): mark[x] == gen for the states in the set
  uint32_t gen = 0;

  int32_t add() {
    if (s.size() >= kMaxNfaStates) fail("the pattern is too large to compile");
    s.emplace_back();
    return static_cast<int32_t>(s.size() - 1);
  }

  // States for `n` from state `from`; returns the state where a match of `n` ends.
  int32_t emit(const Node& n, int32_t from) {
    switch (n.kind) {
      case Node::Kind::kEmpty:
        return from;
      case Node::Kind::kSet: {
        const int32_t to = add();
        std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
        for (const auto& [lo, hi] : n.set) utf8_sequences(lo, hi, seqs);
        for (const auto& seq : seqs) {
          int32_t at = from;
          for (size_t i = 0; i < seq.size(); ++i) {
            const int32_t next = i + 1 == seq.size() ? to : add();
            s[static_cast<size_t>(at)].bytes.emplace_back(seq[i].first, seq[i].second, next);
            at = next;
          }
        }
        return to;
      }
      case Node::Kind::kConcat:
        for (const Node& k : n.kids) from = emit(k, from);
        return from;
      case Node::Kind::kAlt: {
        const int32_t to = add();
        for (const Node& k : n.kids) {
          const int32_t in = add();
          s[static_cast<size_t>(from)].eps.push_back(in);
          const int32_t out = emit(k, in);
          s[static_cast<size_t>(out)].eps.push_back(to);
        }
        return to;
      }
      case Node::Kind::kRepeat: {
        const Node& k = n.kids[0];
        for (int64_t i = 0; i < n.min; ++i) from = emit(k, from);
        if (n.max < 0) {
          const int32_t loop = add();
          s[static_cast<size_t>(from)].eps.push_back(loop);
          const int32_t out = emit(k, loop);
          s[static_cast<size_t>(out)].eps.push_back(loop);
          return loop;
        }
        const int32_t to = add();
        for (int64_t i = n.min; i < n.max; ++i) {
          s[static_cast<size_t>(from)].eps.push_back(to);
          from = emit(k, from);
        }
        s[static_cast<size_t>(from)].eps.push_back(to);
        return to;
      }
      case Node::Kind::kBegin:
      case Node::Kind::kEnd: {
        const int32_t to = add();
        auto& edges = n.kind == Node::Kind::kBegin ? s[static_cast<size_t>(from)].begin
                                                   : s[static_cast<size_t>(from)].end;
        edges.push_back(to);
        return to;
      }
    }
    return from;
  }

  // `set` (distinct states) closed under epsilon edges, and begin / end edges where allowed;
  // sorted.
  void close(std::vector<int32_t>& set, bool at_start, bool at_end) {
    mark.resize(s.size(), 0);
    ++gen;
    for (const int32_t x : set) mark[static_cast<size_t>(x)] = gen;
    for (size_t i = 0; i < set.size(); ++i) {
      const State& st = s[static_cast<size_t>(set[i])];
      const auto follow = [&](const std::vector<int32_t>& edges) {
        for (const int32_t t : edges) {
          if (mark[static_cast<size_t>(t)] != gen) {
            mark[static_cast<size_t>(t)] = gen;
            set.push_back(t);
          }
        }
      };
      follow(st.eps);
      if (at_start) follow(st.begin);
      if (at_end) follow(st.end);
    }
    std::sort(set.begin(), set.end());
  }
};

}  // namespace

ByteDfa ByteDfa::live_part(const std::vector<int32_t>& table, const std::vector<uint8_t>& accept) {
  const size_t n = accept.size();
  std::vector<std::vector<int32_t>> from(n);
  for (size_t i = 0; i < n; ++i) {
    for (int c = 0; c < 256; ++c) {
      const int32_t t = table[i * 256 + static_cast<size_t>(c)];
      if (t != kDead) from[static_cast<size_t>(t)].push_back(static_cast<int32_t>(i));
    }
  }
  std::vector<uint8_t> live(n, 0);
  std::deque<int32_t> todo;
  for (size_t i = 0; i < n; ++i) {
    if (accept[i]) {
      live[i] = 1;
      todo.push_back(static_cast<int32_t>(i));
    }
  }
  while (!todo.empty()) {
    const int32_t t = todo.front();
    todo.pop_front();
    for (const int32_t f : from[static_cast<size_t>(t)]) {
      if (!live[static_cast<size_t>(f)]) {
        live[static_cast<size_t>(f)] = 1;
        todo.push_back(f);
      }
    }
  }
  ByteDfa out;
  if (n == 0 || !live[0]) return out;
  std::vector<int32_t> renum(n, kDead);
  int32_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    if (live[i]) renum[i] = kept++;
  }
  out.table_.assign(static_cast<size_t>(kept) * 256, kDead);
  for (size_t i = 0; i < n; ++i) {
    if (!live[i]) continue;
    out.accept_.push_back(accept[i]);
    for (int c = 0; c < 256; ++c) {
      const int32_t t = table[i * 256 + static_cast<size_t>(c)];
      out.table_[static_cast<size_t>(renum[i]) * 256 + static_cast<size_t>(c)] =
          t == kDead ? kDead : renum[static_cast<size_t>(t)];
    }
  }
  return out;
}

ByteDfa ByteDfa::compile(std::string_view pattern, int64_t min_chars, int64_t max_chars) {
  const Node body = Parser(pattern).parse();
  Nfa nfa;
  const int32_t start = nfa.add();
  const Node any{Node::Kind::kRepeat, {}, {Node{Node::Kind::kSet, any_char(), {}}}, 0, -1};
  const int32_t final_state = nfa.emit(any, nfa.emit(body, nfa.emit(any, start)));

  // DFA states: (NFA set closed without end edges, characters so far, capped).
  const int64_t cap = max_chars >= 0 ? max_chars : min_chars;
  std::map<std::pair<std::vector<int32_t>, int64_t>, int32_t> ids;
  std::vector<std::pair<std::vector<int32_t>, int64_t>> states;
  ByteDfa d;
  size_t work = 0, held = 0;
  const auto too_large = [] {
    fail("the pattern is too large to compile (its DFA takes too long to build)");
  };
  const auto id_of = [&](std::vector<int32_t> set, int64_t count) {
    auto key = std::make_pair(std::move(set), count);
    const auto it = ids.find(key);
    if (it != ids.end()) return it->second;
    if (states.size() >= static_cast<size_t>(kMaxDfaStates)) {
      fail("the pattern needs more than " + std::to_string(kMaxDfaStates) +
           " DFA states (with the string's lengths)");
    }
    held += key.first.size();
    if (held > kMaxHeld) too_large();
    const auto id = static_cast<int32_t>(states.size());
    ids.emplace(key, id);
    states.push_back(std::move(key));
    return id;
  };
  std::vector<int32_t> first = {start};
  nfa.close(first, true, false);
  id_of(first, 0);
  for (size_t i = 0; i < states.size(); ++i) {
    const std::vector<int32_t> set = states[i].first;
    const int64_t count = states[i].second;
    std::vector<int32_t> ends = set;
    nfa.close(ends, i == 0, true);
    d.accept_.push_back(count >= min_chars &&
                        std::binary_search(ends.begin(), ends.end(), final_state));
    d.table_.resize(d.table_.size() + 256, kDead);
    // The bytes split into runs that lead to the same states (the set's range edges, and the
    // continuation bytes 80..BF apart), each run's successor computed once.
    std::vector<int> cuts = {0, 0x80, 0xC0, 256};
    for (const int32_t x : set) {
      for (const auto& [lo, hi, to] : nfa.s[static_cast<size_t>(x)].bytes) {
        cuts.push_back(lo);
        cuts.push_back(hi + 1);
      }
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (size_t r = 0; r + 1 < cuts.size(); ++r) {
      const int c = cuts[r];
      const bool lead = (c & 0xC0) != 0x80;
      if (lead && max_chars >= 0 && count >= max_chars) continue;
      std::vector<int32_t> next;
      for (const int32_t x : set) {
        for (const auto& [lo, hi, to] : nfa.s[static_cast<size_t>(x)].bytes) {
          if (c >= lo && c <= hi) next.push_back(to);
        }
      }
      if (next.empty()) continue;
      std::sort(next.begin(), next.end());
      next.erase(std::unique(next.begin(), next.end()), next.end());
      nfa.close(next, false, false);
      work += set.size() + next.size();
      if (work > kMaxWork) too_large();
      const int32_t to = id_of(std::move(next), std::min(count + lead, std::max<int64_t>(cap, 0)));
      for (int b = c; b < cuts[r + 1]; ++b) d.table_[i * 256 + static_cast<size_t>(b)] = to;
    }
  }

  ByteDfa out = live_part(d.table_, d.accept_);
  if (out.states() == 0) {
    fail(
        "no string written without escapes (no '\"', '\\' or control characters) matches the "
        "pattern within the string's lengths");
  }
  return out;
}

}  // namespace qf::rt
