// Equivalent states of a complete DFA (Moore's partition refinement). Two states with the same language
// have the same token mask, the same distance to acceptance and the same distances after every token, so
// the masks of a grammar need computing once per class, not once per state (json_object: 3,321 states,
// about 400 classes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dsmesh::structured {

// `trans` holds 256 targets per state (row-major, -1 = rejected); only the bytes in `reps` are read (one
// byte of each run of bytes that every state treats alike), and they must all be computed. Returns the
// class of each state, classes numbered 0.. in order of their first state; `*num_classes` gets the count.
std::vector<int32_t> EquivalentStates(size_t states, const std::vector<char>& accepting, const int32_t* trans,
                                      const std::vector<uint8_t>& reps, int32_t* num_classes);

}  // namespace dsmesh::structured
