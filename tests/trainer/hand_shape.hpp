// A model shape small enough to add up by hand, shared by the planner's tests:
// q = 2 heads x 4 = 8, kv = 1 x 4 = 4, hidden 8, MLP 16, vocabulary 16, tied.
#pragma once

#include "planner/planner.hpp"

inline primecfg::train::plan::ModelShape hand_shape() {
  primecfg::train::plan::ModelShape s;
  s.vocab_size = 16;
  s.hidden = 8;
  s.layers = 2;
  s.heads = 2;
  s.kv_heads = 1;
  s.head_dim = 4;
  s.intermediate = 16;
  s.model_type = "qwen3", s.qk_norm = true;
  s.tie_embeddings = true;
  return s;
}
