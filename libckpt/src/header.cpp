// safetensors header parsing and validation (see safetensors.h for the contract).
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "qf/ckpt/json.h"
#include "qf/ckpt/safetensors.h"

namespace qf::ckpt {
namespace {

std::string_view json_type_name(JsonType t) {
  switch (t) {
    case JsonType::kObject:
      return "an object";
    case JsonType::kArray:
      return "an array";
    case JsonType::kString:
      return "a string";
    case JsonType::kNumber:
      return "a number";
    case JsonType::kBool:
      return "a boolean";
    case JsonType::kNull:
      return "null";
  }
  return "a value";
}

std::string u64s(uint64_t v) {
  return std::to_string(v);
}

// One tensor entry as read from JSON, before the size and tiling checks.
struct Entry {
  std::string name;
  bool ok = true;  // false once any per-tensor rule failed
  DType dtype = DType::kU8;
  Shape shape;
  bool offsets_ok = false;  // begin/end parsed (they may still be inconsistent with the size)
  uint64_t begin = 0;
  uint64_t end = 0;
};

class HeaderParser {
 public:
  HeaderParser(std::string_view text, HeaderParse& out) : r_(text), out_(out) {}

  void run() {
    if (r_.peek() != JsonType::kObject) {
      const JsonType t = r_.peek();
      r_.skip_value();
      r_.expect_end();
      add(Errc::kHeaderNotObject, "",
          std::string("header JSON is ") + std::string(json_type_name(t)) + ", not an object");
      return;
    }
    r_.begin_object();
    std::string key;
    bool seen_metadata = false;
    while (r_.next_key(key)) {
      if (key == "__metadata__") {
        if (seen_metadata) add(Errc::kDuplicateName, "", "__metadata__ appears twice");
        seen_metadata = true;
        parse_metadata();
      } else {
        parse_entry(key);
      }
    }
    r_.expect_end();
  }

  std::vector<Entry>& entries() { return entries_; }

 private:
  void add(Errc code, std::string tensor, std::string message) {
    out_.problems.push_back({code, "", std::move(tensor), std::move(message)});
  }

  void parse_metadata() {
    Header& h = out_.header;
    const JsonType t = r_.peek();
    if (t == JsonType::kNull) {  // serde reads a null Option as "no metadata"
      r_.read_null();
      return;
    }
    if (t != JsonType::kObject) {
      r_.skip_value();
      add(Errc::kMetadataNotString, "",
          "__metadata__ must be an object of strings, found " + std::string(json_type_name(t)));
      return;
    }
    h.has_metadata = true;
    r_.begin_object();
    std::string key, value;
    while (r_.next_key(key)) {
      const JsonType vt = r_.peek();
      if (vt != JsonType::kString) {
        r_.skip_value();
        add(Errc::kMetadataNotString, "",
            "__metadata__[\"" + key + "\"] is " + std::string(json_type_name(vt)) +
                ", but metadata values must be strings");
        continue;
      }
      r_.read_string(value);
      const bool dup = std::any_of(h.metadata.begin(), h.metadata.end(),
                                   [&](const auto& kv) { return kv.first == key; });
      if (dup) {
        add(Errc::kDuplicateName, "", "__metadata__ key \"" + key + "\" appears twice");
        continue;
      }
      h.metadata.emplace_back(key, value);
    }
  }

  void reject(Entry& e, Errc code, std::string message) {
    e.ok = false;
    add(code, e.name, std::move(message));
  }

  void parse_entry(const std::string& name) {
    Entry e;
    e.name = name;
    const JsonType t = r_.peek();
    if (t != JsonType::kObject) {
      r_.skip_value();
      reject(e, Errc::kTensorBadEntry,
             "entry is " + std::string(json_type_name(t)) +
                 ", expected an object with dtype, shape and data_offsets");
      finish(std::move(e));
      return;
    }
    r_.begin_object();
    bool have_dtype = false, have_shape = false, have_offsets = false;
    std::string field;
    while (r_.next_key(field)) {
      bool* have = field == "dtype"          ? &have_dtype
                   : field == "shape"        ? &have_shape
                   : field == "data_offsets" ? &have_offsets
                                             : nullptr;
      if (!have) {  // unknown fields are ignored, as the reference reader does
        r_.skip_value();
        continue;
      }
      if (*have) {
        r_.skip_value();
        reject(e, Errc::kTensorBadEntry, "field \"" + field + "\" appears twice");
        continue;
      }
      *have = true;
      if (have == &have_dtype) parse_dtype(e);
      if (have == &have_shape) parse_shape(e);
      if (have == &have_offsets) parse_offsets(e);
    }
    for (auto [have, what] : {std::pair{have_dtype, "dtype"}, std::pair{have_shape, "shape"},
                              std::pair{have_offsets, "data_offsets"}}) {
      if (!have) reject(e, Errc::kTensorBadEntry, std::string("missing field \"") + what + "\"");
    }
    finish(std::move(e));
  }

