// src/diagnose/attribute_internal.hpp: attribution without predict() (what the fuzz target links).
#pragma once

#include "membudget/attribute.hpp"
#include "trace.hpp"

namespace membudget::diagnose {

// `budget` (predicted with explain, or nullptr) enables the model rules and the predicted column;
// `job` gives the logits size (batch, seq) with it.
Attribution attribute_decoded(const DecodedSnapshot& snap, const Budget* budget, const Job& job);

// The rules of attribute.hpp, shared with snapshot leaks.
std::string user_frame_label(const std::vector<Frame>& frames);  // "file:line name"
bool is_optimizer_frame(const Frame& f);
bool is_workspace_size(bytes_t size);

}  // namespace membudget::diagnose
