// JSON Schema's `minimum`, `maximum`, `exclusiveMinimum` and `exclusiveMaximum` on numbers and
// integers, compiled into a ByteDfa (json_regex.h) over the number's bytes for the
// structured-output matcher (json_matcher.h): a state from which no number within the bounds
// can be written is dead, so a walk of the DFA never ends in a number it cannot finish.
//
// Such numbers are written `-?(0|[1-9][0-9]*)(\.[0-9]+)?` (no exponent, no minus before zero);
// integers in at most kMaxJsonNumberBytes bytes; numbers with at most 15 digits (a whole part
// 0 not counted), so that a
// parser reading them as IEEE doubles compares them with the bounds as the decimals compare
// (two decimals of at most 15 significant digits never round to the same double). A bound is
// the decimal JSON writes for it: an integer exactly, a double in its shortest form (0.1 is
// "0.1").
#pragma once

#include <string>

#include "qf/rt/json_regex.h"

namespace qf::rt {

struct NumberBounds {
  // Each as JSON writes it ("-3", "0.5", "1e+23"); empty: none.
  std::string minimum, maximum, exclusive_minimum, exclusive_maximum;
  bool integer = false;
};

// Throws Error(kUsage) for a bound that is not a JSON number, or when no number written as
// above lies within the bounds.
ByteDfa bounded_number_dfa(const NumberBounds& bounds);

}  // namespace qf::rt
