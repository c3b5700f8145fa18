// Whether two shapes of a JsonGrammar can never hold the same value (json_grammar.cpp's
// `oneOf`, which is only enforced where the alternatives are disjoint: then "exactly one
// matches" is "any one matches").
#pragma once

#include <cstdint>

#include "qf/rt/json_grammar.h"

namespace qf::rt {

// True only when no JSON value satisfies both shapes' schemas (by the schemas' own rules, so an
// object with properties listed and additionalProperties left out may hold other keys). The
// proofs: the JSON types differ; enum and const values differ; a value lacks a property the
// other shape requires or holds one it does not allow; two objects with a property whose
// shapes are disjoint, required by one of them. False when none applies (not disjoint, or not
// provably so). Each proof step takes one of `steps`; none left: false (so a schema crafted to
// branch at every level cannot stall a request).
bool disjoint_shapes(const JsonGrammar& g, int32_t a, int32_t b, int64_t& steps);

// The proof steps one schema's oneOfs may take together.
constexpr int64_t kDisjointSteps = 1000000;

}  // namespace qf::rt