  void parse_dtype(Entry& e) {
    const JsonType t = r_.peek();
    if (t != JsonType::kString) {
      r_.skip_value();
      reject(e, Errc::kTensorBadEntry,
             "dtype is " + std::string(json_type_name(t)) + ", expected a string such as \"BF16\"");
      return;
    }
    std::string s;
    r_.read_string(s);
    const auto dtype = dtype_from_name(s);
    if (!dtype) {
      reject(e, Errc::kUnknownDtype, "unknown dtype \"" + s + "\"");
      return;
    }
    e.dtype = *dtype;
  }

  void parse_shape(Entry& e) {
    const JsonType t = r_.peek();
    if (t != JsonType::kArray) {
      r_.skip_value();
      reject(e, Errc::kTensorBadEntry,
             "shape is " + std::string(json_type_name(t)) + ", expected an array of integers");
      return;
    }
    r_.begin_array();
    size_t i = 0;
    for (; r_.next_element(); ++i) {
      const std::string where = "shape[" + std::to_string(i) + "]";
      const JsonType et = r_.peek();
      if (et != JsonType::kNumber) {
        r_.skip_value();
        reject(e, Errc::kTensorBadEntry,
               where + " is " + std::string(json_type_name(et)) + ", expected an integer");
        continue;
      }
      const JsonNumber num = r_.read_number();
      if (!num.integral) {
        reject(e, Errc::kTensorBadEntry,
               where + " is " + std::string(num.text) + ", expected an integer");
      } else if (num.negative) {
        reject(e, Errc::kNegativeDim, where + " is negative (" + std::string(num.text) + ")");
      } else if (!num.fits_u64) {
        reject(e, Errc::kShapeOverflow,
               where + " = " + std::string(num.text) + " does not fit in 64 bits");
      } else {
        e.shape.push_back(num.magnitude);
      }
    }
  }

  void parse_offsets(Entry& e) {
    const JsonType t = r_.peek();
    if (t != JsonType::kArray) {
      r_.skip_value();
      reject(e, Errc::kBadOffsets,
             "data_offsets is " + std::string(json_type_name(t)) + ", expected [begin, end]");
      return;
    }
    r_.begin_array();
    uint64_t v[2] = {0, 0};
    size_t n = 0;
    bool good = true;
    while (r_.next_element()) {
      const JsonType et = r_.peek();
      if (et != JsonType::kNumber) {
        r_.skip_value();
        good = false;
      } else {
        const JsonNumber num = r_.read_number();
        if (!num.fits_u64 || num.negative) good = false;
        if (n < 2) v[n] = num.magnitude;
      }
      ++n;
    }
    if (!good || n != 2) {
      reject(e, Errc::kBadOffsets,
             "data_offsets must be two non-negative 64-bit integers [begin, end]");
      return;
    }
    if (v[0] > v[1]) {
      reject(e, Errc::kBadOffsets,
             "data_offsets [" + u64s(v[0]) + ", " + u64s(v[1]) + "] end before they begin");
      return;
    }
    e.offsets_ok = true;
    e.begin = v[0];
    e.end = v[1];
  }

  // Size rules, in the reference reader's order: overflow, sub-byte alignment, byte length.
  void finish(Entry&& e) {
    if (e.ok) {
      uint64_t numel = 1;
      bool overflow = false;
      for (uint64_t d : e.shape) overflow |= __builtin_mul_overflow(numel, d, &numel);
      uint64_t bits = 0;
      overflow |= __builtin_mul_overflow(numel, uint64_t{dtype_bits(e.dtype)}, &bits);
      if (overflow) {
        reject(e, Errc::kShapeOverflow,
               "shape " + shape_to_string(e.shape) + " of " + std::string(dtype_name(e.dtype)) +
                   " overflows a 64-bit element or bit count");
      } else if (bits % 8 != 0) {
        reject(e, Errc::kMisalignedSlice,
               shape_to_string(e.shape) + " " + std::string(dtype_name(e.dtype)) + " is " +
                   u64s(bits) + " bits, not a whole number of bytes");
      } else if (e.end - e.begin != bits / 8) {
        reject(e, Errc::kTensorSizeMismatch,
               "data_offsets [" + u64s(e.begin) + ", " + u64s(e.end) + "] span " +
                   u64s(e.end - e.begin) + " bytes but " + shape_to_string(e.shape) + " " +
                   std::string(dtype_name(e.dtype)) + " needs " + u64s(bits / 8));
      }
    }
    entries_.push_back(std::move(e));
  }

