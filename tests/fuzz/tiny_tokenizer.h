// The example model's tokenizer for the fuzz targets that encode or walk a vocabulary.
#pragma once

#include "qf/rt/tokenizer.h"

namespace qf::fuzz {

// models/tiny's tokenizer (a byte-level BPE of 4,096 ids with Qwen3.5's added tokens), loaded
// once per process.
inline const rt::Tokenizer& tiny_tokenizer() {
  static const rt::Tokenizer tok = rt::Tokenizer::load(QF_TINY_TOKENIZER);
  return tok;
}

}  // namespace qf::fuzz
