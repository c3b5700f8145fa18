// A draft vocabulary for the MTP head (CpuEngine::set_mtp_vocab, CudaOptions::mtp_vocab): its
// logits over token ids [0, n) only, -inf beyond, so that its LM head multiplies n rows instead
// of the whole vocabulary's (at 122B-A10B two thirds of an MTP step's bytes are the LM head's;
// llama.cpp's FastMTP port, PR #20700, trims Qwen's MTP head to 32K ids). Speculative decoding
// stays exact whatever the drafts are: only how many the main model keeps changes. Byte-level
// BPE vocabularies number their merges as they were learned, most frequent first, so a prefix
// holds the common tokens; tokens past it (special tokens among them) are never drafted. What
// that costs in kept drafts depends on the model and the text (README, "A draft vocabulary").
#pragma once

#include <cstdint>
#include <string>

#include "qf/error.h"

namespace qf::rt {

// Rows of the draft vocabulary come in multiples of this (whole tiles and blocks of every LM
// head format the CUDA engine keeps: INT4 tiles of 16 rows, FP8 blocks of 128).
inline constexpr int64_t kMtpVocabStep = 128;

// Throws Error(kUsage) unless n is the whole vocabulary or a multiple of kMtpVocabStep in
// [kMtpVocabStep, vocab).
inline void check_mtp_vocab(int64_t n, int64_t vocab) {
  if (n == vocab || (n >= kMtpVocabStep && n < vocab && n % kMtpVocabStep == 0)) return;
  throw Error(Errc::kUsage, "an MTP draft vocabulary of " + std::to_string(n) +
                                " ids: it must be a multiple of " + std::to_string(kMtpVocabStep) +
                                " below the vocabulary's " + std::to_string(vocab) +
                                " ids, or all of them");
}

}  // namespace qf::rt