  JsonReader r_;
  HeaderParse& out_;
  std::vector<Entry> entries_;
};

uint64_t load_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(p[i]);
  return v;
}

// Sorted by offsets, the tensors must tile [0, data_bytes) exactly once. Skipped when some
// entry's offsets did not parse: every gap reported then would be noise.
void check_tiling(std::vector<Entry>& entries, HeaderParse& out) {
  std::vector<const Entry*> spans;
  spans.reserve(entries.size());
  for (const Entry& e : entries) {
    if (!e.offsets_ok) return;
    spans.push_back(&e);
  }
  std::sort(spans.begin(), spans.end(), [](const Entry* a, const Entry* b) {
    if (a->begin != b->begin) return a->begin < b->begin;
    return a->end != b->end ? a->end < b->end : a->name < b->name;
  });
  const uint64_t data_bytes = out.header.data_bytes;
  auto add = [&](Errc code, const std::string& tensor, std::string msg) {
    out.problems.push_back({code, "", tensor, std::move(msg)});
  };
  uint64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry* s : spans) {
    if (s->begin > covered) {
      add(Errc::kOffsetGap, s->name,
          "starts at data byte " + u64s(s->begin) + " but the previous tensor" +
              (prev ? " '" + prev->name + "'" : std::string()) + " ends at " + u64s(covered) +
              ": " + u64s(s->begin - covered) + " bytes belong to no tensor");
    } else if (s->begin < covered) {
      add(Errc::kOffsetOverlap, s->name,
          "data_offsets [" + u64s(s->begin) + ", " + u64s(s->end) + "] overlap tensor '" +
              prev->name + "', which ends at " + u64s(covered));
    }
    if (s->end > data_bytes) {
      add(Errc::kOffsetOutOfBounds, s->name,
          "ends at data byte " + u64s(s->end) + " but the data section has only " +
              u64s(data_bytes) + " bytes (truncated file?)");
    }
    if (s->end >= covered) {
      covered = s->end;
      prev = s;
    }
  }
  if (covered < data_bytes) {
    add(Errc::kTrailingBytes, "",
        "data section is " + u64s(data_bytes) + " bytes but the tensors end at " + u64s(covered) +
            ": " + u64s(data_bytes - covered) + " trailing bytes");
  }
}

}  // namespace

uint64_t shape_numel(const Shape& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

std::string shape_to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

HeaderParse parse_header(std::span<const std::byte> prefix, uint64_t file_size) {
  HeaderParse out;
  auto fail = [&](Errc code, std::string msg) {
    out.problems.push_back({code, "", "", std::move(msg)});
    return out;
  };
  if (file_size < 8) {
    return fail(Errc::kHeaderTooSmall,
                "file is " + u64s(file_size) + " bytes, shorter than the 8-byte header length");
  }
  QF_ASSERT(prefix.size() >= 8, "parse_header needs the 8-byte length prefix");
  const uint64_t n = load_le64(prefix.data());
  if (n > kMaxHeaderBytes) {
    return fail(Errc::kHeaderTooLarge, "header length " + u64s(n) + " exceeds the limit of " +
                                           u64s(kMaxHeaderBytes) + " bytes");
  }
  if (n > file_size - 8) {
    return fail(Errc::kHeaderPastEnd, "header length " + u64s(n) + " runs to byte " + u64s(8 + n) +
                                          ", past the end of the " + u64s(file_size) +
                                          "-byte file");
  }
  QF_ASSERT(prefix.size() >= 8 + n, "parse_header needs the whole header in the prefix");
  const std::string_view text(reinterpret_cast<const char*>(prefix.data()) + 8, n);
  if (const auto bad = utf8_error_offset(text)) {
    return fail(Errc::kHeaderNotUtf8, "header byte " + u64s(*bad) + " (file offset " +
                                          u64s(8 + *bad) + ") is not valid UTF-8");
  }
  out.header.header_bytes = n;
  out.header.data_bytes = file_size - 8 - n;

  HeaderParser parser(text, out);
  try {
    parser.run();
  } catch (const JsonSyntaxError& e) {
    out = HeaderParse{};
    return fail(Errc::kHeaderBadJson, "header JSON invalid at byte " + u64s(e.offset()) + ": " +
                                          e.what() + " (near \"" + json_context(text, e.offset()) +
                                          "\")");
  }
  std::vector<Entry>& entries = parser.entries();
  std::unordered_map<std::string_view, size_t> first_seen;
  first_seen.reserve(entries.size());
  for (Entry& e : entries) {
    if (!first_seen.emplace(e.name, 0).second) {
      e.ok = false;
      out.problems.push_back(
          {Errc::kDuplicateName, "", e.name, "tensor name appears more than once in the header"});
    }
  }
  check_tiling(entries, out);

  Header& h = out.header;
  h.tensors.reserve(entries.size());
  for (Entry& e : entries) {
    if (!e.ok) {
      h.rejected.push_back(e.name);
      continue;
    }
    h.tensors.push_back({std::move(e.name), e.dtype, std::move(e.shape), e.begin, e.end});
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    return a.end != b.end ? a.end < b.end : a.name < b.name;
  });
  return out;
}

}  // namespace qf::ckpt
